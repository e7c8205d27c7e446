//! kill -9 at random points, against a model. A child process (`crash-writer`, src/bin)
//! applies a queue-like workload (appends that split leaves, removals from the front that
//! merge them, keys between keys) and says after each flush how far it is durable; the
//! parent kills it with SIGKILL after a random delay, reopens the store and requires that it
//! holds exactly the model's state after some prefix of the operations, no shorter than the
//! last flush the child reported: every flushed row is there, and nothing unflushed is half
//! there (a row of a later operation without the ones before it, or a torn value). The tree
//! must be whole (its shape, both scans, every key, reads around every leaf bound); then a
//! new child goes on from the recovered prefix and is killed again.
//!
//! Half the cases compress every page with zstd (at orderly's level, -3, or at 1), as orderly's
//! server does for every store it creates. Half apply the operations in transactions of 8 or 64
//! (orderly's writer commits a batch of orders in one), whose writes to one leaf sled writes
//! as one page (ORDERLY-PATCHES.md, change 11).
//!
//! PROPTEST_CASES sets the number of cases (8 unless set).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use proptest::prelude::*;
use sled_suites::shape::Shape;
use sled_suites::workload::{
    apply, check_tree, contents, queue_ops, Model, Op, TempDir,
};

const OPS: usize = 20_000;

struct Params {
    seed: u64,
    queues: u64,
    keep: u64,
    flush_each: u64,
    flush_every_ms: u64,
    /// zstd's level for every page; 0: uncompressed.
    level: i32,
    /// Operations per transaction; 0: each alone, outside any.
    batch: u64,
}

/// Runs a child from operation `start` until it is killed `kill_after_ms` after it opened
/// the store; returns the last flushed count it printed (or `start`).
fn run_child(
    dir: &TempDir,
    p: &Params,
    start: usize,
    kill_after_ms: u64,
) -> usize {
    let mut child = Command::new(env!("CARGO_BIN_EXE_crash-writer"))
        .args(&[
            dir.0.to_str().unwrap().to_string(),
            p.seed.to_string(),
            OPS.to_string(),
            p.queues.to_string(),
            p.keep.to_string(),
            p.flush_each.to_string(),
            p.flush_every_ms.to_string(),
            start.to_string(),
            p.level.to_string(),
            p.batch.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning crash-writer");
    let stdout = child.stdout.take().unwrap();
    let (opened_tx, opened) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut flushed = start;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if line == "opened" {
                let _ = opened_tx.send(());
            } else if let Some(n) = line.strip_prefix("flushed ") {
                flushed = n.parse().unwrap();
            }
        }
        flushed
    });
    // Killed once it has opened the store (a kill inside `open` is upstream's
    // test_crash_recovery's case), after the drawn delay.
    opened
        .recv_timeout(Duration::from_secs(60))
        .expect("the child opened the store");
    std::thread::sleep(Duration::from_millis(kill_after_ms));
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    reader.join().unwrap()
}

/// The prefix of `ops` whose state the store holds: the smallest p >= `flushed` after
/// which the model equals `recovered`, found by counting the keys where they differ.
fn matching_prefix(
    ops: &[Op],
    recovered: &Model,
    flushed: usize,
) -> Option<usize> {
    let mut model = Model::new();
    let mut differ = recovered.len();
    for p in 0..=ops.len() {
        if p >= flushed && differ == 0 {
            return Some(p);
        }
        if p == ops.len() {
            break;
        }
        let k = ops[p].key();
        let before = model.get(k) != recovered.get(k);
        apply(&mut model, p, &ops[p]);
        let after = model.get(k) != recovered.get(k);
        differ = differ + after as usize - before as usize;
    }
    None
}

fn kill_and_check(p: &Params, kills: &[u64]) {
    let dir = TempDir::new("kill-model");
    let ops = queue_ops(p.seed, OPS, p.queues, p.keep);
    let mut start = 0;
    let mut prefixes = Vec::new();
    for (round, kill_after_ms) in kills.iter().enumerate() {
        let flushed = run_child(&dir, p, start, *kill_after_ms);
        let db = sled::Config::new()
            .path(&dir.0)
            .use_compression(p.level != 0)
            .open()
            .unwrap();
        let tree = db.open_tree("queue").unwrap();
        Shape::of(&tree).check();
        let recovered = contents(&tree);
        let at = matching_prefix(&ops, &recovered, flushed.max(start)).unwrap_or_else(|| {
            panic!(
                "round {}: the store ({} rows) is not the state after any prefix of the \
                 operations from the last flush ({}) on",
                round,
                recovered.len(),
                flushed.max(start)
            )
        });
        let mut model = Model::new();
        for (i, op) in ops[..at].iter().enumerate() {
            apply(&mut model, i, op);
        }
        let removed: Vec<Vec<u8>> = ops[..at]
            .iter()
            .filter_map(|op| match op {
                Op::Remove(k) => Some(k.clone()),
                Op::Set(_) => None,
            })
            .collect();
        check_tree(&tree, &model, &removed);
        prefixes.push((flushed, at, Shape::of(&tree).leaves().len()));
        start = at;
    }
    println!(
        "KILL-MODEL seed={} level={} batch={} (flushed, recovered prefix, leaves) per kill: {:?}",
        p.seed, p.level, p.batch, prefixes
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(8),
        max_shrink_iters: 8,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn every_flushed_row_survives_a_kill_and_nothing_unflushed_is_half_there(
        seed in any::<u64>(),
        queues in 1u64..4,
        keep in prop::sample::select(vec![50u64, 300, 2_000]),
        flush_each in prop::sample::select(vec![1u64, 7, 64, 500]),
        flush_every_ms in prop::sample::select(vec![0u64, 1, 20, 500]),
        kills in prop::collection::vec(0u64..150, 2..5),
        level in prop::sample::select(vec![0i32, 0, -3, 1]),
        batch in prop::sample::select(vec![0u64, 0, 8, 64]),
    ) {
        kill_and_check(&Params { seed, queues, keep, flush_each, flush_every_ms, level, batch }, &kills);
    }
}
