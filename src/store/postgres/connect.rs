//! From `--database-url` to a pool: the URL as libpq reads it (`postgres://` or
//! `postgresql://`, `sslmode=disable|prefer|require`), TLS through rustls, and a pool that
//! drops closed connections and opens new ones by itself, so a database that comes back is
//! used again without a restart.
//!
//! Every connection's socket and task live on the engine's own runtime. Left to the pool's
//! default, a connection is driven by whichever runtime first opened it: one opened by the
//! startup thread would then stall a worker that borrowed it while that thread waits (as it
//! does at shutdown, joining the workers), and the process would never exit.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    Connect, Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime,
};
use futures_util::future::BoxFuture;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring, verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::error::SqlState;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tx::Reach;
use crate::bounds::{CONNECT_TIMEOUT, DEAD_LINK_AFTER, DEAD_LINK_PROBE_AFTER};

/// What stops orderly before it has tried to connect: the URL, or this process's machinery.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Not a postgres:// or postgresql:// URL.
    #[error("the database URL must start with postgres:// or postgresql://")]
    Scheme,
    /// The driver refused the URL.
    #[error("the database URL cannot be used: {0}")]
    Url(tokio_postgres::Error),
    /// The engine's own runtime could not be started.
    #[error("cannot start the database runtime: {0}")]
    Runtime(std::io::Error),
    /// The connection pool could not be built.
    #[error("cannot build the connection pool: {0}")]
    Pool(deadpool_postgres::BuildError),
}

/// The configuration of orderly's connections, from the database URL's settings checked;
/// every connection of one process carries `application_name`, which names the process to an
/// operator looking at `pg_stat_activity` (no instance judges another by it: see `outbox.rs`).
pub(super) fn config(
    url: &str,
    application_name: &str,
) -> Result<tokio_postgres::Config, ConnectError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(ConnectError::Scheme);
    }
    let mut config = tokio_postgres::Config::from_str(url).map_err(ConnectError::Url)?;
    config
        .connect_timeout(CONNECT_TIMEOUT)
        // A peer gone silent (packets dropped, a machine lost) is given up at
        // DEAD_LINK_AFTER rather than after TCP's minutes of retransmissions.
        .keepalives(true)
        .keepalives_idle(DEAD_LINK_PROBE_AFTER)
        .keepalives_interval(Duration::from_secs(1))
        .keepalives_retries(3)
        .tcp_user_timeout(DEAD_LINK_AFTER)
        // Nothing else is set for the session: behind a pooler a setting would stay with the
        // server session, not with orderly (and PgBouncer refuses `options` at the door).
        // What orderly relies on, each transaction sets for itself (`db::Gate::limit_waits`,
        // `tx::alone`).
        .application_name(application_name);
    Ok(config)
}

/// The database `url` names, as an operator would look for it (hosts, ports and database;
/// never the password).
pub(super) fn target(url: &str) -> String {
    let Ok(config) = tokio_postgres::Config::from_str(url) else {
        return "the database".into();
    };
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(host, port)| match host {
            tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
            tokio_postgres::config::Host::Unix(path) => format!("{}:{port}", path.display()),
        })
        .collect();
    let database = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("the database {database} at {}", hosts.join(","))
}

