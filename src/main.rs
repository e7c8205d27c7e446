//! `orderly <command> [flags]`: parse the flags, start logging, run the command
//! (`src/commands/`, one file each, each deciding its own exit status).

use clap::Parser;
use orderly::{Cli, Command};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // `copy` answers on stderr in one line when it refuses; its engines' routine info lines
    // (a migration applied, a flush on close) would only bury it.
    let quiet = matches!(cli.command, Command::Copy(_));
    orderly::init_log(if quiet { "warn" } else { "info" });
    stop_on_a_broken_money_invariant();
    let code = orderly::run_command(cli.command);
    orderly::flush_log();
    code
}

/// A money invariant that does not hold (`src/domain/invariant.rs`) ends the process at
/// once with status 1, whichever thread found it: the write it guards is not made, and no
/// answer leaves after it, as after a failed flush. Other panics go on as before (a worker's
/// pass is caught and retried).
fn stop_on_a_broken_money_invariant() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with(orderly::INVARIANT_VIOLATED) {
            log::error!(
                "{message} ({}); stopping",
                info.location().map_or_else(String::new, |l| l.to_string())
            );
            orderly::flush_log();
            std::process::exit(1);
        }
        previous(info);
    }));
}
