//! Queue-like workloads as orderly writes them, their model, and the checks of a tree
//! against the model. Shared by the tests and by the `crash-writer` child process, which
//! replays the same operations from the same seed.

use std::collections::BTreeMap;

/// A key as orderly's time-ordered rows have it: a short prefix (the table, or an account)
/// and a big-endian id that only grows.
pub fn key(prefix: &[u8], id: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// The value written for `key` by operation number `op`: its length varies (4 to 19 bytes)
/// and every byte depends on both, so a value from another key or another write, or a torn
/// one, never matches.
pub fn value(key: &[u8], op: u64) -> Vec<u8> {
    let mut h = op.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for b in key {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01B3);
    }
    let len = 4 + (h % 16) as usize;
    let mut v = Vec::with_capacity(len);
    let mut x = h;
    for _ in 0..len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

/// splitmix64: the workload's own generator, so that a child process and its parent draw the
/// same operations from a seed without sharing anything else.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Set `key` to `value(key, op)`.
    Set(Vec<u8>),
    /// Remove `key` (which may be absent).
    Remove(Vec<u8>),
}

impl Op {
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Set(k) | Op::Remove(k) => k,
        }
    }
}

/// The operations of a queue-like workload: `queues` ids that only grow, appended at the end
/// of each queue (most operations), removed from its front once it is longer than
/// `keep`, and now and then a key set between existing ones (a partner's own key, which
/// sorts anywhere). Deterministic in `seed`.
pub fn queue_ops(seed: u64, n: usize, queues: u64, keep: u64) -> Vec<Op> {
    let mut rng = Rng::new(seed);
    let mut next_id = vec![0u64; queues as usize];
    let mut front = vec![0u64; queues as usize];
    let mut ops = Vec::with_capacity(n);
    while ops.len() < n {
        let q = rng.below(queues) as usize;
        let prefix = [b'q', b'0' + q as u8, b'/'];
        let roll = rng.below(100);
        if roll < 8 {
            // A key between keys: a random id in the queue's span, with a suffix that no
            // append uses.
            let id = front[q] + rng.below(next_id[q] - front[q] + 1);
            let mut k = key(&prefix, id);
            k.push(b'p');
            ops.push(Op::Set(k));
        } else if next_id[q] - front[q] > keep && roll < 45 {
            ops.push(Op::Remove(key(&prefix, front[q])));
            front[q] += 1;
        } else {
            ops.push(Op::Set(key(&prefix, next_id[q])));
            next_id[q] += 1;
        }
    }
    ops
}

pub type Model = BTreeMap<Vec<u8>, Vec<u8>>;

pub fn apply(model: &mut Model, index: usize, op: &Op) {
    match op {
        Op::Set(k) => {
            model.insert(k.clone(), value(k, index as u64));
        }
        Op::Remove(k) => {
            model.remove(k);
        }
    }
}

pub fn apply_to_tree(
    tree: &sled::Tree,
    index: usize,
    op: &Op,
) -> sled::Result<()> {
    match op {
        Op::Set(k) => {
            tree.insert(k.as_slice(), value(k, index as u64)).map(|_| ())
        }
        Op::Remove(k) => tree.remove(k.as_slice()).map(|_| ()),
    }
}

pub fn contents(tree: &sled::Tree) -> Model {
    tree.iter()
        .map(|r| {
            let (k, v) = r.expect("iterating the tree");
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// The tree holds exactly `model`: a forward scan, a reverse scan, a point read of every key
/// of the model and of every key in `also_absent` that the model lacks, and `get_lt` and
/// `get_gt` around every leaf's lower bound (where a wrong separator would hide rows).
pub fn check_tree(tree: &sled::Tree, model: &Model, also_absent: &[Vec<u8>]) {
    let forward = contents(tree);
    if &forward != model {
        let missing: Vec<_> = model
            .keys()
            .filter(|k| !forward.contains_key(*k))
            .take(5)
            .collect();
        let extra: Vec<_> = forward
            .keys()
            .filter(|k| !model.contains_key(*k))
            .take(5)
            .collect();
        let wrong: Vec<_> = model
            .iter()
            .filter(|(k, v)| forward.get(*k).map_or(false, |f| f != *v))
            .map(|(k, _)| k)
            .take(5)
            .collect();
        panic!(
            "the tree holds {} rows, the model {}: missing {:?}, extra {:?}, wrong values {:?}",
            forward.len(),
            model.len(),
            missing,
            extra,
            wrong
        );
    }
    let reverse: Vec<(Vec<u8>, Vec<u8>)> = tree
        .iter()
        .rev()
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    assert!(
        reverse.iter().rev().eq(model
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
            .iter()),
        "a reverse scan disagrees with the forward one"
    );
    for (k, v) in model {
        assert_eq!(
            tree.get(k).unwrap().as_deref(),
            Some(v.as_slice()),
            "get {:?}",
            k
        );
    }
    for k in also_absent {
        if !model.contains_key(k) {
            assert_eq!(
                tree.get(k).unwrap(),
                None,
                "{:?} is gone but reads back",
                k
            );
        }
    }
    let shape = crate::shape::Shape::of(tree);
    shape.check();
    for leaf in shape.leaves() {
        let lo = leaf.lo.as_slice();
        let lt = model
            .range::<[u8], _>((
                std::ops::Bound::Unbounded,
                std::ops::Bound::Excluded(lo),
            ))
            .next_back()
            .map(|(k, _)| k.clone());
        assert_eq!(
            tree.get_lt(lo).unwrap().map(|(k, _)| k.to_vec()),
            lt,
            "get_lt {:?}",
            lo
        );
        let gt = model
            .range::<[u8], _>((
                std::ops::Bound::Excluded(lo),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .map(|(k, _)| k.clone());
        assert_eq!(
            tree.get_gt(lo).unwrap().map(|(k, _)| k.to_vec()),
            gt,
            "get_gt {:?}",
            lo
        );
        let from: Vec<Vec<u8>> = tree
            .range(lo..)
            .keys()
            .take(3)
            .map(|k| k.unwrap().to_vec())
            .collect();
        let expected: Vec<Vec<u8>> = model
            .range::<[u8], _>((
                std::ops::Bound::Included(lo),
                std::ops::Bound::Unbounded,
            ))
            .take(3)
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(from, expected, "a scan from the leaf bound {:?}", lo);
    }
}

/// A directory of its own under the system's temporary directory, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sled-suites-{}-{}-{}",
            name,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
