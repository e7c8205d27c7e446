//! The application: storage, what each part of the HTTP surface needs (one `web::Data` per
//! concern), the route table, background workers, and the two ways it ends: an orderly
//! shutdown (stop accepting, answer in-flight requests, flush, exit 0; within
//! `bounds::STOP_WITHIN` whatever the storage does, exit 1 when writes were left in flight),
//! or a storage failure (stop at once, exit 1: nothing in memory can be trusted to match the
//! disk any more).

pub(crate) mod demo;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::middleware::from_fn;
use actix_web::{web, App, HttpServer};
use futures_util::future::{select, Either};

use crate::api;
use crate::bounds::{Deadline, EDGE_MARGIN, STOP_WITHIN};
use crate::config::Settings;
use crate::credentials::{Credentials, CredentialsError, Source};
use crate::edge::deadline::stamp_deadline;
use crate::edge::metrics_listener::{split_metrics, MetricsListener};
use crate::edge::origin::check_origin;
use crate::edge::rate_limit::{limit_rate, RateLimits};
use crate::edge::request_log::log_requests;
use crate::edge::request_metrics::count_requests;
use crate::metrics::Metrics;
use crate::store::sled as embedded;
use crate::store::{self, Engine, OpenError, Stopped, Store};
use crate::tls::ReloadingCert;
use crate::workers::webhooks::{self, WebhookSender};
use crate::workers::{fulfillment, pruner, sweeper, Periodic, StopSignal};

