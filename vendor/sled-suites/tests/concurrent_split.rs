//! Append splits under concurrency: two writers append to one queue (one takes the even ids,
//! the other the odd ones, each at its own pace, so each split's traversal may carry either
//! the newest key or one that sorts before it), while readers scan and read keys that are
//! known written, and a watcher reads the tree's shape to see the splits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::thread;

use sled_suites::shape::SplitTracker;
use sled_suites::workload::{check_tree, key, value, Model, TempDir};

const PER_WRITER: u64 = 2_500;
const PREFIX: &[u8] = b"acct-1/events/";

#[test]
fn appends_split_leaves_under_readers_and_a_second_writer() {
    let dir = TempDir::new("concurrent");
    let db = sled::Config::new()
        .path(&dir.0)
        .flush_every_ms(Some(5))
        .open()
        .unwrap();
    let tree = db.open_tree("events").unwrap();
    // done[w]: ids of writer w (w, w + 2, w + 4, ...) below 2 * done[w] + w are written.
    let done: Arc<[AtomicU64; 2]> =
        Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let stop = Arc::new(AtomicBool::new(false));

    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let tree = tree.clone();
            let done = done.clone();
            thread::spawn(move || {
                for n in 0..PER_WRITER {
                    let id = 2 * n + w;
                    let k = key(PREFIX, id);
                    tree.insert(k.as_slice(), value(&k, id)).unwrap();
                    done[w as usize].store(n + 1, SeqCst);
                    if w == 1 && n % 64 == 0 {
                        // The second writer lags now and then, so its keys land before the
                        // first writer's newest ones.
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();

    let readers: Vec<_> = (0..2)
        .map(|r| {
            let tree = tree.clone();
            let done = done.clone();
            let stop = stop.clone();
            thread::spawn(move || {
                let mut scans = 0u64;
                while !stop.load(SeqCst) {
                    let written = [done[0].load(SeqCst), done[1].load(SeqCst)];
                    let is_written = |id: u64| id / 2 < written[(id % 2) as usize];
                    let rows: Vec<(u64, sled::IVec)> = if (scans + r) % 2 == 0 {
                        tree.scan_prefix(PREFIX)
                            .map(|kv| kv.unwrap())
                            .map(|(k, v)| (id_of(&k), v))
                            .collect()
                    } else {
                        let mut rows: Vec<_> = tree
                            .scan_prefix(PREFIX)
                            .rev()
                            .map(|kv| kv.unwrap())
                            .map(|(k, v)| (id_of(&k), v))
                            .collect();
                        rows.reverse();
                        rows
                    };
                    for pair in rows.windows(2) {
                        assert!(
                            pair[0].0 < pair[1].0,
                            "a scan went back: {} then {}",
                            pair[0].0,
                            pair[1].0
                        );
                    }
                    for (id, v) in &rows {
                        assert_eq!(v.as_ref(), value(&key(PREFIX, *id), *id).as_slice());
                    }
                    // Every id written before the scan began is in it.
                    let seen: std::collections::HashSet<u64> =
                        rows.iter().map(|(id, _)| *id).collect();
                    let top = 2 * written[0].max(written[1]) + 2;
                    for id in (0..top).filter(|id| is_written(*id)) {
                        assert!(
                            seen.contains(&id),
                            "id {} was written before the scan but is not in it",
                            id
                        );
                    }
                    // Point reads of written ids, and of the neighbours of the newest.
                    for id in (0..top)
                        .rev()
                        .step_by(7)
                        .filter(|id| is_written(*id))
                        .take(64)
                    {
                        let k = key(PREFIX, id);
                        assert_eq!(
                            tree.get(&k).unwrap().as_deref(),
                            Some(value(&k, id).as_slice())
                        );
                        let lt = tree.get_lt(&k).unwrap().map(|(k, _)| id_of(&k));
                        if id > 0 && is_written(id - 1) {
                            assert_eq!(lt, Some(id - 1), "get_lt of written id {}", id);
                        } else {
                            assert!(
                                lt.map_or(true, |lt| lt < id),
                                "get_lt of {} gave {:?}",
                                id,
                                lt
                            );
                        }
                    }
                    scans += 1;
                }
                scans
            })
        })
        .collect();

    let watcher = {
        let tree = tree.clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut tracker = SplitTracker::new();
            while !stop.load(SeqCst) {
                tracker.observe_tree(&tree);
            }
            tracker.observe_tree(&tree);
            tracker
        })
    };

    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, SeqCst);
    let scans: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    let tracker = watcher.join().unwrap();
    tracker.report("appends_split_leaves_under_readers_and_a_second_writer");

    let model: Model = (0..2 * PER_WRITER)
        .map(|id| {
            let k = key(PREFIX, id);
            let v = value(&k, id);
            (k, v)
        })
        .collect();
    check_tree(&tree, &model, &[]);
    let shape = sled_suites::shape::Shape::of(&tree);
    let leaves = shape.leaves().len();
    assert!(scans >= 4, "the readers scanned {} times", scans);
    // The watcher sees every leaf come, though two splits of one leaf between two of its
    // looks count as one.
    assert!(
        tracker.splits() + 1 <= leaves
            && tracker.splits() * 10 >= (leaves - 1) * 8,
        "{:?} for {} leaves",
        tracker,
        leaves
    );
    assert_eq!(tracker.merges, 0);
    // Most splits here are append splits, and the leaves show it: 5,000 rows in leaves of
    // 17 (midpoint splits) would take 294 of them.
    assert!(tracker.append_splits * 3 >= tracker.splits(), "{:?}", tracker);
    assert!(
        leaves * 24 <= (2 * PER_WRITER as usize) + 24 * 3,
        "{} leaves for {} rows",
        leaves,
        2 * PER_WRITER
    );

    drop(tree);
    drop(db);
    let db = sled::Config::new().path(&dir.0).open().unwrap();
    let tree = db.open_tree("events").unwrap();
    check_tree(&tree, &model, &[]);
}

fn id_of(k: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&k[PREFIX.len()..]);
    u64::from_be_bytes(b)
}
