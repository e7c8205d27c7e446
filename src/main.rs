//! `orderly <command> [flags]`: parse the flags, start logging, run the command
//! (`orderly::commands`, one file each, each deciding its own exit status).

use clap::Parser;
use orderly::config::{Cli, Command};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // `copy` answers on stderr in one line when it refuses; its engines' routine info lines
    // (a migration applied, a flush on close) would only bury it.
    let quiet = matches!(cli.command, Command::Copy(_));
    orderly::logging::init(if quiet { "warn" } else { "info" });
    let code = orderly::commands::run(cli.command);
    orderly::logging::flush();
    code
}