/// Why a server could not start; nothing was served.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// Its message names the engine: "cannot open the database in …" or "PostgreSQL: …".
    #[error(transparent)]
    Store(#[from] OpenError),
    /// The listen address could not be bound.
    #[error("cannot bind {0}: {1}")]
    Bind(String, std::io::Error),
    /// The demo data could not be loaded.
    #[error("{0}")]
    Demo(#[from] demo::DemoError),
    /// An I/O error while starting.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The HTTP client that sends callbacks could not be built.
    #[error("cannot build the webhook client: {0}")]
    Webhooks(String),
    /// The certificate or key cannot be used: a configuration error, like a bad flag.
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
    /// An admin token or provider secret (or their file) cannot be used: a configuration
    /// error, like a bad flag.
    #[error("{0}")]
    Credentials(#[from] CredentialsError),
}

/// How the server ended, when it did not end well.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// An I/O error of the HTTP server.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Storage failed; the process must exit non-zero without touching it again.
    #[error("stopped after a storage failure: {0}")]
    StorageFailed(String),
    /// The stop's time ran out with writes still waiting for the storage (a stalled disk or
    /// database): none of them was acknowledged, and their keys decide their retries.
    #[error("stopped with {0} write(s) still waiting for the storage, their outcome unknown (none was acknowledged)")]
    Unsettled(usize),
}

/// A started server: its listener bound, its store open and its workers running.
pub struct Application {
    server: Server,
    address: SocketAddr,
    /// `--metrics-listen`'s bound address.
    metrics_address: Option<SocketAddr>,
    https: bool,
    store: Arc<dyn Store>,
    workers: Vec<Periodic>,
    stop_workers: Arc<StopSignal>,
}

impl Application {
    pub(crate) async fn build(settings: Settings) -> Result<Self, StartupError> {
        Self::build_with_flush_hook(settings, None).await
    }

    /// `build`, with a step run before every group flush of the embedded engine: tests use
    /// it to stall or fail the durability step. The binary always passes `None`.
    pub async fn build_with_flush_hook(
        settings: Settings,
        flush_hook: Option<embedded::FlushHook>,
    ) -> Result<Self, StartupError> {
        // A certificate or a credential that cannot be used stops the start before anything
        // is touched.
        let tls = match (&settings.tls_cert, &settings.tls_key) {
            (Some(cert), Some(key)) => Some(Arc::new(ReloadingCert::open(cert, key)?)),
            _ => None,
        };
        let mut admin_tokens = Source {
            given: settings.admin_token.clone(),
            file: settings.admin_token_file.clone(),
        };
        let demo_token = if settings.demo {
            Credentials::with_demo_token(&mut admin_tokens)
                .or_else(|| admin_tokens.given.first().map(|t| t.value.clone()))
        } else {
            None
        };
        let provider_secrets = Source {
            given: settings.provider_secret.clone(),
            file: settings.provider_secret_file.clone(),
        };
        let credentials = Arc::new(Credentials::load(admin_tokens, provider_secrets)?);
        let metrics = Arc::new(Metrics::default());
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        metrics
            .process_start_time_seconds
            .set(started.as_secs_f64());
        let engine = match &settings.database_url {
            // The schema is migrated before anything listens.
            Some(url) => Engine::Shared {
                url: url.clone(),
                pool_size: settings.database_pool_size as usize,
                empty_only: false,
            },
            None => Engine::Embedded {
                path: settings.data_dir.clone(),
                cache_bytes: settings.cache_mb * 1024 * 1024,
                flush_hook,
                before_walk: None,
            },
        };
        let store = store::open(
            engine,
            Arc::clone(&metrics),
            settings.max_pending_writes as usize,
        )
        .await?;
        if settings.demo {
            demo::seed_and_announce(&*store, &settings.currency, Path::new(demo::DEMO_FILE))
                .await?;
            if let Some(token) = &demo_token {
                println!("demo: admin token: {token}");
            }
        }
        if settings.allow_private_callbacks {
            log::warn!("--allow-private-callbacks is on: callbacks may target loopback and private hosts (development only)");
        }
        let listener = TcpListener::bind(&settings.listen)
            .map_err(|e| StartupError::Bind(settings.listen.clone(), e))?;
        let address = listener.local_addr()?;
        let metrics_listener = match &settings.metrics_listen {
            Some(at) => Some(TcpListener::bind(at).map_err(|e| StartupError::Bind(at.clone(), e))?),
            None => None,
        };
        let metrics_address = match &metrics_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        // Once nothing can refuse the start any more: a refusal stays one line.
        log::info!("{}", credentials.describe());
        if settings.demo {
            let scheme = if tls.is_some() { "https" } else { "http" };
            println!("demo: console: {scheme}://{address}/console");
        }

        let store_data: web::Data<dyn Store> = web::Data::from(Arc::clone(&store));
        let metrics_data = web::Data::from(Arc::clone(&metrics));
        let limits =
            web::Data::new(RateLimits::new(&settings).shared_with(store.shared_rate_limit()));
        let admin = web::Data::from(Arc::clone(&credentials));
        let split = web::Data::new(MetricsListener(metrics_address));
        let request_deadline = settings.request_deadline;
        let settings = web::Data::new(settings);
        let stop_workers = Arc::new(StopSignal::default());
        let workers = start_workers(&store, &metrics, &settings, &limits, &stop_workers)?;
        let server = HttpServer::new(move || {
            App::new()
                .app_data(store_data.clone())
                .app_data(metrics_data.clone())
                .app_data(limits.clone())
                .app_data(admin.clone())
                .app_data(split.clone())
                .app_data(settings.clone())
                .app_data(api::path_config())
                .configure(api::routes)
                .wrap(from_fn(split_metrics))
                .wrap(from_fn(limit_rate))
                .wrap(from_fn(check_origin))
                // Born before the limiter (which may wait on the database) and counted.
                .wrap(from_fn(stamp_deadline))
                .wrap(from_fn(count_requests))
                .wrap(from_fn(log_requests))
        });
        let server = match &tls {
            Some(cert) => server.listen_rustls_0_23(listener, cert.server_config()?)?,
            None => server.listen(listener)?,
        };
        // Plain HTTP, as scrapers on a private network ask for it.
        let server = match metrics_listener {
            Some(l) => server.listen(l)?,
            None => server,
        };
        // Every request in flight is answered by its deadline (and the edge's margin); the
        // stop's own bound is kept by `run_until_stopped`.
        let drain = (request_deadline + EDGE_MARGIN).as_secs() + 1;
        let server = server
            .shutdown_timeout(drain.min(STOP_WITHIN.as_secs() / 2))
            // SIGINT and SIGTERM are handled below, both gracefully; actix alone would treat
            // SIGINT (Ctrl-C) as a forced stop that drops requests in flight.
            .disable_signals()
            .run();
        let https = tls.is_some();
        reload_on_sighup(tls, credentials)?;
        Ok(Application {
            server,
            address,
            metrics_address,
            https,
            store,
            workers,
            stop_workers,
        })
    }

    /// The address the server listens on, with the port the system chose for port 0.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://ADDR`, or `https://ADDR` with `--tls-cert`.
    pub(crate) fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.address)
    }

    /// `http://ADDR/metrics` on `--metrics-listen`'s listener, when there is one.
    pub(crate) fn metrics_url(&self) -> Option<String> {
        self.metrics_address
            .map(|at| format!("http://{at}/metrics"))
    }

    /// Serves until SIGINT or SIGTERM, then answers in-flight requests, stops the workers and
    /// flushes, all within `bounds::STOP_WITHIN` whatever the storage does; or until storage
    /// fails, then stops at once and reports it.
    pub async fn run_until_stopped(self) -> Result<(), RunError> {
        log::info!("orderly listening on {}", self.url());
        let handle = self.server.handle();
        let graceful = handle.clone();
        let (stopping, stop_deadline) = tokio::sync::oneshot::channel();
        let stop_workers = Arc::clone(&self.stop_workers);
        actix_web::rt::spawn(async move {
            let signal = stop_requested().await;
            let deadline = Deadline::after(STOP_WITHIN);
            match signal {
                Ok(signal) => log::info!("{signal}: stopping within {STOP_WITHIN:?}"),
                Err(e) => log::error!("cannot listen for stop signals ({e}); stopping"),
            }
            exit_if_not_stopped_by(Deadline::at(deadline.instant() - EXIT_SHARE));
            let _ = stopping.send(deadline);
            // The workers start no more passes from now, while the requests in flight are
            // answered: a delivery already on the wire ends within its attempt's timeout,
            // inside the stop's bound, instead of one started during the drain running past it.
            stop_workers.send();
            graceful.stop(true).await;
        });
        let store = Arc::clone(&self.store);
        let failure = Box::pin(async move { store.failure().await });
        match select(self.server, failure).await {
            Either::Left((served, _)) => {
                let deadline = stop_deadline
                    .await
                    .unwrap_or_else(|_| Deadline::after(STOP_WITHIN));
                log::info!("stopped accepting; in-flight requests answered");
                // The workers get what the storage's stop does not need; one still inside a
                // pass is left to the process's exit.
                let storage_by = Deadline::at(deadline.instant() - EXIT_SHARE - LAST_RESORT);
                let workers_by = Deadline::at(storage_by.instant() - STORAGE_STOP_SHARE);
                self.stop_workers.send();
                for worker in self.workers {
                    if !worker.join(workers_by).await {
                        log::warn!("a background worker was still in a pass; left to the exit");
                    }
                }
                match self.store.stop(storage_by).await {
                    Stopped::Settled => {
                        log::info!("storage flushed: every write taken is settled; exiting");
                        Ok(served?)
                    }
                    Stopped::Abandoned { in_flight } => Err(RunError::Unsettled(in_flight)),
                }
            }
            Either::Right((why, server)) => {
                // No drain and no final flush: every answer from now on would be a guess.
                // Workers are left to the process exit, one may be inside a 10 s delivery.
                let _ = tokio::time::timeout(Duration::from_millis(500), handle.stop(false)).await;
                drop(server);
                Err(RunError::StorageFailed(why))
            }
        }
    }
}

