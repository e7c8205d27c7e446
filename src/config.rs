//! Command-line flags, each with its `ORDERLY_*` environment twin. A bad value stops the
//! start with clap's one-line error and exit status 2.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::credentials::Named;

use crate::domain::cidr::Cidr;

#[derive(Debug, Parser)]
#[command(
    name = "orderly",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("ORDERLY_COMMIT"), ")"),
    about = "A B2B order server where a retry is always safe"
)]
/// The command line: one command and its flags.
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// What the binary was asked to do, with that command's flags.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP server.
    Serve(Box<Settings>),
    /// Print the number of rows in each keyspace of a stopped server's database.
    Stats(StatsArgs),
    /// Restore a backup (from GET /admin/backup) into an empty data directory or database.
    Restore(RestoreArgs),
    /// Check every account's ledger as a chain (each hash, seq, balance after, and the
    /// balance): a stopped server's sled store, a PostgreSQL database while instances run,
    /// or a backup file. Exit 0 when all of it holds, 1 naming each break.
    Verify(VerifyArgs),
    /// Apply the pending schema migrations to a PostgreSQL database, then exit.
    Migrate(MigrateArgs),
    /// Move a stopped sled deployment whole into an empty PostgreSQL database.
    Copy(CopyArgs),
}

/// The flags of `orderly copy`.
#[derive(Clone, Debug, Args)]
pub struct CopyArgs {
    /// The sled data directory of the deployment (no server may be running on it).
    #[arg(long)]
    pub(crate) from_data_dir: PathBuf,
    /// postgres://user:password@host:port/dbname: migrated first; its orderly tables must
    /// hold no rows.
    #[arg(long, hide_env_values = true)]
    pub(crate) to_database_url: String,
}

/// The flags of `orderly restore`.
#[derive(Clone, Debug, Args)]
pub struct RestoreArgs {
    /// The backup file.
    #[arg(long)]
    pub(crate) from: PathBuf,
    /// The sled data directory to create; it must not exist or be empty.
    #[arg(
        long,
        env = "ORDERLY_DATA_DIR",
        required_unless_present = "database_url",
        conflicts_with = "database_url"
    )]
    pub(crate) data_dir: Option<PathBuf>,
    /// Or a PostgreSQL database whose orderly tables hold no rows (migrated first).
    #[arg(long, hide_env_values = true)]
    pub(crate) database_url: Option<String>,
}

/// The flags of `orderly migrate`.
#[derive(Clone, Debug, Args)]
pub struct MigrateArgs {
    /// postgres://user:password@host:port/dbname (sslmode=disable|prefer|require).
    #[arg(long, env = "ORDERLY_DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: String,
}

/// The flags of `orderly verify`.
#[derive(Clone, Debug, Args)]
pub struct VerifyArgs {
    /// The sled database directory (the server must not be running on it).
    #[arg(long, env = "ORDERLY_DATA_DIR", default_value = "./data/db")]
    pub(crate) data_dir: PathBuf,
    /// Or a PostgreSQL database (instances may be running on it; read in one snapshot):
    /// postgres://user:password@host:port/dbname.
    #[arg(
        long,
        env = "ORDERLY_DATABASE_URL",
        hide_env_values = true,
        conflicts_with = "backup"
    )]
    pub(crate) database_url: Option<String>,
    /// Or a backup file (from GET /admin/backup): its digest and counts are checked too.
    #[arg(long)]
    pub(crate) backup: Option<PathBuf>,
}

/// The flags of `orderly stats`.
#[derive(Clone, Debug, Args)]
pub struct StatsArgs {
    /// The sled database directory (the server must not be running on it).
    #[arg(long, env = "ORDERLY_DATA_DIR", default_value = "./data/db")]
    pub(crate) data_dir: PathBuf,
    /// Or a PostgreSQL database (instances may be running on it; migrated first, as by
    /// `serve`): postgres://user:password@host:port/dbname.
    #[arg(long, env = "ORDERLY_DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
}

/// The flags of `orderly serve`: everything a server is configured by.
#[derive(Clone, Debug, Args)]
pub struct Settings {
    /// Address to bind.
    #[arg(long, env = "ORDERLY_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) listen: String,

    /// The sled database directory (unused with --database-url).
    #[arg(long, env = "ORDERLY_DATA_DIR", default_value = "./data/db")]
    pub(crate) data_dir: PathBuf,

    /// PostgreSQL instead of sled: postgres://user:password@host:port/dbname, with
    /// sslmode=disable|prefer|require; the schema is migrated before listening.
    #[arg(long, env = "ORDERLY_DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,

