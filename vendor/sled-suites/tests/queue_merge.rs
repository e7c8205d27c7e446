//! Queue-like trees, as orderly's expiries and events are: keys appended at the end, removed
//! from the front. The leaves the removals empty are merged away (a leaf of fewer than 4 rows
//! is folded into its left sibling), the append splits go on at the end, and after every
//! round every key ever written reads back as the model says, before and after a reopen.

use sled_suites::shape::{Shape, SplitTracker};
use sled_suites::workload::{
    apply, apply_to_tree, check_tree, queue_ops, Model, Op, TempDir,
};

fn open(dir: &TempDir) -> (sled::Db, sled::Tree) {
    let db = sled::Config::new().path(&dir.0).open().unwrap();
    let tree = db.open_tree("expiries").unwrap();
    (db, tree)
}

/// One queue that keeps about `keep` rows, and three queues side by side (their boundaries
/// take keys in the middle of a leaf), each with a key between keys now and then.
fn run(
    name: &str,
    seed: u64,
    ops: usize,
    queues: u64,
    keep: u64,
) -> SplitTracker {
    let dir = TempDir::new(name);
    let (mut db, mut tree) = open(&dir);
    let ops = queue_ops(seed, ops, queues, keep);
    let mut model = Model::new();
    let mut tracker = SplitTracker::new();
    let mut removed: Vec<Vec<u8>> = Vec::new();
    let mut most_leaves = 0;
    for (round, chunk) in ops.chunks(500).enumerate() {
        for (i, op) in chunk.iter().enumerate() {
            let index = round * 500 + i;
            apply_to_tree(&tree, index, op).unwrap();
            apply(&mut model, index, op);
            if let Op::Remove(k) = op {
                removed.push(k.clone());
            }
            if i % 4 == 3 {
                let shape = tracker.observe_tree(&tree);
                most_leaves = most_leaves.max(shape.leaves().len());
            }
        }
        check_tree(&tree, &model, &removed);
        // The leaves stay about as many as the rows need: a queue's front leaves are merged
        // away as fast as its end splits new ones.
        let leaves = Shape::of(&tree).leaves().len();
        assert!(
            leaves <= model.len() / 10 + 2 * queues as usize + 2,
            "{} leaves for {} rows after round {}",
            leaves,
            model.len(),
            round
        );
        if round % 3 == 2 {
            drop(tree);
            drop(db);
            let reopened = open(&dir);
            db = reopened.0;
            tree = reopened.1;
            check_tree(&tree, &model, &removed);
            tracker.observe_tree(&tree);
        }
    }
    drop(tree);
    drop(db);
    let (_db, tree) = open(&dir);
    check_tree(&tree, &model, &removed);
    tracker.report(name);
    assert!(tracker.merges >= 10, "{} merges", tracker.merges);
    assert!(most_leaves > 2 * queues as usize);
    tracker
}

#[test]
fn one_queue_appended_at_the_end_and_removed_from_the_front() {
    let t = run(
        "one_queue_appended_at_the_end_and_removed_from_the_front",
        11,
        6_000,
        1,
        200,
    );
    // The splits that are not append splits come from the keys set between keys (8 % of
    // the operations).
    assert!(
        t.append_splits * 3 >= t.splits() * 2,
        "{} of {} splits were append splits",
        t.append_splits,
        t.splits()
    );
}

#[test]
fn three_queues_side_by_side() {
    let t = run("three_queues_side_by_side", 12, 6_000, 3, 100);
    // A queue's newest key is an append only for a leaf that holds no key of the next
    // queue; its end shares a leaf with the next queue's front until those rows are
    // removed, and that leaf splits in the middle. So most splits here are midpoint splits
    // (README.md).
    assert!(
        t.append_splits > 0 && t.midpoint_splits > 0,
        "{} append, {} midpoint",
        t.append_splits,
        t.midpoint_splits
    );
}

/// A queue drained to nothing and filled again: every leaf but the first goes, and the
/// tree takes new rows as before.
#[test]
fn a_queue_drained_to_nothing_and_filled_again() {
    let dir = TempDir::new("drain");
    let (db, tree) = open(&dir);
    let mut model = Model::new();
    let mut tracker = SplitTracker::new();
    let k = |id: u64| sled_suites::workload::key(b"q/", id);
    let mut index = 0;
    for fill in 0..2u64 {
        for id in fill * 1_000..fill * 1_000 + 1_000 {
            let op = Op::Set(k(id));
            apply_to_tree(&tree, index, &op).unwrap();
            apply(&mut model, index, &op);
            index += 1;
            if id % 4 == 3 {
                tracker.observe_tree(&tree);
            }
        }
        let full = Shape::of(&tree).leaves().len();
        assert!(full >= 30, "{} leaves", full);
        for id in fill * 1_000..fill * 1_000 + 1_000 {
            let op = Op::Remove(k(id));
            apply_to_tree(&tree, index, &op).unwrap();
            apply(&mut model, index, &op);
            index += 1;
            if id % 4 == 3 {
                tracker.observe_tree(&tree);
            }
        }
        let removed: Vec<Vec<u8>> = (0..fill * 1_000 + 1_000).map(k).collect();
        check_tree(&tree, &model, &removed);
        // Each removal's traversal merges the leaf it passes when it is too small; the
        // last ones stay until a traversal passes them.
        let empty = Shape::of(&tree).leaves().len();
        assert!(
            empty * 4 < full,
            "{} leaves of {} remain for no rows",
            empty,
            full
        );
    }
    drop(tree);
    drop(db);
    let (_db, tree) = open(&dir);
    check_tree(&tree, &model, &[]);
    tracker.report("a_queue_drained_to_nothing_and_filled_again");
    assert!(tracker.merges >= 40, "{} merges", tracker.merges);
    assert_eq!(tracker.midpoint_splits, 0);
}
