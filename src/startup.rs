//! The application: storage, shared state, the route table, background workers, and an
//! orderly shutdown (stop accepting, finish in-flight requests, flush, exit 0).

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::middleware::{from_fn, Logger};
use actix_web::{web, App, HttpServer};
use sha2::{Digest, Sha256};

use crate::api::idempotent::KeyLocks;
use crate::api::{self, AppState};
use crate::config::Settings;
use crate::domain::ids::random_hex;
use crate::edge::origin::check_origin;
use crate::edge::rate_limit::{limit_rate, RateLimits};
use crate::edge::request_metrics::count_requests;
use crate::metrics::Metrics;
use crate::store::committer::Committer;
use crate::store::Store;
use crate::workers::webhooks::{self, WebhookSender};
use crate::workers::{fulfillment, sweeper, Periodic};

/// How often idle rate-limit buckets are forgotten.
const RATE_LIMIT_PRUNE_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot open the database in {path}: {source}")]
    Store {
        path: String,
        source: crate::store::StoreError,
    },
    #[error("cannot bind {0}: {1}")]
    Bind(String, std::io::Error),
    #[error("{0}")]
    Demo(#[from] crate::demo::DemoError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("cannot build the webhook client: {0}")]
    Webhooks(String),
}

pub struct Application {
    server: Server,
    address: SocketAddr,
    state: web::Data<AppState>,
    workers: Vec<Periodic>,
}

impl Application {
    pub async fn build(mut settings: Settings) -> Result<Self, StartupError> {
        let store =
            Store::open(&settings.data_dir, settings.cache_mb * 1024 * 1024).map_err(|source| {
                StartupError::Store {
                    path: settings.data_dir.display().to_string(),
                    source,
                }
            })?;
        let store = Arc::new(store);
        if settings.demo {
            crate::demo::seed_and_announce(
                &store,
                &settings.currency,
                Path::new(crate::demo::DEMO_FILE),
            )?;
            let token = settings
                .admin_token
                .get_or_insert_with(|| format!("adm_{}", random_hex()));
            println!("demo: admin token: {token}");
        }
        if settings.allow_private_callbacks {
            log::warn!("--allow-private-callbacks is on: callbacks may target loopback and private hosts (development only)");
        }
        let data_file = File::open(settings.data_dir.join("db"))?;
        let metrics = Arc::new(Metrics::default());
        let committer = Arc::new(Committer::start(
            store.db().clone(),
            data_file,
            Arc::clone(&metrics),
        ));
        let state = web::Data::new(AppState {
            store: Arc::clone(&store),
            committer,
            key_locks: KeyLocks::default(),
            admin_token_hash: settings
                .admin_token
                .as_ref()
                .map(|t| Sha256::digest(t.as_bytes()).into()),
            rate_limits: RateLimits::new(&settings),
            metrics,
            settings,
        });

        let listen = state.settings.listen.clone();
        let listener =
            TcpListener::bind(&listen).map_err(|e| StartupError::Bind(listen.clone(), e))?;
        let address = listener.local_addr()?;
        let app_state = state.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_state.clone())
                .app_data(api::path_config())
                .configure(api::routes)
                .wrap(from_fn(limit_rate))
                .wrap(from_fn(check_origin))
                .wrap(from_fn(count_requests))
                .wrap(request_log())
        })
        .listen(listener)?
        .shutdown_timeout(30)
        .run();

        let workers = start_workers(&state)?;
        Ok(Application {
            server,
            address,
            state,
            workers,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves until SIGINT or SIGTERM, then drains in-flight requests and flushes.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        log::info!("orderly listening on http://{}", self.address);
        let served = self.server.await;
        log::info!("stopped accepting; in-flight requests finished");
        for worker in self.workers {
            worker.stop();
        }
        self.state.committer.stop();
        if let Err(e) = self.state.store.db().flush() {
            log::error!("final flush failed: {e}");
        }
        log::info!("storage flushed; exiting");
        served
    }
}

fn start_workers(state: &web::Data<AppState>) -> Result<Vec<Periodic>, StartupError> {
    let settings = &state.settings;
    let (store, metrics) = (Arc::clone(&state.store), Arc::clone(&state.metrics));
    let sweeper = Periodic::spawn("sweeper", settings.sweep_interval, move || {
        sweeper::sweep_expired_keys(&store, &metrics)
    });
    let limits = state.clone();
    let pruner = Periodic::spawn("rate-limit-pruner", RATE_LIMIT_PRUNE_EVERY, move || {
        limits.rate_limits.prune()
    });
    let (store, committer) = (Arc::clone(&state.store), Arc::clone(&state.committer));
    let delay = settings.fulfillment_delay;
    let fulfillment = Periodic::spawn(
        "fulfillment",
        fulfillment::poll_interval(delay),
        move || fulfillment::complete_due_orders(&store, &committer, delay),
    );
    let sender = WebhookSender::new(
        Arc::clone(&state.store),
        Arc::clone(&state.metrics),
        state.callback_policy(),
        settings.webhook_retry_schedule.clone(),
    )
    .map_err(|e| StartupError::Webhooks(e.to_string()))?;
    // Deliveries are async (many receivers at once); this thread owns their small runtime.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let webhooks = Periodic::spawn("webhooks", webhooks::POLL_INTERVAL, move || {
        runtime.block_on(sender.deliver_due())
    });
    Ok(vec![sweeper, pruner, fulfillment, webhooks])
}

/// One line per request: method, path (never the query, which could carry a secret),
/// status, latency in ms and whether it was a replay.
fn request_log() -> Logger {
    Logger::new("%{method}xi %U %s %Dms replayed=%{replayed}xo")
        .custom_request_replace("method", |req| req.method().to_string())
        .custom_response_replace("replayed", |res| {
            res.headers()
                .contains_key("Idempotency-Replayed")
                .to_string()
        })
}