    /// Every request is answered within this of its arrival, whatever the storage does: a
    /// write not yet sent by then is dropped (503), one sent and not confirmed is the opaque
    /// 500 (its key decides the retry), a read is a 503.
    #[arg(long, env = "ORDERLY_REQUEST_DEADLINE", default_value = REQUEST_DEADLINE_FLAG_DEFAULT, value_parser = parse_positive_duration)]
    pub(crate) request_deadline: Duration,

    /// Writes waiting for the storage at once (queued or being committed); one more is
    /// answered 503 at once with nothing written.
    #[arg(long, env = "ORDERLY_MAX_PENDING_WRITES", default_value_t = crate::bounds::MAX_PENDING_WRITES, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_pending_writes: u32,

    /// Most connections held to PostgreSQL.
    #[arg(long, env = "ORDERLY_DATABASE_POOL_SIZE", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) database_pool_size: u32,

    /// Seed data/demo.json into an empty database and print the demo keys.
    #[arg(long, env = "ORDERLY_DEMO")]
    pub(crate) demo: bool,

    /// The one currency of this deployment (ISO 4217 code).
    #[arg(long, env = "ORDERLY_CURRENCY", default_value = "USD", value_parser = parse_currency)]
    pub(crate) currency: String,

    /// Bearer token for /admin/*, as NAME=TOKEN (a bare TOKEN is named `default`); repeated
    /// (or a comma list), any of them is accepted and the request's log line names the one
    /// used. Unset, with no --admin-token-file: the admin API answers 404.
    #[arg(
        long,
        env = "ORDERLY_ADMIN_TOKEN",
        hide_env_values = true,
        value_delimiter = ',',
        value_parser = Named::admin_token
    )]
    pub(crate) admin_token: Vec<Named>,

    /// A file of admin tokens, one NAME=TOKEN a line (# comments), beside --admin-token;
    /// SIGHUP reads it again (a file that does not parse keeps the tokens in force).
    #[arg(long, env = "ORDERLY_ADMIN_TOKEN_FILE")]
    pub(crate) admin_token_file: Option<PathBuf>,

    /// Comma list of exact origins allowed to send writes with an Origin header.
    #[arg(long, env = "ORDERLY_ALLOWED_ORIGINS", value_delimiter = ',', value_parser = parse_origin)]
    pub(crate) allowed_origins: Vec<String>,

    /// Requests per minute per client IP.
    #[arg(long, env = "ORDERLY_RATE_LIMIT", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rate_limit: u32,

    /// Repeated CIDR=N: another per-minute limit for clients in that network (most specific wins).
    #[arg(long, env = "ORDERLY_RATE_LIMIT_OVERRIDE", value_delimiter = ',')]
    pub(crate) rate_limit_override: Vec<RateLimitOverride>,

    /// Comma list of CIDRs whose X-Forwarded-For is believed.
    #[arg(long, env = "ORDERLY_TRUSTED_PROXIES", value_delimiter = ',')]
    pub(crate) trusted_proxies: Vec<Cidr>,

    /// Lifetime of idempotency rows.
    #[arg(long, env = "ORDERLY_IDEMPOTENCY_TTL", default_value = "24h", value_parser = parse_duration)]
    pub(crate) idempotency_ttl: Duration,

    /// How often expired idempotency rows are deleted.
    #[arg(long, env = "ORDERLY_SWEEP_INTERVAL", default_value = "1h", value_parser = parse_positive_duration)]
    pub(crate) sweep_interval: Duration,

    /// Simulated delivery time of an order.
    #[arg(long, env = "ORDERLY_FULFILLMENT_DELAY", default_value = "2s", value_parser = parse_duration)]
    pub(crate) fulfillment_delay: Duration,

    /// Delays between callback attempts.
    #[arg(
        long,
        env = "ORDERLY_WEBHOOK_RETRY_SCHEDULE",
        default_value = "5s,5m,30m,2h,5h,10h,10h",
        value_delimiter = ',',
        value_parser = parse_duration
    )]
    pub(crate) webhook_retry_schedule: Vec<Duration>,

    /// Most deliveries in flight at once to one origin (scheme, host, port).
    #[arg(long, env = "ORDERLY_WEBHOOK_ORIGIN_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) webhook_origin_concurrency: u32,

    /// After a webhook secret is rotated, how long the old one still signs beside the new.
    #[arg(long, env = "ORDERLY_WEBHOOK_SECRET_OVERLAP", default_value = "24h", value_parser = parse_duration)]
    pub(crate) webhook_secret_overlap: Duration,

    /// Development only: accept loopback/private callback hosts.
    #[arg(long, env = "ORDERLY_ALLOW_PRIVATE_CALLBACKS")]
    pub(crate) allow_private_callbacks: bool,

    /// Repeated name=secret: inbound payment providers and their HMAC secrets. A provider
    /// given twice accepts a signature by either secret (a rotation's overlap).
    #[arg(
        long,
        env = "ORDERLY_PROVIDER_SECRET",
        hide_env_values = true,
        value_delimiter = ',',
        value_parser = Named::provider_secret
    )]
    pub(crate) provider_secret: Vec<Named>,

    /// A file of provider secrets, one name=secret a line (# comments), beside
    /// --provider-secret; SIGHUP reads it again.
    #[arg(long, env = "ORDERLY_PROVIDER_SECRET_FILE")]
    pub(crate) provider_secret_file: Option<PathBuf>,

    /// Serve /metrics on this address (plain HTTP) instead of the API's listener, which then
    /// answers /metrics 404: scrapers on a private network, nothing of it on the public one.
    #[arg(long, env = "ORDERLY_METRICS_LISTEN")]
    pub(crate) metrics_listen: Option<String>,

    /// sled page-cache size in MiB: bounds the resident memory of the database. 32 by default:
    /// at a million orders 128 placed orders no faster and held 144 MiB more (scripts/scale.sh);
    /// what it misses the kernel's page cache serves.
    #[arg(long, env = "ORDERLY_CACHE_MB", default_value_t = 32)]
    pub(crate) cache_mb: u64,

    /// PEM certificate chain: serve HTTPS only (TLS 1.2 and 1.3); SIGHUP re-reads it.
    #[arg(long, env = "ORDERLY_TLS_CERT", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "ORDERLY_TLS_KEY", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
}

