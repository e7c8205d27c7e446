//! The shape of a sled tree, read from outside: `format!("{:?}", tree)` walks every level of
//! the tree through the page cache (sled's own `Tree::verify_integrity` is that walk) and
//! prints each node. [`Shape::of`] parses that print into levels of nodes, and
//! [`SplitTracker`] tells the splits and merges between two shapes apart, and each split's
//! kind, without any counter inside sled.

use std::collections::HashSet;

/// orderly's thresholds (vendor/sled/src/node.rs): a leaf splits once it holds more than
/// `LEAF_SPLIT_ROWS` rows, an append split gives the new right leaf `APPEND_SPLIT_RIGHT` of
/// them, and a leaf of fewer than `MERGE_BELOW_ROWS` rows is merged into its left sibling.
pub const LEAF_SPLIT_ROWS: usize = 32;
pub const APPEND_SPLIT_RIGHT: usize = 4;
pub const MERGE_BELOW_ROWS: usize = 4;
/// The rows an append split leaves in the left leaf: the leaf splits with
/// `LEAF_SPLIT_ROWS + 1` rows, and the right leaf takes `APPEND_SPLIT_RIGHT` of them.
pub const APPEND_LEFT_ROWS: usize = LEAF_SPLIT_ROWS + 1 - APPEND_SPLIT_RIGHT;
/// A midpoint split leaves `(LEAF_SPLIT_ROWS + 1) / 2 + 1` rows in the left leaf (17); an
/// append split leaves 29. A new leaf whose left neighbour holds at least this many rows when
/// first seen came from an append split. The margin absorbs the few rows a concurrent writer
/// may add between the split and the observation.
pub const APPEND_LEFT_AT_LEAST: usize = 24;

#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub pid: u64,
    pub next: Option<u64>,
    pub lo: Vec<u8>,
    pub hi: Vec<u8>,
    pub leaf: bool,
    /// Rows of a leaf, children of an index node.
    pub len: usize,
    /// An index node's children.
    pub pointers: Vec<u64>,
    pub merging: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// From the root's level down to the leaves.
    pub levels: Vec<Vec<NodeInfo>>,
}

impl Shape {
    /// The tree as its `Debug` print shows it. Panics if the print has no leaf level or a
    /// node line does not parse.
    pub fn of(tree: &sled::Tree) -> Shape {
        Shape::parse(&format!("{:?}", tree))
    }

    pub fn parse(print: &str) -> Shape {
        let mut levels: Vec<Vec<NodeInfo>> = Vec::new();
        for line in print.lines() {
            let line = line.trim();
            if line.starts_with("level ") {
                levels.push(Vec::new());
            } else if let Some(colon) = line.find(": Node {") {
                let pid = line[..colon].parse().expect("a node's pid");
                let node = parse_node(pid, &line[colon + 2..]);
                levels.last_mut().expect("a node before any level").push(node);
            }
        }
        let shape = Shape { levels };
        assert!(
            shape
                .levels
                .last()
                .map_or(false, |l| !l.is_empty() && l.iter().all(|n| n.leaf)),
            "the print ends without a level of leaves:\n{}",
            print
        );
        shape
    }

    pub fn leaves(&self) -> &[NodeInfo] {
        self.levels.last().unwrap()
    }

    pub fn depth(&self) -> usize {
        self.levels.len()
    }

    /// Leaves that no index node points to: the right halves of splits whose parent has not
    /// yet been told (reachable only through their left sibling's `next`).
    pub fn unlinked_leaves(&self) -> usize {
        if self.levels.len() < 2 {
            return 0;
        }
        let parents = &self.levels[self.levels.len() - 2];
        let pointed: HashSet<u64> =
            parents.iter().flat_map(|n| n.pointers.iter().copied()).collect();
        self.leaves().iter().filter(|l| !pointed.contains(&l.pid)).count()
    }

    /// Checks what holds in every shape: the leaves' bounds tile the key space in order
    /// (each leaf's `hi` is the next leaf's `lo`, the first `lo` is empty, the last `hi` is
    /// empty), each `next` names the node to its right, and no leaf holds more rows than a
    /// traversal lets it keep before splitting it.
    pub fn check(&self) {
        for level in &self.levels {
            assert_eq!(
                level[0].lo, b"",
                "the leftmost node of a level starts at the empty key"
            );
            assert!(
                level.last().unwrap().hi.is_empty(),
                "the rightmost node is unbounded"
            );
            assert!(level.last().unwrap().next.is_none());
            for pair in level.windows(2) {
                assert_eq!(
                    pair[0].hi, pair[1].lo,
                    "neighbours' bounds meet: {:?}",
                    pair
                );
                assert!(pair[0].lo < pair[1].lo, "bounds ascend: {:?}", pair);
                assert_eq!(pair[0].next, Some(pair[1].pid));
            }
        }
        for leaf in self.leaves() {
            // A leaf splits on the traversal after the insert that took it past the
            // threshold, so one row more than the threshold is seen between the two.
            assert!(
                leaf.len <= LEAF_SPLIT_ROWS + 1,
                "leaf {} holds {} rows, more than a split lets it",
                leaf.pid,
                leaf.len
            );
        }
    }
}

