//! Flags (each with an `ORDERLY_CLIENT_*` twin), the four commands, one JSON line per intent
//! on stdout, and the exit codes of client/README.md: 0 when every printed intent is placed,
//! 1 otherwise, 2 for bad usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use orderly_client::{Basket, Client, Config, IntentId, Journal, Outcome};
use serde_json::Value;

use crate::failure::Failure;

#[derive(Parser)]
#[command(
    name = "orderly-client",
    version,
    about = "Place orders with orderly so that a retry is always safe"
)]
struct Cli {
    #[command(flatten)]
    settings: Settings,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Settings {
    /// Base URL of the orderly server.
    #[arg(
        long,
        env = "ORDERLY_CLIENT_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    url: String,
    /// Partner API key (gc_live_…) with orders:write and orders:read.
    #[arg(
        long,
        env = "ORDERLY_CLIENT_API_KEY",
        hide_env_values = true,
        global = true
    )]
    api_key: Option<String>,
    /// The intent journal (created when absent; may be shared by several processes).
    #[arg(
        long,
        env = "ORDERLY_CLIENT_JOURNAL",
        default_value = "./orderly-client.journal",
        global = true
    )]
    journal: PathBuf,
    /// Attempts per intent and run before the outcome is `unknown`.
    #[arg(long, env = "ORDERLY_CLIENT_MAX_ATTEMPTS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..), global = true)]
    max_attempts: u32,
    /// Time per intent and run before the outcome is `unknown`.
    #[arg(long, env = "ORDERLY_CLIENT_MAX_TIME", default_value = "10m", value_parser = humantime::parse_duration, global = true)]
    max_time: Duration,
    /// Timeout of one attempt.
    #[arg(long, env = "ORDERLY_CLIENT_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration, global = true)]
    timeout: Duration,
    /// Age past which an intent is never re-sent, only looked up by externalOrderId (the
    /// server's key lifetime less a margin).
    #[arg(long, env = "ORDERLY_CLIENT_HORIZON", default_value = "23h", value_parser = humantime::parse_duration, global = true)]
    horizon: Duration,
}

#[derive(Subcommand)]
enum Command {
    /// Journal an intent, then place it (an intent already finished prints its outcome).
    Place {
        /// Your name for this order (one checkout); also sent as externalOrderId.
        #[arg(long)]
        intent: String,
        /// The order body: `items` and an optional `callbackUrl`.
        #[arg(long)]
        basket: PathBuf,
    },
    /// Send every pending intent again, with its own key and bytes.
    Resume,
    /// Print the journaled outcome of one intent, or of all; sends nothing.
    Status {
        /// The intent id (all intents when absent).
        intent: Option<String>,
    },
    /// Verify the account's ledger as a chain onto what this client verified before (kept
    /// beside the journal): one JSON line with the head; exit 3 on a divergence.
    Ledger {
        /// The account's id (acc_…), which every entry's hash covers.
        #[arg(long, env = "ORDERLY_CLIENT_ACCOUNT")]
        account: String,
        /// Fetch and verify every entry again, each kept one against its kept hash.
        #[arg(long)]
        from_start: bool,
    },
    /// Receive orderly's signed callbacks and run CMD once per event.
    Receive {
        /// Address to listen on, e.g. 127.0.0.1:8081.
        #[arg(long, env = "ORDERLY_CLIENT_LISTEN")]
        listen: String,
        /// The account's webhook secret (whsec_…).
        #[arg(long, env = "ORDERLY_CLIENT_SECRET", hide_env_values = true)]
        secret: String,
        /// Where done event ids are kept (one receiving process owns it).
        #[arg(
            long,
            env = "ORDERLY_CLIENT_INBOX",
            default_value = "./orderly-client.inbox"
        )]
        inbox: PathBuf,
        /// The command to run, the event on its standard input.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
}

pub fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let Command::Ledger {
        account,
        from_start,
    } = &cli.command
    {
        return ledger(&cli.settings, account, *from_start);
    }
    let result = match cli.command {
        Command::Place { intent, basket } => place(&cli.settings, &intent, &basket),
        Command::Resume => resume(&cli.settings),
        Command::Status { intent } => status(&cli.settings, intent.as_deref()),
        Command::Receive {
            listen,
            secret,
            inbox,
            command,
        } => crate::receive::run(&listen, &secret, &inbox, command).map(|()| Vec::new()),
        Command::Ledger { .. } => unreachable!("answered above"),
    };
    match result {
        Ok(outcomes) => {
            for outcome in &outcomes {
                println!("{}", outcome.to_line());
            }
            if outcomes.iter().all(Outcome::is_placed) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(failure) => failed(failure),
    }
}