/// `bounds::REQUEST_DEADLINE` as the flag spells it (a unit test keeps the two equal).
pub(crate) const REQUEST_DEADLINE_FLAG_DEFAULT: &str = "10s";

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("{e} (use e.g. 90s, 1h, 24h)"))
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err("must be longer than zero".into()),
        d => Ok(d),
    }
}

/// An origin is compared as an exact string; spaces around a list item are not part of it.
fn parse_origin(text: &str) -> Result<String, String> {
    Ok(text.trim().to_string())
}

fn parse_currency(text: &str) -> Result<String, String> {
    if text.len() == 3 && text.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(text.to_string())
    } else {
        Err("must be a three-letter upper-case ISO 4217 code such as USD".into())
    }
}

/// `203.0.113.0/24=5000`.
#[derive(Clone, Debug)]
pub(crate) struct RateLimitOverride {
    pub(crate) network: Cidr,
    pub(crate) per_minute: u32,
}

impl FromStr for RateLimitOverride {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let (network, limit) = text
            .split_once('=')
            .ok_or("expected CIDR=N, e.g. 203.0.113.0/24=5000")?;
        let per_minute: u32 = limit
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or("the limit after = must be a whole number above zero")?;
        Ok(RateLimitOverride {
            network: network.trim().parse()?,
            per_minute,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> Result<Settings, clap::Error> {
        let argv = ["orderly", "serve"].iter().chain(args).copied();
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Serve(s) => *s,
            _ => unreachable!("serve was parsed"),
        })
    }

    #[test]
    fn the_default_deadline_parses_as_the_flag_takes_it() {
        assert_eq!(
            humantime::parse_duration(REQUEST_DEADLINE_FLAG_DEFAULT).unwrap(),
            crate::bounds::REQUEST_DEADLINE
        );
    }

    #[test]
    fn defaults_match_the_contract() {
        let s = serve(&[]).unwrap();
        assert_eq!(s.listen, "127.0.0.1:8080");
        assert_eq!(s.rate_limit, 500);
        assert_eq!(s.idempotency_ttl, Duration::from_secs(86_400));
        assert_eq!(s.webhook_retry_schedule.len(), 7);
        assert_eq!(s.currency, "USD");
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(serve(&["--idempotency-ttl", "soon"]).is_err());
        assert!(serve(&["--trusted-proxies", "10.0.0.0/33"]).is_err());
        assert!(serve(&["--provider-secret", "nosecret"]).is_err());
        assert!(serve(&["--rate-limit-override", "10.0.0.0/8"]).is_err());
        assert!(serve(&["--currency", "usd"]).is_err());
    }

    #[test]
    fn repeated_overrides_are_kept() {
        let s = serve(&[
            "--rate-limit-override",
            "203.0.113.0/24=5000",
            "--rate-limit-override",
            "10.0.0.0/8=50",
        ])
        .unwrap();
        assert_eq!(s.rate_limit_override.len(), 2);
    }

    #[test]
    fn admin_tokens_are_named_and_repeatable() {
        let s = serve(&["--admin-token", "old=aaa", "--admin-token", "bbb"]).unwrap();
        let names: Vec<&str> = s.admin_token.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["old", "default"]);
        let s = serve(&["--admin-token", "a=x,b=y"]).unwrap();
        assert_eq!(s.admin_token.len(), 2);
        assert!(serve(&["--admin-token", ""]).is_err());
    }
}