/// Why no connection could be opened, in one line an operator can act on (never tokio's
/// bare "db error"): unreachable, a refused login, a missing database, a startup parameter
/// a pooler refuses, too many connections, a server starting or stopping.
pub(super) fn cannot_connect(e: &deadpool_postgres::PoolError, url: &str) -> String {
    let target = target(url);
    let e = match e {
        deadpool_postgres::PoolError::Backend(e)
        | deadpool_postgres::PoolError::PostCreateHook(HookError::Backend(e)) => e,
        deadpool_postgres::PoolError::Timeout(_) => {
            return format!(
                "{target} did not accept a connection within {} s: check that it runs and that this machine reaches it",
                CONNECT_TIMEOUT.as_secs()
            )
        }
        other => return format!("cannot connect to {target}: {other}"),
    };
    let Some(db) = e.as_db_error() else {
        let cause = std::error::Error::source(e).map_or(String::new(), |c| format!(": {c}"));
        return format!(
            "cannot reach {target} ({e}{cause}): check the host and port, and that it runs and accepts connections from this machine"
        );
    };
    let said = db.message();
    match db.code() {
        c if *c == SqlState::INVALID_PASSWORD
            || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            format!("{target} refused the login ({said}): check the user and password in --database-url, and the server's pg_hba.conf")
        }
        c if *c == SqlState::INVALID_CATALOG_NAME => {
            format!(
                "{target} does not exist ({said}): create it, or name another in --database-url"
            )
        }
        c if *c == SqlState::PROTOCOL_VIOLATION && said.contains("statement pooling mode") => {
            statement_mode(&target, said)
        }
        c if *c == SqlState::PROTOCOL_VIOLATION && said.contains("startup parameter") => {
            format!("a connection pooler in front of {target} refused a startup parameter ({said}): orderly needs none, so take it out of --database-url, or add it to the pooler's ignore_startup_parameters")
        }
        c if *c == SqlState::TOO_MANY_CONNECTIONS => {
            format!("{target} has no connection left ({said}): raise its max_connections (or the pooler's pool size), or lower --database-pool-size")
        }
        c if *c == SqlState::CANNOT_CONNECT_NOW => {
            format!("{target} does not take connections now ({said}): it is starting, stopping or recovering")
        }
        c => format!(
            "{target} refused the connection: database error {}: {said}",
            c.code()
        ),
    }
}

/// A pooler that allows no transaction, as the operator fixes it.
fn statement_mode(target: &str, said: &str) -> String {
    format!("a connection pooler in front of {target} runs in statement pooling mode, where a transaction cannot run ({said}): set its pool_mode to transaction or session")
}

/// The oldest server orderly supports (`server_version_num`): PostgreSQL 14.
const OLDEST_SERVER: u32 = 140_000;

/// Refuses a database that cannot take writes (a standby given alone, or a read-only
/// default), with what to give orderly instead, and a pooler that allows no transactions
/// (PgBouncer's `statement` mode): it asks inside a transaction of its own, opened by a
/// message of its own, as every write of orderly's is. And a server older than the oldest
/// orderly supports.
pub(super) async fn writable(client: &deadpool_postgres::Object, url: &str) -> Result<(), String> {
    let refused = |e: tokio_postgres::Error| match e.as_db_error() {
        Some(db) if db.message().contains("statement pooling mode") => {
            statement_mode(&target(url), db.message())
        }
        _ => format!("{}: {}", target(url), super::tx::describe(&e)),
    };
    client.simple_query("BEGIN").await.map_err(refused)?;
    let shown = client
        .simple_query("SHOW transaction_read_only; SHOW server_version_num")
        .await
        .map_err(refused)?;
    client.simple_query("COMMIT").await.map_err(refused)?;
    let mut rows = shown.iter().filter_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0),
        _ => None,
    });
    let read_only = rows.next() == Some("on");
    let version: u32 = rows.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    if version < OLDEST_SERVER {
        return Err(format!(
            "{} runs PostgreSQL with server_version_num {}; orderly supports PostgreSQL 14 or newer",
            target(url),
            version
        ));
    }
    if read_only {
        return Err(format!(
            "{} is read-only (a standby, or default_transaction_read_only): give orderly the primary, or every host with target_session_attrs=read-write",
            target(url)
        ));
    }
    Ok(())
}

/// The runtime that drives every connection's I/O, stopped when the pool goes.
struct IoRuntime(Option<tokio::runtime::Runtime>);

impl Drop for IoRuntime {
    fn drop(&mut self) {
        // Never blocks: the pool may be dropped inside another runtime.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Opens connections on the engine's own runtime.
#[derive(Clone)]
struct OnOwnRuntime {
    tls: MakeRustlsConnect,
    handle: tokio::runtime::Handle,
    _runtime: Arc<IoRuntime>,
}

impl Connect for OnOwnRuntime {
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        let (config, tls) = (pg_config.clone(), self.tls.clone());
        let opened = self.handle.spawn(async move {
            let (client, connection) = config.connect(tls).await?;
            let task = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    log::warn!("database connection closed: {}", super::tx::describe(&e));
                }
            });
            Ok((client, task))
        });
        Box::pin(async move {
            match opened.await {
                Ok(outcome) => outcome,
                // Only while the engine stops: report it as a connection that could not open.
                Err(_) => Err(tokio_postgres::Config::new()
                    .connect(tokio_postgres::NoTls)
                    .await
                    .err()
                    .expect("a configuration without a host does not connect")),
            }
        })
    }
}

