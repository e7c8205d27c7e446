//! `orderly serve [flags]`: build the application, print where it listens, run it until it
//! stops. A storage failure ends the process with status 1 at once (the rest of the process
//! is not waited for: it may hold work that must not touch storage again); a schema newer
//! than the binary, or a certificate that cannot be used, is a usage error (2).

use std::process::ExitCode;

use crate::config::Settings;
use crate::startup::{Application, RunError, StartupError};
use crate::store::{postgres as shared, OpenError};

/// How the server ended, when it did not end well.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeFailure {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error(transparent)]
    Run(#[from] RunError),
}

impl ServeFailure {
    /// A database that cannot be used as given (unreachable, the login refused, read-only,
    /// behind a pooler that allows no transactions): the operator's to fix, said in one line.
    fn database_refused(&self) -> Option<&shared::OpenError> {
        match self {
            ServeFailure::Startup(StartupError::Store(OpenError::Shared(
                why @ (shared::OpenError::Database(_) | shared::OpenError::Config(_)),
            ))) => Some(why),
            _ => None,
        }
    }

    /// A schema, or a sled store, written by a newer orderly, or a sled store missing a file
    /// it needs: what it says.
    fn store_too_new(&self) -> Option<String> {
        match self {
            ServeFailure::Startup(StartupError::Store(OpenError::Shared(
                why @ shared::OpenError::SchemaTooNew(_),
            ))) => Some(why.to_string()),
            ServeFailure::Startup(StartupError::Store(why @ OpenError::EmbeddedRefused { .. })) => {
                Some(why.to_string())
            }
            _ => None,
        }
    }
}

pub(crate) fn run(settings: Settings) -> ExitCode {
    let outcome = super::block_on(async move {
        let app = Application::build(settings).await?;
        // Tests and scripts read the bound address (port 0 picks a free one) from here.
        if let Some(metrics) = app.metrics_url() {
            println!("orderly metrics on {metrics}");
        }
        println!("orderly listening on {}", app.url());
        app.run_until_stopped().await?;
        // Exits here rather than after the runtime is dropped: dropping it waits for every
        // blocking task (a lookup of a database host that stopped answering among them),
        // which would hold the exit past the stop's bound.
        crate::logging::flush();
        std::process::exit(0)
    });
    let Err(failure): Result<std::convert::Infallible, ServeFailure> = outcome;
    // A schema or a store newer than this binary: one line, and the usage status.
    if let Some(why) = failure.store_too_new() {
        eprintln!("orderly: {why}");
        return ExitCode::from(2);
    }
    if let Some(why) = failure.database_refused() {
        crate::logging::flush();
        eprintln!("orderly: PostgreSQL: {why}");
        return ExitCode::FAILURE;
    }
    log::error!("{failure}");
    eprintln!("orderly: {failure}");
    match failure {
        ServeFailure::Run(RunError::StorageFailed(_) | RunError::Unsettled(_)) => {
            crate::logging::flush();
            std::process::exit(1);
        }
        // Configuration that cannot be used is a usage error, like a bad flag.
        ServeFailure::Startup(StartupError::Tls(_) | StartupError::Credentials(_)) => {
            ExitCode::from(2)
        }
        _ => ExitCode::FAILURE,
    }
}
