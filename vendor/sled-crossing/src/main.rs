//! A store written by sled as published opened, read whole and written to by orderly's
//! patched copy (vendor/sled), and the other way. One process opens a store with one build:
//!
//!     sled-crossing write published|patched DIR --to N [--from F] [--remove-below R] [--generation G]
//!     sled-crossing check published|patched DIR --rows N [--removed R] [--generation G]
//!
//! `write` adds rows `F..N`, removes the ledger rows below `R` and rewrites the balances at `G`;
//! `check` reads everything and requires exactly what those passes wrote (`rows.rs`), then
//! prints a line of figures: rows read, bytes on disk, segments' file and blob files.
//! With CROSSING_COMPRESSED set, every open compresses pages with zstd (a store orderly's server
//! creates is compressed).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

mod rows;

mod published_ops {
    use published as sled;
    /// zstd's level for pages written with CROSSING_COMPRESSED set: published sled refuses
    /// levels under 1.
    const ZSTD_LEVEL: i32 = 1;
    include!("ops.rs");
}

mod patched_ops {
    use patched as sled;
    /// The level orderly's server writes every page of a new store at.
    const ZSTD_LEVEL: i32 = -3;
    include!("ops.rs");
}

/// `--name N` from the arguments, or `default`.
fn flag(args: &[String], name: &str, default: u64) -> Result<u64, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(at) => args
            .get(at + 1)
            .and_then(|v| v.replace('_', "").parse().ok())
            .ok_or_else(|| format!("{name} takes a number")),
    }
}

/// Bytes of every file under `dir`, and how many files sled's `blobs/` holds.
fn on_disk(dir: &Path) -> (u64, usize) {
    fn walk(p: &Path, bytes: &mut u64) {
        if let Ok(entries) = std::fs::read_dir(p) {
            for e in entries.flatten() {
                match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path(), bytes),
                    Ok(m) => *bytes += m.len(),
                    Err(_) => {}
                }
            }
        }
    }
    let mut bytes = 0;
    walk(dir, &mut bytes);
    let blobs = std::fs::read_dir(dir.join("blobs")).map_or(0, |d| d.count());
    (bytes, blobs)
}

fn run(args: &[String]) -> Result<String, String> {
    let usage = "usage: sled-crossing write|check published|patched DIR [flags]";
    let (command, build, dir) = match args {
        [c, b, d, ..] => (c.as_str(), b.as_str(), PathBuf::from(d)),
        _ => return Err(usage.into()),
    };
    let cache_mb = flag(args, "--cache-mb", 64)?;
    let generation = flag(args, "--generation", 1)?;
    let started = Instant::now();
    let done = match (command, build) {
        ("write", _) => {
            let (from, to) = (flag(args, "--from", 0)?, flag(args, "--to", 0)?);
            let below = flag(args, "--remove-below", 0)?;
            match build {
                "published" => published_ops::write(&dir, cache_mb, from, to, below, generation),
                "patched" => patched_ops::write(&dir, cache_mb, from, to, below, generation),
                _ => return Err(usage.into()),
            }?;
            format!(
                "wrote rows {from}..{to}, ledger below {below} removed, balances at {generation}"
            )
        }
        ("check", _) => {
            let expected = rows::Expected {
                rows: flag(args, "--rows", 0)?,
                removed: flag(args, "--removed", 0)?,
                generation,
            };
            let read = match build {
                "published" => published_ops::check(&dir, cache_mb, expected),
                "patched" => patched_ops::check(&dir, cache_mb, expected),
                _ => return Err(usage.into()),
            }?;
            format!("read {read} rows, every one as written")
        }
        _ => return Err(usage.into()),
    };
    let (bytes, blobs) = on_disk(&dir);
    Ok(format!(
        "{build} {command}: {done} in {:.1} s; {:.1} MiB on disk, {blobs} blob files",
        started.elapsed().as_secs_f64(),
        bytes as f64 / (1u64 << 20) as f64
    ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(line) => {
            println!("sled-crossing: {line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sled-crossing: {e}");
            ExitCode::FAILURE
        }
    }
}
