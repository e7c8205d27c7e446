//! The subcommands of `orderly`, one file each. Each ends in `Ok` or in an error that knows
//! what to say on stderr and the process's exit status (`Failure`); `run` turns that into
//! the status, so the exit-code policy is read next to each command, not in `main`.

pub(crate) mod copy;
pub(crate) mod migrate;
mod progress;
pub(crate) mod restore;
pub(crate) mod serve;
pub(crate) mod stats;
pub(crate) mod verify;

use std::process::ExitCode;

use crate::config::Command;

/// A command that did not succeed. Its `Display` is the one line said on stderr after
/// `orderly: `.
pub(crate) trait Failure: std::fmt::Display {
    /// 2 for a usage error (the flags, or a configuration or schema this binary cannot use,
    /// like a bad flag), 1 for anything else.
    fn exit_code(&self) -> u8 {
        1
    }
}

/// Runs `command` to its exit status.
pub fn run(command: Command) -> ExitCode {
    match command {
        Command::Serve(settings) => serve::run(*settings),
        Command::Stats(args) => finish(stats::run(&args)),
        Command::Restore(args) => finish(restore::command(&args)),
        Command::Migrate(args) => finish(migrate::run(&args.database_url)),
        Command::Copy(args) => finish(copy::command(&args)),
        Command::Verify(args) => finish(verify::run(&args)),
    }
}

fn finish(outcome: Result<(), impl Failure>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("orderly: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}

/// The counts of a restore or a copy on stdout, as one JSON object.
fn print_counts(counts: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string(counts).expect("counts serialize")
    );
}

/// sled's page cache for `restore`: it writes every page once, in order, so a cache buys it
/// nothing, and sled's memory grows well past what it counts.
const COMMAND_CACHE_BYTES: u64 = 16 << 20;

/// sled's page cache for the commands that only walk a store (`copy`, `stats`): each page is
/// read once, in order. sled counts a page by its size on disk, several times smaller than
/// the page in memory, so even a small cache held tens of MiB: at 1.23 million orders
/// `copy` peaked at 466 MiB with 16 MiB and 391 MiB with 1 MiB (`stats` 404 and 353 MiB),
/// with sled as published. Most of what remains is sled's bookkeeping of every page, built
/// whole at open; the patched sled (vendor/sled) has fewer pages and loads them without spare
/// room: `copy` 241 MiB at 1.21 million orders, `stats` 194 MiB at 1.19 million.
const WALK_CACHE_BYTES: u64 = 1 << 20;

/// The store a command that only reads walks: a PostgreSQL database (instances may run on it)
/// when `database_url` is given, else a stopped server's sled directory, with a walk's cache.
fn walked_engine(data_dir: &std::path::Path, database_url: Option<&str>) -> crate::store::Engine {
    match database_url {
        Some(url) => crate::store::Engine::Shared {
            url: url.to_string(),
            pool_size: 2,
            empty_only: false,
        },
        None => crate::store::Engine::Embedded {
            path: data_dir.to_path_buf(),
            cache_bytes: WALK_CACHE_BYTES,
            flush_hook: None,
            before_walk: None,
        },
    }
}

/// The async part of a command, on a runtime of its own.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    actix_web::rt::System::new().block_on(future)
}
