//! The child process of tests/kill_model.rs: applies `queue_ops(seed, ops, queues, keep)`
//! from operation START on (the store at DIR holds the state after the first START) to the
//! store, flushing after every `flush_each` operations and then printing `flushed N`
//! (operations 0..N are durable), until it is killed.
//!
//! usage: crash-writer DIR SEED OPS QUEUES KEEP FLUSH_EACH FLUSH_EVERY_MS(0: none) START LEVEL BATCH
//!
//! LEVEL is zstd's level for every page (0: pages uncompressed; orderly's server writes -3).
//! BATCH is how many operations each transaction applies (0: none, each operation alone), as
//! orderly's writer commits a batch of orders in one; with transactions, `flushed N` follows
//! the transaction that reached or passed each multiple of FLUSH_EACH.

use std::io::Write;

use sled_suites::workload::{apply_to_tree, queue_ops, value, Op};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    assert_eq!(
        args.len(),
        10,
        "usage: crash-writer DIR SEED OPS QUEUES KEEP FLUSH_EACH FLUSH_EVERY_MS START LEVEL BATCH"
    );
    let n = |i: usize| -> u64 { args[i].parse().unwrap() };
    let ops = queue_ops(n(1), n(2) as usize, n(3), n(4));
    let flush_each = n(5) as usize;
    let flush_every_ms = if n(6) == 0 { None } else { Some(n(6)) };
    let level: i32 = args[8].parse().unwrap();
    let db = sled::Config::new()
        .path(&args[0])
        .flush_every_ms(flush_every_ms)
        .use_compression(level != 0)
        .compression_factor(if level == 0 { 5 } else { level })
        .open()
        .unwrap();
    let tree = db.open_tree("queue").unwrap();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(out, "opened").unwrap();
    out.flush().unwrap();
    let start = n(7) as usize;
    let batch = n(9) as usize;
    if batch == 0 {
        for (i, op) in ops.iter().enumerate().skip(start) {
            apply_to_tree(&tree, i, op).unwrap();
            if (i + 1) % flush_each == 0 {
                tree.flush().unwrap();
                writeln!(out, "flushed {}", i + 1).unwrap();
                out.flush().unwrap();
            }
        }
    } else {
        let mut at = start;
        while at < ops.len() {
            let end = (at + batch).min(ops.len());
            tree.transaction(|t| {
                for (i, op) in ops[at..end].iter().enumerate() {
                    match op {
                        Op::Set(k) => {
                            t.set(k.as_slice(), value(k, (at + i) as u64))
                        }
                        Op::Remove(k) => t.delete(k.as_slice()),
                    }
                }
                Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
            })
            .unwrap();
            if end / flush_each > at / flush_each {
                tree.flush().unwrap();
                writeln!(out, "flushed {}", end).unwrap();
                out.flush().unwrap();
            }
            at = end;
        }
    }
    tree.flush().unwrap();
    writeln!(out, "flushed {}", ops.len()).unwrap();
    writeln!(out, "done").unwrap();
    out.flush().unwrap();
    // Wait to be killed, as if more work were coming.
    std::thread::sleep(std::time::Duration::from_secs(60));
}
