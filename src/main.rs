//! `orderly serve [flags]`: parse flags, start logging, build the application, run it.
//! A storage failure ends the process with status 1 at once (the rest of the process is not
//! waited for: it may hold work that must not touch storage again).

use clap::Parser;
use orderly::config::{Cli, Command};
use orderly::startup::{Application, RunError, StartupError};
use orderly::store::postgres as shared;
use orderly::store::{Engine, OpenError};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // `copy` answers on stderr in one line when it refuses; its engines' routine info lines
    // (a migration applied, a flush on close) would only bury it.
    let quiet = matches!(cli.command, Command::Copy(_));
    orderly::logging::init(if quiet { "warn" } else { "info" });
    let code = run(cli);
    orderly::logging::flush();
    code
}

fn run(cli: Cli) -> std::process::ExitCode {
    let settings = match cli.command {
        Command::Serve(settings) => *settings,
        Command::Stats(args) => return print_stats(&args),
        Command::Restore(args) => return restore(&args),
        Command::Migrate(args) => return migrate(&args.database_url),
        Command::Copy(args) => return copy(&args),
    };
    let outcome = actix_web::rt::System::new().block_on(async move {
        let app = Application::build(settings).await?;
        // Tests and scripts read the bound address (port 0 picks a free one) from here.
        println!("orderly listening on {}", app.url());
        app.run_until_stopped().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // A schema newer than this binary: one line, and the usage status.
            if let Some(StartupError::Store(OpenError::Shared(
                why @ shared::OpenError::SchemaTooNew(_),
            ))) = e.downcast_ref::<StartupError>()
            {
                eprintln!("orderly: {why}");
                return std::process::ExitCode::from(2);
            }
            log::error!("{e}");
            eprintln!("orderly: {e}");
            if e.downcast_ref::<RunError>()
                .is_some_and(|e| matches!(e, RunError::StorageFailed(_)))
            {
                orderly::logging::flush();
                std::process::exit(1);
            }
            // Configuration that cannot be used is a usage error, like a bad flag.
            if e.downcast_ref::<StartupError>()
                .is_some_and(|e| matches!(e, StartupError::Tls(_)))
            {
                return std::process::ExitCode::from(2);
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// `orderly restore`: one JSON object of counts per kind on stdout, exit 0; or one line on
/// stderr and exit 1, with nothing written.
fn restore(args: &orderly::config::RestoreArgs) -> std::process::ExitCode {
    let restored = actix_web::rt::System::new().block_on(orderly::restore::run(args));
    report_counts("restore", restored)
}

/// The counts on stdout as one JSON object and exit 0, or one line on stderr and exit 1.
fn report_counts(
    what: &str,
    outcome: Result<impl serde::Serialize, impl std::fmt::Display>,
) -> std::process::ExitCode {
    match outcome {
        Ok(counts) => {
            println!(
                "{}",
                serde_json::to_string(&counts).expect("counts serialize")
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("orderly: {what} refused: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `orderly copy`: one JSON object of counts per kind on stdout, exit 0; or one line on
/// stderr and exit 1, the target untouched.
fn copy(args: &orderly::config::CopyArgs) -> std::process::ExitCode {
    let copied = actix_web::rt::System::new().block_on(orderly::copy::run(
        &args.from_data_dir,
        &args.to_database_url,
    ));
    report_counts("copy", copied)
}

/// `orderly migrate`: the pending migrations applied, one line on stdout, exit 0; a schema
/// newer than this binary is exit 2, any other failure exit 1, each with one line on stderr.
fn migrate(url: &str) -> std::process::ExitCode {
    match actix_web::rt::System::new().block_on(shared::migrate(url)) {
        Ok(applied) => {
            println!("orderly: schema up to date (applied now: {applied:?})");
            std::process::ExitCode::SUCCESS
        }
        Err(e @ shared::OpenError::SchemaTooNew(_)) => {
            eprintln!("orderly: {e}");
            std::process::ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("orderly: migrate failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `orderly stats`: rows per keyspace (sled trees or PostgreSQL tables), one per line.
fn print_stats(args: &orderly::config::StatsArgs) -> std::process::ExitCode {
    let engine = match &args.database_url {
        Some(url) => Engine::Shared {
            url: url.clone(),
            pool_size: 2,
        },
        None => Engine::Embedded {
            path: args.data_dir.clone(),
            cache_bytes: 16 << 20,
            flush_hook: None,
        },
    };
    let counted = actix_web::rt::System::new().block_on(async {
        let store = orderly::store::open(engine, Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let counts = store.row_counts().await;
        store.stop().await;
        counts.map_err(|e| e.to_string())
    });
    match counted {
        Ok(counts) => {
            for (keyspace, rows) in counts {
                println!("{keyspace}\t{rows}");
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("orderly: stats: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
