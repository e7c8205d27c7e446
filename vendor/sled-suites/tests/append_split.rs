//! orderly's append split (vendor/sled/ORDERLY-PATCHES.md, change 2), one writer: keys that
//! only grow leave every leaf but the last full; keys between keys still split leaves in the
//! middle. The tree's shape is read after every insert (sled_suites::shape), so every split
//! is seen and classified.

use sled_suites::shape::{
    Shape, SplitTracker, APPEND_LEFT_ROWS, LEAF_SPLIT_ROWS,
};
use sled_suites::workload::{check_tree, key, value, Model, Rng, TempDir};

fn open(dir: &TempDir) -> (sled::Db, sled::Tree) {
    let db = sled::Config::new().path(&dir.0).open().unwrap();
    let tree = db.open_tree("orders").unwrap();
    (db, tree)
}

/// Reading the shape after every `OBSERVE_EVERY` inserts sees every split of these tests: a
/// leaf needs at least 16 more rows to split again, and a left half that a midpoint split
/// left with 17 or 18 rows gains at most 4 before it is seen, staying below
/// `APPEND_LEFT_AT_LEAST` (shape.rs). Every insert would cost four times as much.
const OBSERVE_EVERY: usize = 4;

/// Inserts `keys` in the order given, reading the shape as it goes.
fn insert_all(
    tree: &sled::Tree,
    model: &mut Model,
    tracker: &mut SplitTracker,
    keys: &[Vec<u8>],
) {
    for (i, k) in keys.iter().enumerate() {
        let v = value(k, i as u64);
        tree.insert(k.as_slice(), v.clone()).unwrap();
        model.insert(k.clone(), v);
        if i % OBSERVE_EVERY == OBSERVE_EVERY - 1 || i == keys.len() - 1 {
            tracker.observe_tree(tree);
        }
    }
}

#[test]
fn ascending_keys_leave_every_leaf_but_the_last_full() {
    let dir = TempDir::new("ascending");
    let (db, tree) = open(&dir);
    let mut model = Model::new();
    let mut tracker = SplitTracker::new();
    // Under a prefix, as orderly's rows of one account are: the leaves' keys are stored
    // without the bytes their bounds share, which `Node::is_append` has to skip.
    let keys: Vec<Vec<u8>> =
        (0..2_000).map(|id| key(b"acct-7/orders/", id)).collect();
    insert_all(&tree, &mut model, &mut tracker, &keys);
    tracker.report("ascending_keys_leave_every_leaf_but_the_last_full");

    assert_eq!(
        tracker.midpoint_splits, 0,
        "a key after every row split a leaf in the middle"
    );
    assert_eq!(tracker.merges, 0);
    let shape = Shape::of(&tree);
    let leaves = shape.leaves();
    assert_eq!(tracker.append_splits, leaves.len() - 1);
    // 2,000 rows in leaves of 29: 69 leaves and the last one's remainder.
    assert_eq!(leaves.len(), (2_000 + APPEND_LEFT_ROWS - 1) / APPEND_LEFT_ROWS);
    for leaf in &leaves[..leaves.len() - 1] {
        assert_eq!(
            leaf.len, APPEND_LEFT_ROWS,
            "leaf {} of {:?}",
            leaf.pid, shape
        );
    }
    check_tree(&tree, &model, &[]);

    drop(tree);
    drop(db);
    let (_db, tree) = open(&dir);
    check_tree(&tree, &model, &[]);
    assert_eq!(
        Shape::of(&tree).leaves(),
        leaves,
        "the shape survives a reopen"
    );

    // Appends after the reopen go on filling leaves the same way.
    let more: Vec<Vec<u8>> =
        (2_000..2_300).map(|id| key(b"acct-7/orders/", id)).collect();
    let mut tracker = SplitTracker::new();
    tracker.observe_tree(&tree);
    insert_all(&tree, &mut model, &mut tracker, &more);
    tracker
        .report("ascending_keys_leave_every_leaf_but_the_last_full (reopened)");
    assert!(tracker.append_splits >= 10);
    assert_eq!(tracker.midpoint_splits, 0);
    check_tree(&tree, &model, &[]);
}

/// Two accounts appending in turn, as orderly's per-account lists are written: each
/// account's keys only grow, but the leaf where one account's keys end and the next one's
/// begin takes keys in its middle and splits there. Every leaf that only ever saw its own
/// account's appends is left full.
#[test]
fn two_accounts_appending_in_turn() {
    let dir = TempDir::new("two-accounts");
    let (_db, tree) = open(&dir);
    let mut model = Model::new();
    let mut tracker = SplitTracker::new();
    let mut keys = Vec::new();
    for id in 0..1_200 {
        keys.push(key(b"a/", id));
        keys.push(key(b"b/", id));
    }
    insert_all(&tree, &mut model, &mut tracker, &keys);
    tracker.report("two_accounts_appending_in_turn");

    // Account a's leaves fill up behind the leaf that holds b's first keys: every split of
    // them is a midpoint split of that boundary leaf; account b's appends split at the end.
    assert!(tracker.append_splits * 3 >= tracker.splits(), "{:?}", tracker);
    assert!(tracker.midpoint_splits > 0, "{:?}", tracker);
    let shape = Shape::of(&tree);
    let b_leaves: Vec<_> =
        shape.leaves().iter().filter(|l| l.lo.starts_with(b"b/")).collect();
    assert!(b_leaves.len() > 30);
    for leaf in &b_leaves[..b_leaves.len() - 1] {
        assert_eq!(leaf.len, APPEND_LEFT_ROWS, "{:?}", leaf);
    }
    check_tree(&tree, &model, &[]);
}

/// Keys that land between keys split in the middle: random order, and descending order
/// (every key sorts before every row of its leaf). Neither leaves a leaf fuller than a
/// midpoint split does, and the tree holds every row.
#[test]
fn keys_between_keys_split_in_the_middle() {
    let dir = TempDir::new("between");
    let (_db, tree) = open(&dir);
    let mut model = Model::new();

    let mut descending = SplitTracker::new();
    let keys: Vec<Vec<u8>> =
        (0..1_000).rev().map(|id| key(b"desc/", id)).collect();
    insert_all(&tree, &mut model, &mut descending, &keys);
    descending.report("keys_between_keys_split_in_the_middle (descending)");
    assert_eq!(descending.append_splits, 0, "{:?}", descending);
    assert!(descending.midpoint_splits >= 1_000 / LEAF_SPLIT_ROWS);

    let mut random = SplitTracker::new();
    random.observe_tree(&tree);
    let mut rng = Rng::new(7);
    let mut ids: Vec<u64> = (0..1_500).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let keys: Vec<Vec<u8>> = ids.iter().map(|id| key(b"rand/", *id)).collect();
    insert_all(&tree, &mut model, &mut random, &keys);
    random.report("keys_between_keys_split_in_the_middle (random)");
    // A random key is rarely the largest of its leaf.
    assert!(random.midpoint_splits > 4 * random.append_splits, "{:?}", random);
    check_tree(&tree, &model, &[]);
}
