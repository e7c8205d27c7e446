//! orderly's change 12 (vendor/sled/ORDERLY-PATCHES.md): a transaction's writes to one leaf
//! that take it past its split size split it as they are written, into the halves the
//! traversal's split would have made of the leaf with those writes in it. Before, the leaf was
//! written full, the next write linked to it alone, and the next traversal split it: a
//! second rewrite of the same rows (and, for appends, a different shape).

mod common;

use sled_suites::shape::{Shape, LEAF_SPLIT_ROWS};
use sled_suites::workload::{check_tree, key, value, Model, TempDir};

fn open(dir: &TempDir) -> (sled::Db, sled::Tree) {
    let db = sled::Config::new().path(&dir.0).open().unwrap();
    let tree = db.open_tree("orders").unwrap();
    (db, tree)
}

/// Writes `keys` in one transaction, and into `model`.
fn insert_in_one_transaction(
    tree: &sled::Tree,
    model: &mut Model,
    keys: &[Vec<u8>],
) {
    tree.transaction(|t| {
        for (i, k) in keys.iter().enumerate() {
            t.insert(k.as_slice(), value(k, i as u64))?;
        }
        Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
    })
    .unwrap();
    for (i, k) in keys.iter().enumerate() {
        model.insert(k.clone(), value(k, i as u64));
    }
}

fn leaf_rows(tree: &sled::Tree) -> Vec<usize> {
    let shape = Shape::of(tree);
    shape.check();
    shape.leaves().iter().map(|leaf| leaf.len).collect()
}

#[test]
fn a_transaction_of_appends_past_a_leafs_split_size_leaves_it_full_and_the_rest_to_the_right(
) {
    let dir = TempDir::new("run-split-append");
    let (_db, tree) = open(&dir);
    let mut model = Model::new();
    let keys: Vec<Vec<u8>> = (0..40).map(|i| key(b"acct-1/", i)).collect();
    insert_in_one_transaction(&tree, &mut model, &keys);
    // The run took the leaf to 36 rows and split it as an append: 32 stay, 4 go right, and
    // the last 4 writes join them. (The leaf written full at 33 and split by the traversal
    // after left 29 and 11.)
    assert_eq!(leaf_rows(&tree), vec![LEAF_SPLIT_ROWS, 40 - LEAF_SPLIT_ROWS]);
    check_tree(&tree, &model, &[]);
}

#[test]
fn a_transaction_of_inserts_between_keys_splits_a_leaf_as_soon_as_it_is_past_its_split_size(
) {
    let dir = TempDir::new("run-split-between");
    let (_db, tree) = open(&dir);
    let mut model = Model::new();
    let even: Vec<Vec<u8>> = (0..30).map(|i| key(b"acct-1/", 2 * i)).collect();
    for (i, k) in even.iter().enumerate() {
        tree.insert(k.as_slice(), value(k, i as u64)).unwrap();
        model.insert(k.clone(), value(k, i as u64));
    }
    assert_eq!(leaf_rows(&tree), vec![30]);
    let odd: Vec<Vec<u8>> =
        (10..16).map(|i| key(b"acct-1/", 2 * i + 1)).collect();
    insert_in_one_transaction(&tree, &mut model, &odd);
    // The run stops one row past the split size (33) and splits the leaf at the middle, 17
    // and 16, the halves the traversal's split made; the last three writes make them 18 and
    // 18. Only appends fill a leaf further before it splits (to 36, then 19 and 17 here):
    // keys between keys would leave every leaf of their tree fuller, and each of its later
    // rewrites larger.
    assert_eq!(leaf_rows(&tree), vec![18, 18]);
    check_tree(&tree, &model, &[]);
}

#[test]
fn a_split_written_by_a_transaction_reads_back_after_a_reopen() {
    let dir = TempDir::new("run-split-reopen");
    let mut model = Model::new();
    let keys: Vec<Vec<u8>> = (0..100).map(|i| key(b"acct-2/", i)).collect();
    {
        let (db, tree) = open(&dir);
        for chunk in keys.chunks(25) {
            insert_in_one_transaction(&tree, &mut model, chunk);
        }
        db.flush().unwrap();
    }
    let db =
        common::retry_while_locked(|| sled::Config::new().path(&dir.0).open())
            .expect("the store opens again");
    let tree = db.open_tree("orders").unwrap();
    check_tree(&tree, &model, &[]);
    assert!(leaf_rows(&tree).iter().all(|&rows| rows <= LEAF_SPLIT_ROWS));
}
