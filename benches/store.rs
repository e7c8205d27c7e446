//! Storage-only benchmark: the same `place_order` the HTTP handler runs, made durable by the
//! same group-commit thread, with no HTTP in front; and the replay lookup alone. Set beside
//! `scripts/bench.sh`, it shows what the HTTP layer costs.
//!
//!   cargo bench --bench store                 (STORE_BENCH_SECONDS=5 by default)
//!
//! Each scenario runs 1, 16 and 64 concurrent clients on a multi-thread runtime, the
//! transaction on the writer thread and answered after its group commit, as in the server.

/// The deadline of each call: far enough that only a stuck store would meet it.
fn soon() -> orderly::Deadline {
    orderly::Deadline::after(std::time::Duration::from_secs(60))
}

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orderly::now_millis;
use orderly::order_placed;
use orderly::Account;
use orderly::AccountId;
use orderly::Cents;
use orderly::IdempotencyKey;
use orderly::LedgerReason;
use orderly::Metrics;
use orderly::Product;
use orderly::RequestedLine;
use orderly::{Engine, KeyClaim, NewCredit, NewOrder, Store};
use orderly::{Fingerprint, LineRef, Operation};

const ACCOUNTS: usize = 100;

struct Bench {
    store: Arc<dyn Store>,
    accounts: Vec<Account>,
    lines: Vec<RequestedLine>,
}

async fn setup(dir: &std::path::Path) -> Bench {
    let engine = Engine::Embedded {
        path: dir.join("db"),
        cache_bytes: 128 << 20,
        flush_hook: None,
        before_walk: None,
    };
    let store = orderly::open_store(engine, Arc::new(Metrics::default()), 4096)
        .await
        .expect("open");
    store
        .put_product(
            soon(),
            Product {
                id: "prd_bench".into(),
                name: "bench".into(),
                price: Cents(1),
                regions: vec![],
                delivery_fields: vec![],
                active: true,
                updated_at: now_millis(),
            },
        )
        .await
        .unwrap();
    let mut accounts = Vec::new();
    for i in 0..ACCOUNTS {
        let account = Account {
            id: AccountId::new(),
            name: format!("bench {i}"),
            wholesale: true,
            credit_limit: Cents::ZERO,
            region: None,
            webhook_secret: "whsec_AAAA".into(),
            created_at: now_millis(),
        };
        store.create_account(soon(), account.clone()).await.unwrap();
        let credit = NewCredit {
            account: account.clone(),
            amount: Cents(1_000_000_000_000),
            reason: LedgerReason::Credit,
            reference: "bench".into(),
            currency: "USD".into(),
            claim: None,
            render: |_| Vec::new(),
        };
        store.credit(soon(), credit).await.unwrap().unwrap();
        accounts.push(account);
    }
    let lines = vec![RequestedLine {
        product_id: "prd_bench".into(),
        quantity: 1,
        delivery_data: Default::default(),
    }];
    Bench {
        store,
        accounts,
        lines,
    }
}

fn fingerprint(lines: &[RequestedLine]) -> Fingerprint {
    Fingerprint::of_basket(lines.iter().map(|l| LineRef {
        product_id: &l.product_id,
        quantity: l.quantity,
        delivery_data: &l.delivery_data,
    }))
}

/// One durable order through the port, as the handler places it.
async fn place(bench: &Bench, account: usize, key: String) {
    let order = NewOrder {
        account: bench.accounts[account].clone(),
        lines: bench.lines.clone(),
        currency: "USD".into(),
        callback_url: None,
        external_order_id: None,
        claim: KeyClaim {
            key: IdempotencyKey::parse(key.as_bytes()).unwrap(),
            operation: Operation::PlaceOrder,
            fingerprint: fingerprint(&bench.lines),
            ttl: Duration::from_secs(86_400),
            wait_until: Instant::now() + Duration::from_secs(5),
        },
        render: order_placed,
    };
    bench
        .store
        .place_order(soon(), order)
        .await
        .unwrap()
        .unwrap();
}

struct Row {
    scenario: &'static str,
    clients: usize,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Runs `op(client, n)` from `clients` tasks for `seconds`; returns throughput and latency.
async fn drive<F, Fut>(scenario: &'static str, clients: usize, seconds: f64, op: F) -> Row
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (op, stop, done) = (Arc::clone(&op), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    op(c, n).await;
                    latencies.push(t.elapsed());
                    n += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<Duration> = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let pct =
        |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)].as_secs_f64() * 1000.0;
    Row {
        scenario,
        clients,
        rps: done.load(Ordering::Relaxed) as f64 / elapsed,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
    }
}

fn main() {
    let seconds: f64 = std::env::var("STORE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let bench = Arc::new(runtime.block_on(setup(dir.path())));
    // STORE_BENCH_ONLY=commit or =read runs one half (for profiling); the replay pool comes
    // from the 1-client commit run, so "read" still runs that one.
    let only = std::env::var("STORE_BENCH_ONLY").unwrap_or_default();
    let commit_clients: &[usize] = if only == "read" { &[1] } else { &[1, 16, 64] };
    let read_clients: &[usize] = if only == "commit" { &[] } else { &[1, 16, 64] };
    let mut rows = Vec::new();
    runtime.block_on(async {
        for &clients in commit_clients {
            let b = Arc::clone(&bench);
            rows.push(
                drive(
                    "durable new order, 100 accounts",
                    clients,
                    seconds,
                    move |c, n| {
                        let b = Arc::clone(&b);
                        async move {
                            place(
                                &b,
                                (c + n as usize) % ACCOUNTS,
                                format!("spread-{clients}-{c}-{n}"),
                            )
                            .await
                        }
                    },
                )
                .await,
            );
            let b = Arc::clone(&bench);
            rows.push(
                drive(
                    "durable new order, 1 hot account",
                    clients,
                    seconds,
                    move |c, n| {
                        let b = Arc::clone(&b);
                        async move { place(&b, 0, format!("hot-{clients}-{c}-{n}")).await }
                    },
                )
                .await,
            );
        }
        // A pool of used keys to read back, as replays do.
        let mut pool = Vec::new();
        for i in 0..1000 {
            let (a, k) = (
                i % ACCOUNTS,
                IdempotencyKey::parse(format!("spread-1-0-{i}").as_bytes()).unwrap(),
            );
            let account = bench.accounts[a].id;
            if bench
                .store
                .replay_lookup(soon(), account, k.clone())
                .await
                .unwrap()
                .is_some()
            {
                pool.push((a, k));
            }
        }
        let pool: Arc<Vec<(usize, IdempotencyKey)>> = Arc::new(pool);
        for &clients in read_clients {
            let (b, pool) = (Arc::clone(&bench), Arc::clone(&pool));
            rows.push(
                drive(
                    "replay lookup (point reads)",
                    clients,
                    seconds,
                    move |c, n| {
                        let (b, pool) = (Arc::clone(&b), Arc::clone(&pool));
                        async move {
                            let (a, key) = &pool[(c * 7919 + n as usize) % pool.len()];
                            let account = b.accounts[*a].id;
                            let found = b
                                .store
                                .replay_lookup(soon(), account, key.clone())
                                .await
                                .unwrap();
                            std::hint::black_box(found.expect("pool keys exist"));
                            // Yield as a request would between reads, so clients interleave.
                            tokio::task::yield_now().await;
                        }
                    },
                )
                .await,
            );
        }
    });
    runtime.block_on(bench.store.stop(soon()));
    println!("| storage-only scenario | clients | ops/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.3} | {:.3} |",
            r.scenario, r.clients, r.rps, r.p50_ms, r.p99_ms
        );
    }
}