fn bytes_after(s: &str, field: &str) -> Vec<u8> {
    let start =
        s.find(field).unwrap_or_else(|| panic!("no {} in {}", field, s))
            + field.len();
    let end = start + s[start..].find(']').unwrap();
    let list = &s[start..end];
    if list.trim().is_empty() {
        Vec::new()
    } else {
        list.split(", ").map(|b| b.trim().parse().unwrap()).collect()
    }
}

/// Counts the elements of the bracketed list that starts right after `field`.
fn list_len_after(s: &str, field: &str) -> usize {
    let start =
        s.find(field).unwrap_or_else(|| panic!("no {} in {}", field, s))
            + field.len();
    let mut depth = 1;
    let mut count = 0;
    let mut empty = true;
    for c in s[start..].chars() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => count += 1,
            c if !c.is_whitespace() => empty = false,
            _ => {}
        }
    }
    if empty {
        0
    } else {
        count + 1
    }
}

fn parse_node(pid: u64, s: &str) -> NodeInfo {
    let next = {
        let start = s.find("next: ").unwrap() + "next: ".len();
        let rest = &s[start..];
        if rest.starts_with("None") {
            None
        } else {
            let end = rest.find(')').unwrap();
            Some(rest["Some(".len()..end].parse().unwrap())
        }
    };
    let lo = bytes_after(s, "lo: [");
    let hi = bytes_after(s, "hi: [");
    let merging = s.contains("merging: true");
    if s.contains("data: Leaf(") {
        NodeInfo {
            pid,
            next,
            lo,
            hi,
            leaf: true,
            len: list_len_after(s, "keys: ["),
            pointers: Vec::new(),
            merging,
        }
    } else {
        let pointers = bytes_after_u64(s, "pointers: [");
        NodeInfo {
            pid,
            next,
            lo,
            hi,
            leaf: false,
            len: pointers.len(),
            pointers,
            merging,
        }
    }
}

fn bytes_after_u64(s: &str, field: &str) -> Vec<u64> {
    let start = s.find(field).unwrap() + field.len();
    let end = start + s[start..].find(']').unwrap();
    s[start..end]
        .split(", ")
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().unwrap())
        .collect()
}

/// Splits and merges of leaves seen between successive shapes of one tree.
///
/// A leaf is known by its `lo` bound, which a split never changes for the left half. A leaf
/// whose `lo` was not there before came from a split; its left neighbour's rows when it is
/// first seen tell which split ([`APPEND_LEFT_AT_LEAST`]). Observed after every operation of
/// a single writer, the count is exact; observed now and then beside writers (the concurrent
/// test), two splits of one leaf between observations count as one.
#[derive(Debug, Default, Clone)]
pub struct SplitTracker {
    los: HashSet<Vec<u8>>,
    pub append_splits: usize,
    pub midpoint_splits: usize,
    /// Leaves that went away: merged into their left sibling.
    pub merges: usize,
}

impl SplitTracker {
    pub fn new() -> SplitTracker {
        SplitTracker::default()
    }

    pub fn observe(&mut self, shape: &Shape) {
        let leaves = shape.leaves();
        let now: HashSet<Vec<u8>> =
            leaves.iter().map(|l| l.lo.clone()).collect();
        if !self.los.is_empty() {
            for (i, leaf) in leaves.iter().enumerate() {
                if i > 0 && !self.los.contains(&leaf.lo) {
                    if leaves[i - 1].len >= APPEND_LEFT_AT_LEAST {
                        self.append_splits += 1;
                    } else {
                        self.midpoint_splits += 1;
                    }
                }
            }
            self.merges += self.los.difference(&now).count();
        }
        self.los = now;
    }

    pub fn observe_tree(&mut self, tree: &sled::Tree) -> Shape {
        let shape = Shape::of(tree);
        self.observe(&shape);
        shape
    }

    pub fn splits(&self) -> usize {
        self.append_splits + self.midpoint_splits
    }

    /// One line that vendor/sled-suites/run.sh adds up over every test.
    pub fn report(&self, test: &str) {
        println!(
            "SPLITS test={} splits={} append={} midpoint={} merges={}",
            test,
            self.splits(),
            self.append_splits,
            self.midpoint_splits,
            self.merges
        );
    }
}
