//! A crash at every write of the log while appends split leaves.
//!
//! sled's fail points (`failpoints`) are all at its IO: none is inside `Tree::split_node`.
//! A split writes several records to the log (the new right leaf, the left leaf's
//! `ChildSplit`, the parent's `ParentSplit` or a new root), and the log reaches the disk a
//! buffer at a time. Failing each buffer write in turn ("buffer write": nothing written;
//! "buffer write post": written, then the error) ends the durable log at every place a write
//! can end it, including between the records of one split: small segments roll their
//! buffers inside splits. After each crash the store is reopened and must hold a prefix of
//! the inserts, at least every insert a successful `flush` covered, with its exact value; the
//! tree must be whole (its shape, both scans, reads around every leaf bound), take more
//! appends, and reopen again. Recoveries that found a split whose parent was never told are
//! counted (its right leaf reachable only from its left sibling).

use std::sync::Mutex;

use sled_suites::shape::{Shape, SplitTracker, LEAF_SPLIT_ROWS};
use sled_suites::workload::{check_tree, key, value, Model, TempDir};

const PREFIX: &[u8] = b"acct-3/orders/";
const INSERTS: u64 = 400;
const FLUSH_EVERY: u64 = 5;
/// Arm the fail point after this many inserts, then fail the 1st to 8th write after it.
const ARM_EVERY: u64 = 25;
const WRITES_PER_ARM: u32 = 8;

// Fail points are global to the process: one sweep at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn config(dir: &TempDir) -> sled::Config {
    sled::Config::new().path(&dir.0).segment_size(4096).flush_every_ms(None)
}

struct Outcome {
    half_done_splits: usize,
    recovered_splits: usize,
    /// The splits of the appends after the recovery.
    after: SplitTracker,
}

/// One trial: `INSERTS` ascending keys with a flush every `FLUSH_EVERY`, the fail point
/// armed after `arm_at` inserts to fail the `nth` call after it.
fn trial(point: &'static str, arm_at: u64, nth: u32) -> Outcome {
    let dir = TempDir::new("split-crash");
    let mut flushed = 0u64;
    let mut attempted = 0u64;
    {
        let db = config(&dir).open().unwrap();
        let tree = db.open_tree("orders").unwrap();
        for id in 0..INSERTS {
            if id == arm_at {
                sled::fail::set(point, 1 << nth);
            }
            attempted = id + 1;
            let k = key(PREFIX, id);
            if tree.insert(k.as_slice(), value(&k, id)).is_err() {
                break;
            }
            if id % FLUSH_EVERY == FLUSH_EVERY - 1 {
                match tree.flush() {
                    Ok(_) => flushed = id + 1,
                    Err(_) => break,
                }
            }
        }
        sled::fail::reset();
        // Dropped without a flush of what the error left in memory: a crash.
    }

    let db = config(&dir).open().unwrap_or_else(|e| {
        panic!("{} at {}+{}: reopen failed: {:?}", point, arm_at, nth, e)
    });
    let tree = db.open_tree("orders").unwrap();
    let shape = Shape::of(&tree);
    shape.check();
    let half_done_splits = shape.unlinked_leaves();
    let recovered_splits = shape.leaves().len() - 1;
    let recovered = sled_suites::workload::contents(&tree);
    let n = recovered.len() as u64;
    let model: Model = (0..n)
        .map(|id| (key(PREFIX, id), value(&key(PREFIX, id), id)))
        .collect();
    assert_eq!(
        recovered, model,
        "{} at {}+{}: the store holds {} rows but not the first {} inserts",
        point, arm_at, nth, n, n
    );
    assert!(
        n >= flushed,
        "{} at {}+{}: {} rows after a flush covered {}",
        point,
        arm_at,
        nth,
        n,
        flushed
    );
    assert!(n <= attempted);
    check_tree(&tree, &model, &[]);

    // The recovered tree takes more appends, splits as before, and reopens.
    let mut model = model;
    let mut tracker = SplitTracker::new();
    tracker.observe(&shape);
    for id in n..n + 100 {
        let k = key(PREFIX, id);
        tree.insert(k.as_slice(), value(&k, id)).unwrap();
        model.insert(k.clone(), value(&k, id));
        if id % 4 == 3 {
            tracker.observe_tree(&tree);
        }
    }
    tracker.observe_tree(&tree);
    // A last leaf recovered with one row over the threshold waits for the next traversal
    // to split it, and the first is a read of one of its rows (`check_tree` above): that
    // split is a midpoint split. Every other split of these appends is an append split.
    let overfull = shape.leaves().last().unwrap().len > LEAF_SPLIT_ROWS;
    assert!(
        tracker.append_splits >= 2
            && tracker.midpoint_splits <= overfull as usize,
        "{} append, {} midpoint splits after a recovery of {} rows",
        tracker.append_splits,
        tracker.midpoint_splits,
        n
    );
    check_tree(&tree, &model, &[]);
    drop(tree);
    drop(db);
    let db = config(&dir).open().unwrap();
    let tree = db.open_tree("orders").unwrap();
    check_tree(&tree, &model, &[]);
    Outcome { half_done_splits, recovered_splits, after: tracker }
}

fn sweep(point: &'static str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The same inserts without a fault: how many splits each trial's workload makes.
    let dir = TempDir::new("split-crash-clean");
    let db = config(&dir).open().unwrap();
    let tree = db.open_tree("orders").unwrap();
    let mut tracker = SplitTracker::new();
    for id in 0..INSERTS {
        let k = key(PREFIX, id);
        tree.insert(k.as_slice(), value(&k, id)).unwrap();
        if id % 4 == 3 {
            tracker.observe_tree(&tree);
        }
    }
    drop(tree);
    drop(db);

    let mut trials = 0;
    let mut half_done = 0;
    let mut recovered_splits = 0;
    let mut after = SplitTracker::new();
    for arm_at in (0..INSERTS).step_by(ARM_EVERY as usize) {
        for nth in 0..WRITES_PER_ARM {
            let o = trial(point, arm_at, nth);
            trials += 1;
            half_done += o.half_done_splits;
            recovered_splits += o.recovered_splits;
            after.append_splits += o.after.append_splits;
            after.midpoint_splits += o.after.midpoint_splits;
        }
    }
    println!(
        "SPLIT-CRASH point={:?} trials={} splits-recovered={} recoveries-with-a-split-half-done={}",
        point, trials, recovered_splits, half_done
    );
    tracker.report(&format!(
        "split_crash {:?}: one trial's inserts without the fault",
        point
    ));
    after.report(&format!(
        "split_crash {:?}: the appends after each recovery",
        point
    ));
    assert_eq!(tracker.midpoint_splits, 0);
    assert!(
        recovered_splits > trials,
        "the crashes fell before any split: {} splits recovered in {} trials",
        recovered_splits,
        trials
    );
}

#[test]
fn a_failed_buffer_write_at_every_point_of_appends_that_split() {
    sweep("buffer write");
}

#[test]
fn a_buffer_write_that_reports_failure_after_writing() {
    sweep("buffer write post");
}
