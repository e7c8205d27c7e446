//! The child process of blob-cut.sh: one page kept in a blob file, made durable once and then
//! written again and again while nothing syncs the log, and the check after a power cut.
//!
//! usage: blob-writer write DIR    prints `durable 1`, then `written N` for each version after
//!        blob-writer check DIR    opens the store; exit 0 if the key holds a whole version
//!
//! `write` makes version 1 durable as orderly's group commit does (sled's flush, then an fsync
//! of the data file), then writes versions 2, 3, ... of the same key, each over sled's blob
//! threshold, with filler rows in another tree that move the log on, and never syncs again. Whatever reaches the disk after version 1 is what
//! sled itself syncs. sled removes version 1's file once the segment holding version 2 is
//! finished; blob-cut.sh cuts the power right after that removal. As published, sled synced no
//! blob file and removed version 1's with version 2 still unsynced: the store recovered with no
//! version of the key at all (ORDERLY-PATCHES.md, change 9).

use std::convert::TryInto;
use std::fs::File;
use std::io::Write;
use std::path::Path;

use sled_suites::workload::Rng;

const KEY: &[u8] = b"big";
/// Over sled's blob threshold (a quarter of its 512 KiB segment), and incompressible.
const VALUE_LEN: usize = 200 * 1024;

/// Version `v` of the value: its number, then bytes drawn from it.
fn value(version: u64) -> Vec<u8> {
    let mut rng = Rng::new(version);
    let mut bytes = version.to_le_bytes().to_vec();
    while bytes.len() < VALUE_LEN {
        bytes.extend_from_slice(&rng.next().to_le_bytes());
    }
    bytes.truncate(VALUE_LEN);
    bytes
}

fn open(dir: &Path) -> sled::Db {
    sled::Config::new().path(dir).flush_every_ms(None).open().unwrap()
}

/// As orderly's group commit makes a write durable: sled's flush, then an fsync of the data
/// file (sled syncs each blob file, and their directory, as it writes the file).
fn durable(db: &sled::Db, dir: &Path) {
    db.flush().unwrap();
    File::open(dir.join("db")).unwrap().sync_data().unwrap();
}

fn write(dir: &Path) {
    let db = open(dir);
    let big = db.open_tree("big").unwrap();
    let filler = db.open_tree("filler").unwrap();
    big.insert(KEY, value(1)).unwrap();
    durable(&db, dir);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(out, "durable 1").unwrap();
    out.flush().unwrap();
    for version in 2..100_000u64 {
        // An error here is the power cut (LazyFS gone): the parent kills this process.
        if big.insert(KEY, value(version)).is_err() {
            std::thread::park();
        }
        for i in 0..64u32 {
            let key = format!("{version:08}-{i:02}");
            if filler.insert(key.as_bytes(), vec![7u8; 1024]).is_err() {
                std::thread::park();
            }
        }
        writeln!(out, "written {version}").unwrap();
        out.flush().unwrap();
    }
}

fn check(dir: &Path) -> i32 {
    let db = open(dir);
    let big = db.open_tree("big").unwrap();
    match big.get(KEY).unwrap() {
        Some(got) => {
            let version = u64::from_le_bytes(got[..8].try_into().unwrap());
            if got.as_ref() == value(version).as_slice() {
                println!("recovered version {version}, whole");
                0
            } else {
                println!("FAILED: version {version} recovered torn");
                1
            }
        }
        None => {
            println!("FAILED: the key is gone (version 1 was durable)");
            1
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: blob-writer write DIR | blob-writer check DIR";
    assert_eq!(args.len(), 2, "{}", usage);
    let dir = Path::new(&args[1]);
    match args[0].as_str() {
        "write" => write(dir),
        "check" => std::process::exit(check(dir)),
        _ => panic!("{}", usage),
    }
}