/// Of the stop's time: what the storage's own stop gets after the workers' (its final flush,
/// handing leases and claims back, the commits still unconfirmed), the margin between its end
/// and the last resort, and what the last resort leaves to exit.
const STORAGE_STOP_SHARE: Duration = Duration::from_secs(8);
const LAST_RESORT: Duration = Duration::from_secs(3);
const EXIT_SHARE: Duration = Duration::from_secs(1);

/// The last resort of a stop: if the process is still here at `deadline` (a thread stuck on
/// a disk that stopped answering), it says so and exits 1.
fn exit_if_not_stopped_by(deadline: Deadline) {
    std::thread::spawn(move || {
        std::thread::sleep(deadline.left());
        log::error!("the stop did not finish within {STOP_WITHIN:?}; exiting with writes in doubt");
        crate::logging::flush();
        std::process::exit(1);
    });
}

/// Re-reads the certificate and key on every SIGHUP: new connections get the new pair; a
/// pair that does not load is logged and the old one stays.
/// SIGHUP reads the certificate and the credentials' files again (each that there is; with
/// neither, SIGHUP keeps its default and stops the process as before). What does not load is
/// logged, and what is in force stays.
fn reload_on_sighup(
    cert: Option<Arc<ReloadingCert>>,
    credentials: Arc<Credentials>,
) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    if cert.is_none() && !credentials.reloads() {
        return Ok(());
    }
    let mut hangups = signal(SignalKind::hangup())?;
    actix_web::rt::spawn(async move {
        while hangups.recv().await.is_some() {
            if let Some(cert) = &cert {
                match cert.reload() {
                    Ok(()) => log::info!("SIGHUP: certificate reloaded for new connections"),
                    Err(e) => log::error!("SIGHUP: {e}; the certificate in force stays"),
                }
            }
            if credentials.reloads() {
                match credentials.reload() {
                    Ok(now) => log::info!("SIGHUP: credentials read again: {now}"),
                    Err(e) => log::error!(
                        "SIGHUP: {e}; the admin tokens and provider secrets in force stay"
                    ),
                }
            }
        }
    });
    Ok(())
}