/// `ledger`: the verified head as one JSON line (exit 0); a divergence as one JSON line
/// `{"account","divergence":{"firstSeq","what"}}` (exit 3); anything else on stderr (exit 1,
/// or 2 for bad usage).
fn ledger(settings: &Settings, account: &str, from_start: bool) -> ExitCode {
    let verified = client(settings).map(|c| c.verify_ledger(account, from_start));
    match verified {
        Ok(Ok(head)) => {
            println!(
                "{}",
                serde_json::to_string(&head).expect("a head serializes")
            );
            ExitCode::SUCCESS
        }
        Ok(Err(orderly_client::LedgerError::Divergence {
            account,
            first_seq,
            what,
        })) => {
            let line = serde_json::json!({
                "account": account,
                "divergence": {"firstSeq": first_seq, "what": what},
            });
            println!("{line}");
            ExitCode::from(3)
        }
        Ok(Err(other)) => failed(Failure::Runtime(other.to_string())),
        Err(failure) => failed(failure),
    }
}

/// A failure said on stderr, and its exit status: 2 for bad usage, 1 otherwise.
fn failed(failure: Failure) -> ExitCode {
    let (message, code) = match failure {
        Failure::Usage(message) => (message, 2),
        Failure::Runtime(message) => (message, 1),
    };
    eprintln!("orderly-client: {message}");
    ExitCode::from(code)
}

fn client(settings: &Settings) -> Result<Client, Failure> {
    let api_key = settings.api_key.clone().ok_or_else(|| {
        Failure::Usage("--api-key (or ORDERLY_CLIENT_API_KEY) is required".into())
    })?;
    let mut config = Config::new(settings.url.clone(), api_key);
    config.timeout = settings.timeout;
    config.max_attempts = settings.max_attempts;
    config.max_time = settings.max_time;
    config.horizon = settings.horizon;
    Ok(Client::new(config, Journal::open(&settings.journal)?))
}

fn place(settings: &Settings, intent: &str, basket: &Path) -> Result<Vec<Outcome>, Failure> {
    let id = IntentId::parse(intent).map_err(|e| Failure::Usage(e.to_string()))?;
    let basket = read_basket(basket, &id)?;
    let client = client(settings)?;
    Ok(vec![client.place_order(intent, &basket)?])
}

fn read_basket(path: &Path, intent: &IntentId) -> Result<Basket, Failure> {
    let usage = |why: String| Failure::Usage(format!("basket {}: {why}", path.display()));
    let text = std::fs::read(path).map_err(|e| usage(e.to_string()))?;
    let value: Value = serde_json::from_slice(&text).map_err(|e| usage(e.to_string()))?;
    if let Some(external) = value.get("externalOrderId") {
        if external.as_str() != Some(intent.as_str()) {
            return Err(usage(
                "externalOrderId is set by the client to the intent id; leave it out".into(),
            ));
        }
    }
    serde_json::from_value(value).map_err(|e| usage(e.to_string()))
}

fn resume(settings: &Settings) -> Result<Vec<Outcome>, Failure> {
    Ok(client(settings)?.resume()?)
}

/// Reads the journal only: no client is built, so nothing can be sent.
fn status(settings: &Settings, intent: Option<&str>) -> Result<Vec<Outcome>, Failure> {
    if !settings.journal.exists() {
        return match intent {
            Some(id) => Err(Failure::Runtime(format!("no intent {id} in the journal"))),
            None => Ok(Vec::new()),
        };
    }
    let journal = Journal::open(&settings.journal)?;
    match intent {
        Some(id) => match journal.get(id)? {
            Some(entry) => Ok(vec![entry.to_outcome()]),
            None => Err(Failure::Runtime(format!("no intent {id} in the journal"))),
        },
        None => Ok(journal.entries()?.iter().map(|e| e.to_outcome()).collect()),
    }
}