/// A pool of up to `size` connections.
pub(super) fn pool(config: tokio_postgres::Config, size: usize) -> Result<Pool, ConnectError> {
    Ok(pools(config, &[size])?.remove(0))
}

/// Pools of up to `sizes` connections each, driven by one runtime: the engine's pool, and the
/// rate limiter's and the cache lease's connections of their own.
pub(super) fn pools(
    config: tokio_postgres::Config,
    sizes: &[usize],
) -> Result<Vec<Pool>, ConnectError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("orderly-postgres")
        .enable_all()
        .build()
        .map_err(ConnectError::Runtime)?;
    let handle = runtime.handle().clone();
    let hosts = Arc::new(endpoints(&config));
    let connect = OnOwnRuntime {
        tls: tls(),
        handle,
        _runtime: Arc::new(IoRuntime(Some(runtime))),
    };
    sizes
        .iter()
        .map(|&size| {
            let manager = Manager::from_connect(
                config.clone(),
                connect.clone(),
                ManagerConfig {
                    // A connection the server closed is noticed and replaced; a live one
                    // costs nothing.
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            let hosts = Arc::clone(&hosts);
            Pool::builder(manager)
                .post_create(Hook::async_fn(move |client, _| {
                    let hosts = Arc::clone(&hosts);
                    Box::pin(async move {
                        let reach = reach(client, &hosts).await.map_err(HookError::Backend)?;
                        super::tx::statements_on(reach);
                        Ok(())
                    })
                }))
                .max_size(size.max(1))
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(CONNECT_TIMEOUT))
                .create_timeout(Some(CONNECT_TIMEOUT))
                .recycle_timeout(Some(CONNECT_TIMEOUT))
                .build()
                .map_err(ConnectError::Pool)
        })
        .collect()
}

/// The hosts and ports the URL names, as written (`hostaddr` too): what a connection that
/// reaches the server directly finds the server listening on.
fn endpoints(config: &tokio_postgres::Config) -> Vec<(String, u16)> {
    let ports = config.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let mut endpoints: Vec<(String, u16)> = config
        .get_hosts()
        .iter()
        .enumerate()
        .filter_map(|(i, host)| match host {
            tokio_postgres::config::Host::Tcp(name) => Some((name.clone(), port(i))),
            // A Unix socket: the server cannot say whose it is (see `reached_directly`).
            tokio_postgres::config::Host::Unix(_) => None,
        })
        .collect();
    endpoints.extend(
        config
            .get_hostaddrs()
            .iter()
            .enumerate()
            .map(|(i, addr)| (addr.to_string(), port(i))),
    );
    endpoints
}

/// How this connection reaches PostgreSQL, for its statements (`tx::Reach`).
async fn reach(
    client: &tokio_postgres::Client,
    hosts: &[(String, u16)],
) -> Result<Reach, tokio_postgres::Error> {
    if reached_directly(client, hosts).await? {
        return Ok(Reach::Direct);
    }
    Ok(if pooler_keeps_statements(client).await? {
        Reach::PoolerKeepsStatements
    } else {
        Reach::Pooled
    })
}

/// Whether what stands between this connection and PostgreSQL keeps named statements itself,
/// proved rather than configured: inside one transaction (which a transaction pooler serves
/// on one server session) this client prepares a statement of a text of its own under the
/// name its driver gives (`s` and a number) and asks the server under which name that
/// session holds it. A pooler that keeps statements (PgBouncer 1.21 and newer,
/// `max_prepared_statements` above 0) prepares it on the server under a name of its own
/// (`PGBOUNCER_…`); one that passes names through (older PgBouncer, or the feature off)
/// leaves the driver's, as does PostgreSQL itself behind a socket or proxy. Anything
/// unclear counts as passing names through, which only costs the statements' reuse. The
/// statement is closed inside the transaction, which is rolled back: nothing is left on the
/// server session.
async fn pooler_keeps_statements(
    client: &tokio_postgres::Client,
) -> Result<bool, tokio_postgres::Error> {
    let text = format!(
        "SELECT 1 AS orderly_probe_{}",
        uuid::Uuid::new_v4().simple()
    );
    let probed = async {
        client.batch_execute("BEGIN").await?;
        let statement = client.prepare(&text).await?;
        let names = client
            .simple_query(&format!(
                "SELECT name FROM pg_prepared_statements WHERE statement = '{text}'"
            ))
            .await;
        // Dropping it sends its Close at once, ahead of the ROLLBACK, on the same session.
        drop(statement);
        let names: Vec<String> = names?
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        Ok::<_, tokio_postgres::Error>(renamed_by_a_pooler(&names))
    }
    .await;
    // A pooler in statement mode refuses the BEGIN and closes the connection: that refusal
    // is the error (`cannot_connect` names the pool mode to set), not the ROLLBACK's.
    let rolled_back = client.batch_execute("ROLLBACK").await;
    let renamed = probed?;
    rolled_back.map(|_| renamed)
}