/// Resolves on the first SIGINT or SIGTERM, naming it.
async fn stop_requested() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let interrupted = std::pin::pin!(interrupt.recv());
    let terminated = std::pin::pin!(terminate.recv());
    Ok(match select(interrupted, terminated).await {
        Either::Left(_) => "SIGINT",
        Either::Right(_) => "SIGTERM",
    })
}

fn start_workers(
    store: &Arc<dyn Store>,
    metrics: &Arc<Metrics>,
    settings: &Settings,
    limits: &web::Data<RateLimits>,
    stop: &StopSignal,
) -> Result<Vec<Periodic>, StartupError> {
    let (s, m) = (Arc::clone(store), Arc::clone(metrics));
    let sweeper = Periodic::spawn(
        "sweeper",
        settings.sweep_interval,
        Arc::clone(metrics),
        stop,
        move || {
            let (s, m) = (Arc::clone(&s), Arc::clone(&m));
            async move { sweeper::sweep_expired_keys(&*s, &m).await }
        },
    )?;
    let l = limits.clone();
    let m = Arc::clone(metrics);
    let pruner = Periodic::spawn(
        "rate-limit-pruner",
        pruner::PRUNE_EVERY,
        m,
        stop,
        move || {
            let l = l.clone();
            async move { pruner::prune_idle_buckets(&l).await }
        },
    )?;
    let s = Arc::clone(store);
    let delay = settings.fulfillment_delay;
    let fulfillment = Periodic::spawn(
        "fulfillment",
        fulfillment::poll_interval(delay),
        Arc::clone(metrics),
        stop,
        move || {
            let s = Arc::clone(&s);
            async move { fulfillment::complete_due_orders(&*s, delay).await }
        },
    )?;
    let sender = Arc::new(
        WebhookSender::new(
            Arc::clone(store),
            Arc::clone(metrics),
            api::respond::callback_policy(settings),
            settings.webhook_retry_schedule.clone(),
            settings.webhook_origin_concurrency as usize,
        )
        .map_err(|e| StartupError::Webhooks(e.to_string()))?,
    );
    let m = Arc::clone(metrics);
    let draining = Arc::clone(&sender);
    let webhooks = Periodic::spawn_draining(
        "webhooks",
        webhooks::POLL_INTERVAL,
        m,
        stop,
        move || {
            let sender = Arc::clone(&sender);
            async move { sender.deliver_due().await }
        },
        move || async move { draining.drain().await },
    )?;
    let mut workers = vec![sweeper, pruner, fulfillment, webhooks];
    if settings.database_url.is_none() {
        // The sled store's disk, for /metrics: read here, off the threads that answer.
        let (path, m) = (settings.data_dir.clone(), Arc::clone(metrics));
        crate::disk_space::update(&path, &m);
        let updated = Arc::clone(&m);
        workers.push(Periodic::spawn(
            "disk-space",
            crate::disk_space::EVERY,
            m,
            stop,
            move || {
                crate::disk_space::update(&path, &updated);
                async {}
            },
        )?);
    }
    Ok(workers)
}
