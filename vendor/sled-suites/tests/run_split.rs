//! orderly's change 12 (vendor/sled/ORDERLY-PATCHES.md): a transaction's writes to one leaf
//! that take it past its split size split it as they are written, into the halves the
//! traversal's split would have made of the leaf with those writes in it. Before, the leaf was
//! written full, the next write linked to it alone, and the next traversal split it: a
//! second rewrite of the same rows (and, for appends, a different shape).

use sled_suites::shape::{Shape, APPEND_SPLIT_RIGHT, LEAF_SPLIT_ROWS};
use sled_suites::workload::{key, value, TempDir};

fn open(dir: &TempDir) -> (sled::Db, sled::Tree) {
    let db = sled::Config::new().path(&dir.0).open().unwrap();
    let tree = db.open_tree("orders").unwrap();
    (db, tree)
}

/// Writes `keys` in one transaction.
fn insert_in_one_transaction(tree: &sled::Tree, keys: &[Vec<u8>]) {
    tree.transaction(|t| {
        for (i, k) in keys.iter().enumerate() {
            t.insert(k.as_slice(), value(k, i as u64))?;
        }
        Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
    })
    .unwrap();
}

fn leaf_rows(tree: &sled::Tree) -> Vec<usize> {
    let shape = Shape::of(tree);
    shape.check();
    shape.leaves().iter().map(|leaf| leaf.len).collect()
}

fn assert_reads_back(tree: &sled::Tree, keys: &[Vec<u8>]) {
    let stored: Vec<Vec<u8>> =
        tree.iter().keys().map(|k| k.unwrap().to_vec()).collect();
    let mut expected = keys.to_vec();
    expected.sort();
    assert_eq!(stored, expected);
}

#[test]
fn a_transaction_of_appends_past_a_leafs_split_size_leaves_it_full_and_the_rest_to_the_right(
) {
    let dir = TempDir::new("run-split-append");
    let (_db, tree) = open(&dir);
    let keys: Vec<Vec<u8>> = (0..40).map(|i| key(b"acct-1/", i)).collect();
    insert_in_one_transaction(&tree, &keys);
    // The run took the leaf to 36 rows and split it as an append: 32 stay, 4 go right, and
    // the last 4 writes join them. (The leaf written full at 33 and split by the traversal
    // after left 29 and 11.)
    let full = LEAF_SPLIT_ROWS;
    assert_eq!(leaf_rows(&tree), vec![full, 40 - full]);
    assert_eq!(40 - full, 2 * APPEND_SPLIT_RIGHT);
    assert_reads_back(&tree, &keys);
}

#[test]
fn a_transaction_of_inserts_between_keys_splits_a_leaf_as_soon_as_it_is_past_its_split_size(
) {
    let dir = TempDir::new("run-split-between");
    let (_db, tree) = open(&dir);
    let even: Vec<Vec<u8>> = (0..30).map(|i| key(b"acct-1/", 2 * i)).collect();
    for (i, k) in even.iter().enumerate() {
        tree.insert(k.as_slice(), value(k, i as u64)).unwrap();
    }
    assert_eq!(leaf_rows(&tree), vec![30]);
    let odd: Vec<Vec<u8>> =
        (10..16).map(|i| key(b"acct-1/", 2 * i + 1)).collect();
    insert_in_one_transaction(&tree, &odd);
    // The run stops one row past the split size (33) and splits the leaf at the middle, 17
    // and 16, the halves the traversal's split made; the last three writes make them 18 and
    // 18. Only appends fill a leaf further before it splits (to 36, then 19 and 17 here):
    // keys between keys would leave every leaf of their tree fuller, and each of its later
    // rewrites larger.
    assert_eq!(leaf_rows(&tree), vec![18, 18]);
    let all: Vec<Vec<u8>> = even.iter().chain(odd.iter()).cloned().collect();
    assert_reads_back(&tree, &all);
}

#[test]
fn a_split_written_by_a_transaction_reads_back_after_a_reopen() {
    let dir = TempDir::new("run-split-reopen");
    let keys: Vec<Vec<u8>> = (0..100).map(|i| key(b"acct-2/", i)).collect();
    {
        let (db, tree) = open(&dir);
        for chunk in keys.chunks(25) {
            insert_in_one_transaction(&tree, chunk);
        }
        db.flush().unwrap();
    }
    let started = std::time::Instant::now();
    let (_db, tree) = loop {
        match sled::Config::new().path(&dir.0).open() {
            Ok(db) => {
                let tree = db.open_tree("orders").unwrap();
                break (db, tree);
            }
            Err(e)
                if started.elapsed() < std::time::Duration::from_secs(10) =>
            {
                assert!(
                    e.to_string().contains("could not acquire lock"),
                    "{}",
                    e
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("opening the store again failed: {}", e),
        }
    };
    assert_reads_back(&tree, &keys);
    assert!(leaf_rows(&tree).iter().all(|&rows| rows <= LEAF_SPLIT_ROWS));
}