/// The server holds the probe under one name only, and not a driver's (`s` and digits).
fn renamed_by_a_pooler(names: &[String]) -> bool {
    let drivers = |name: &str| {
        name.strip_prefix('s')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    matches!(names, [name] if !drivers(name))
}

/// Whether this connection reaches PostgreSQL itself, with nothing in between that could
/// hand its server session to someone else: the address and port the server says it serves
/// it on are one of the URL's. Behind a pooler (or any proxy, or a port mapped elsewhere) the
/// server serves the pooler's connection on an address and port of its own, and behind a Unix
/// socket it cannot say: both count as not direct, which only costs the statements' reuse.
/// Asked with the simple protocol, which every pooler forwards.
async fn reached_directly(
    client: &tokio_postgres::Client,
    hosts: &[(String, u16)],
) -> Result<bool, tokio_postgres::Error> {
    let messages = client
        .simple_query("SELECT host(inet_server_addr()), inet_server_port()")
        .await?;
    let Some((Some(addr), Some(port))) = messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some((row.get(0), row.get(1))),
        _ => None,
    }) else {
        return Ok(false);
    };
    let (Ok(addr), Ok(port)) = (addr.parse::<std::net::IpAddr>(), port.parse::<u16>()) else {
        return Ok(false);
    };
    for (host, host_port) in hosts {
        if *host_port != port {
            continue;
        }
        if let Ok(mut resolved) = tokio::net::lookup_host((host.as_str(), port)).await {
            if resolved.any(|a| a.ip() == addr) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// TLS for `sslmode=prefer` and `require`. As with libpq without a root certificate, the
/// connection is encrypted and the server's signature checked, but its certificate chain is
/// not verified.
pub(super) fn tls() -> MakeRustlsConnect {
    let provider = Arc::new(ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
        .with_no_client_auth();
    MakeRustlsConnect::new(config)
}

#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_probe_held_under_a_name_not_the_drivers_was_renamed_by_a_pooler() {
        let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert!(renamed_by_a_pooler(&names(&["PGBOUNCER_17"])));
        assert!(!renamed_by_a_pooler(&names(&["s42"])));
        assert!(!renamed_by_a_pooler(&names(&[])));
        assert!(!renamed_by_a_pooler(&names(&["PGBOUNCER_1", "s3"])));
    }

    use super::*;

    #[test]
    fn both_schemes_and_the_three_ssl_modes_are_accepted() {
        for url in [
            "postgres://u:p@127.0.0.1:5432/db",
            "postgresql://u@localhost/db?sslmode=disable",
            "postgres://u@localhost/db?sslmode=prefer",
            "postgres://u@localhost/db?sslmode=require",
        ] {
            assert!(config(url, "orderly").is_ok(), "{url}");
        }
    }

    #[test]
    fn the_endpoints_are_each_host_with_its_port_or_the_one_port_given() {
        let hosts = |url: &str| endpoints(&config(url, "orderly").unwrap());
        assert_eq!(
            hosts("postgresql://u@db1:5432,db2:5433/db?target_session_attrs=read-write"),
            [("db1".to_string(), 5432), ("db2".to_string(), 5433)]
        );
        assert_eq!(
            hosts("postgresql://u@db1,db2/db"),
            [("db1".to_string(), 5432), ("db2".to_string(), 5432)]
        );
        assert_eq!(
            hosts("postgresql://u@127.0.0.1:6432/db"),
            [("127.0.0.1".to_string(), 6432)]
        );
    }

    #[test]
    fn other_urls_are_refused() {
        assert!(config("mysql://u@localhost/db", "orderly").is_err());
        assert!(config("postgres://u@localhost/db?sslmode=sometimes", "orderly").is_err());
    }
}
