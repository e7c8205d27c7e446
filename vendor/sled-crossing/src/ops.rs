// Included once per build of sled (main.rs): `sled` names that build here.

use crate::rows::{self, Expected};
use std::path::Path;

fn open(dir: &Path, cache_mb: u64) -> Result<sled::Db, String> {
    sled::Config::new()
        .path(dir)
        .cache_capacity(cache_mb << 20)
        .use_compression(std::env::var_os("CROSSING_COMPRESSED").is_some())
        .compression_factor(ZSTD_LEVEL)
        .open()
        .map_err(|e| format!("open: {e}"))
}

/// Writes rows `from..to`, removes the ledger rows below `remove_below` and rewrites every
/// balance at `generation`, then flushes.
pub fn write(
    dir: &Path,
    cache_mb: u64,
    from: u64,
    to: u64,
    remove_below: u64,
    generation: u64,
) -> Result<(), String> {
    let db = open(dir, cache_mb)?;
    let tree = |name: &str| db.open_tree(name).map_err(|e| format!("{name}: {e}"));
    let (orders, ledger, keys, medium, balances) = (
        tree(rows::ORDERS)?,
        tree(rows::LEDGER)?,
        tree(rows::KEYS)?,
        tree(rows::MEDIUM)?,
        tree(rows::BALANCE)?,
    );
    let fail = |e: sled::Error| format!("write: {e}");
    for i in from..to {
        let t = match rows::tree_of(i) {
            rows::ORDERS => &orders,
            rows::LEDGER => &ledger,
            rows::KEYS => &keys,
            _ => &medium,
        };
        t.insert(rows::key(i), rows::value(i)).map_err(fail)?;
        if i % 100_000 == 99_999 {
            db.flush().map_err(fail)?;
        }
    }
    // The oldest ledger rows go as a queue's front does, in transactions as orderly's writer
    // makes its writes.
    let mut i = 0;
    while i < remove_below {
        let end = (i + 1_000).min(remove_below);
        ledger
            .transaction(|t| {
                for n in i..end {
                    if rows::tree_of(n) == rows::LEDGER {
                        t.remove(rows::key(n))?;
                    }
                }
                Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| format!("remove: {e:?}"))?;
        i = end;
    }
    for b in 0..rows::BALANCES {
        balances
            .insert(rows::balance_key(b), rows::balance_value(b, generation))
            .map_err(fail)?;
    }
    db.flush().map_err(fail)?;
    Ok(())
}

/// Reads the whole store and compares it with what `expected` says it holds: every tree
/// forwards (keys and values, nothing more), the orders of a few accounts backwards, and a
/// read of every 97th row by its key. Returns the rows read.
pub fn check(dir: &Path, cache_mb: u64, expected: Expected) -> Result<u64, String> {
    let db = open(dir, cache_mb)?;
    let mut read = 0u64;
    for name in [rows::ORDERS, rows::LEDGER, rows::KEYS, rows::MEDIUM] {
        let tree = db.open_tree(name).map_err(|e| format!("{name}: {e}"))?;
        let want = expected.in_key_order(name);
        let mut got = tree.iter();
        for (n, &i) in want.iter().enumerate() {
            let (k, v) = match got.next() {
                Some(Ok(kv)) => kv,
                Some(Err(e)) => return Err(format!("{name}: reading row {n}: {e}")),
                None => return Err(format!("{name}: {} rows, {} expected", n, want.len())),
            };
            if k.as_ref() != rows::key(i).as_slice() {
                return Err(format!("{name}: row {n} has key {k:?}, row {i}'s expected"));
            }
            if v.as_ref() != rows::value(i).as_slice() {
                return Err(format!("{name}: row {i}'s value differs"));
            }
            if n % 97 == 0 {
                let again = tree.get(rows::key(i)).map_err(|e| format!("{name}: get: {e}"))?;
                if again.as_deref() != Some(rows::value(i).as_slice()) {
                    return Err(format!("{name}: row {i} read by its key differs"));
                }
            }
        }
        if let Some(extra) = got.next() {
            return Err(format!("{name}: a row more than expected: {extra:?}"));
        }
        read += want.len() as u64;
    }
    let orders = db.open_tree(rows::ORDERS).map_err(|e| e.to_string())?;
    let all = expected.in_key_order(rows::ORDERS);
    for account in [0u64, 1, rows::ACCOUNTS / 2, rows::ACCOUNTS - 1] {
        let prefix = (account as u16).to_be_bytes();
        let newest_first: Vec<Vec<u8>> = orders
            .scan_prefix(prefix)
            .rev()
            .map(|kv| kv.map(|(k, _)| k.to_vec()))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("orders: a backward scan: {e}"))?;
        let want: Vec<Vec<u8>> = all
            .iter()
            .filter(|&&i| rows::account_of(i) == account)
            .rev()
            .map(|&i| rows::key(i))
            .collect();
        if newest_first != want {
            return Err(format!("orders of account {account} read backwards differ"));
        }
    }
    let balances = db.open_tree(rows::BALANCE).map_err(|e| e.to_string())?;
    if balances.len() != rows::BALANCES as usize {
        return Err(format!("{} balances, {} expected", balances.len(), rows::BALANCES));
    }
    for b in 0..rows::BALANCES {
        let v = balances.get(rows::balance_key(b)).map_err(|e| e.to_string())?;
        if v.as_deref() != Some(rows::balance_value(b, expected.generation).as_slice()) {
            return Err(format!("balance {b} is not generation {}'s", expected.generation));
        }
    }
    Ok(read + u64::from(rows::BALANCES))
}
