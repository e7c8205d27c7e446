//! Storage-only benchmark: the same `place_order` the HTTP handler runs, made durable by the
//! same group-commit thread, with no HTTP in front; and the replay lookup alone. Set beside
//! `scripts/bench.sh`, it shows what the HTTP layer costs.
//!
//!   cargo bench --bench store                 (STORE_BENCH_SECONDS=5 by default)
//!
//! Each scenario runs 1, 16 and 64 concurrent clients on a multi-thread runtime, the
//! transaction on the writer thread and answered after its group commit, as in the server.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orderly::domain::account::Account;
use orderly::domain::basket::RequestedLine;
use orderly::domain::fingerprint::{Fingerprint, LineRef, Operation};
use orderly::domain::idempotency_key::IdempotencyKey;
use orderly::domain::ids::{Id, IdKind};
use orderly::domain::ledger::LedgerReason;
use orderly::domain::product::Product;
use orderly::domain::time::now_millis;
use orderly::metrics::Metrics;
use orderly::store::accounts::{account_bytes, NewCredit};
use orderly::store::committer::Committer;
use orderly::store::idempotency::KeyClaim;
use orderly::store::orders::NewOrder;
use orderly::store::Store;
use orderly::views::order_placed;

const ACCOUNTS: usize = 100;

struct Bench {
    store: Arc<Store>,
    committer: Arc<Committer>,
    accounts: Vec<Account>,
    lines: Vec<RequestedLine>,
}

fn setup(dir: &std::path::Path) -> Bench {
    let store = Arc::new(Store::open(&dir.join("db"), 128 << 20).expect("open"));
    let data_file = std::fs::File::open(dir.join("db").join("db")).expect("data file");
    let committer = Arc::new(Committer::start(
        store.db().clone(),
        data_file,
        Arc::new(Metrics::default()),
    ));
    store
        .put_product(&Product {
            id: "prd_bench".into(),
            name: "bench".into(),
            price: 1,
            regions: vec![],
            delivery_fields: vec![],
            active: true,
            updated_at: now_millis(),
        })
        .unwrap();
    let accounts: Vec<Account> = (0..ACCOUNTS)
        .map(|i| {
            let account = Account {
                id: Id::new(IdKind::Account).to_string(),
                name: format!("bench {i}"),
                wholesale: true,
                credit_limit: 0,
                region: None,
                webhook_secret: "whsec_AAAA".into(),
                created_at: now_millis(),
            };
            store.create_account(&account).unwrap();
            let credit = NewCredit {
                account: &account,
                amount: 1_000_000_000_000,
                reason: LedgerReason::Credit,
                reference: "bench".into(),
                now: now_millis(),
                currency: "USD",
                claim: None,
            };
            store
                .credit(&credit, Id::new(IdKind::Transaction), |_| Vec::new())
                .unwrap()
                .unwrap();
            account
        })
        .collect();
    let lines = vec![RequestedLine {
        product_id: "prd_bench".into(),
        quantity: 1,
        delivery_data: Default::default(),
    }];
    Bench {
        store,
        committer,
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

/// One durable order, as the handler does it: the transaction on the writer thread, answered
/// once its group commit is on disk.
async fn place(bench: &Arc<Bench>, account: usize, key: String) {
    let b = Arc::clone(bench);
    bench
        .committer
        .write(move || {
            let account = &b.accounts[account];
            let key = IdempotencyKey::parse(key.as_bytes()).unwrap();
            let now = now_millis();
            let new = NewOrder {
                account,
                order_id: Id::new(IdKind::Order),
                txn_id: Id::new(IdKind::Transaction),
                lines: &b.lines,
                currency: "USD",
                callback_url: None,
                external_order_id: None,
                now,
                claim: KeyClaim {
                    account: account_bytes(&account.id).unwrap(),
                    key: &key,
                    operation: Operation::PlaceOrder,
                    fingerprint: fingerprint(&b.lines),
                    expires_at: now + 86_400_000,
                },
            };
            b.store.place_order(&new, order_placed).unwrap().unwrap();
        })
        .await
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
    let bench = Arc::new(setup(dir.path()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
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
        let pool: Arc<Vec<(usize, IdempotencyKey)>> = Arc::new(
            (0..1000)
                .map(|i| {
                    (
                        i % ACCOUNTS,
                        IdempotencyKey::parse(format!("spread-1-0-{i}").as_bytes()).unwrap(),
                    )
                })
                .filter(|(a, k)| {
                    let account = account_bytes(&bench.accounts[*a].id).unwrap();
                    bench.store.replay_lookup(&account, k).unwrap().is_some()
                })
                .collect(),
        );
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
                            let account = account_bytes(&b.accounts[*a].id).unwrap();
                            let found = b.store.replay_lookup(&account, key).unwrap();
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
    bench.committer.stop();
    println!("| storage-only scenario | clients | ops/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.3} | {:.3} |",
            r.scenario, r.clients, r.rps, r.p50_ms, r.p99_ms
        );
    }
}
