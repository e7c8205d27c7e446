//! What every run starts with: the catalog, the accounts and their keys, the funds (all through
//! the admin API), the operation mix the seed draws, and the prefill that grows the store so a
//! backup's walk takes seconds.

use crate::ctx::Ctx;
use crate::http::{self, Auth, Req};
use crate::model::KeyRecord;
use crate::rng::Rng;
use crate::state::{Account, Poller, PrefillKey};
use hmac::{Hmac, Mac};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::Sha256;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub const SCOPES: [&str; 4] = [
    "orders:write",
    "orders:read",
    "balance:read",
    "catalog:read",
];
/// Big enough that no order of the run runs out (the 402s come from `tp-gold`).
pub const FUNDS: i64 = 1_000_000_000_000;
pub const CREDIT_LINE: i64 = 2_000_000;

/// The catalog: (id, price, regions, deliveryFields).
pub const PRODUCTS: [(&str, i64, &[&str], &[&str]); 6] = [
    ("tp-uc", 99, &[], &["username"]),
    ("tp-gem", 250, &[], &[]),
    ("tp-card", 1000, &[], &["username", "server"]),
    ("tp-us", 500, &["US"], &[]),
    ("tp-free", 0, &[], &[]),
    ("tp-gold", 1_000_000_000, &[], &[]),
];

/// The accounts of every run, by index: (name suffix, wholesale, region, credit line, funds).
pub const ACCOUNTS: [(&str, bool, &str, i64, i64); 6] = [
    ("hot", true, "EU", 0, FUNDS),
    ("credit", true, "EU", CREDIT_LINE, 100_000),
    ("us", true, "US", 0, FUNDS),
    ("quiet", true, "EU", 0, FUNDS),
    ("bulk", true, "EU", 0, FUNDS),
    ("retail", false, "EU", 0, 0),
];
pub const HOT: usize = 0;
pub const QUIET: usize = 3;
pub const BULK: usize = 4;
pub const RETAIL: usize = 5;

pub fn product_body(i: usize) -> Value {
    let (id, price, regions, fields) = PRODUCTS[i];
    json!({"name": format!("torture {id}"), "price": price, "regions": regions, "deliveryFields": fields, "active": true})
}

/// near-limits: the bound of a credit, a provider payment, a price and a credit line.
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;
/// The bound of a line's quantity.
pub const MAX_QTY: i64 = 1_000_000;
/// near-limits' catalog: a product at the price bound, and two to make any total exactly.
pub const EDGE_PRODUCTS: [(&str, i64); 3] = [
    ("tp-max", MAX_AMOUNT),
    ("tp-mega", 1_000_000),
    ("tp-one", 1),
];
/// The balance the carried-over accounts start with: room for half a credit before i64's end.
pub const CARRIED_BALANCE: i64 = i64::MAX - MAX_AMOUNT / 2;

/// The operations and their base weights; a profile drawn by the seed scales them. The
/// `edge.` ones weigh 0 outside near-limits (and draw nothing: a seed of another profile draws
/// what it drew before they were added).
pub const OPS: [(&str, u32); 29] = [
    ("order.new", 30),
    ("replay", 10),
    ("order.other-body", 3),
    ("order.burst", 3),
    ("order.refused", 3),
    ("order.402", 2),
    ("cancel", 5),
    ("refund", 5),
    ("credit", 3),
    ("provider", 3),
    ("provider.repeat", 2),
    ("key.cycle", 3),
    ("product.put", 2),
    ("rotate", 1),
    ("redeliver", 2),
    ("recover", 1),
    ("account.create", 1),
    ("read.order", 4),
    ("read.list", 4),
    ("read.events", 4),
    ("read.balance", 2),
    ("read.admin", 2),
    ("readyz", 1),
    ("retail", 1),
    ("edge.credit", 5),
    ("edge.exact", 6),
    ("edge.overflow", 4),
    ("edge.refund", 4),
    ("edge.rich", 5),
];

/// The profiles a seed draws from.
pub const PROFILES: [&str; 6] = [
    "balanced",
    "orders",
    "keys",
    "admin",
    "webhooks",
    "near-limits",
];

/// The mix of a run: the profile's name, the weights, how many orders carry a callback.
#[derive(Clone, Debug)]
pub struct Mix {
    pub profile: &'static str,
    pub weights: Vec<u32>,
    pub callback_share: f64,
}

impl Mix {
    pub fn draw(seed: u64) -> Mix {
        let mut rng = Rng::stream(seed, "mix", 0);
        let profile = *rng.pick(&PROFILES);
        Mix::for_profile(profile, &mut rng)
    }

    pub fn for_profile(profile: &'static str, rng: &mut Rng) -> Mix {
        let boost: &[(&str, u32)] = match profile {
            "orders" => &[("order.new", 3), ("replay", 2), ("order.burst", 2)],
            // Defect 1's shape: api-keys and products rewritten (and rewritten identically)
            // while backups run.
            "keys" => &[("key.cycle", 10), ("product.put", 5), ("order.new", 1)],
            // Defect 2's shape: unkeyed admin writes that commit, then wait.
            // (and writes that wait on the hot account's row while holding a connection).
            "admin" => &[
                ("key.cycle", 6),
                ("rotate", 12),
                ("account.create", 6),
                ("cancel", 2),
                ("refund", 2),
                ("credit", 3),
            ],
            "webhooks" => &[
                ("redeliver", 4),
                ("recover", 3),
                ("refund", 2),
                ("cancel", 2),
            ],
            _ => &[],
        };
        let weights = OPS
            .iter()
            .map(|(name, w)| {
                if name.starts_with("edge.") && profile != "near-limits" {
                    return 0;
                }
                let b = boost
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, b)| *b)
                    .unwrap_or(1);
                // Each weight between half and twice its base, so seeds of one profile differ.
                let f = 0.5 + 1.5 * rng.unit();
                ((*w * b) as f64 * f).round().max(1.0) as u32
            })
            .collect();
        let callback_share = match profile {
            "webhooks" => 0.8,
            "admin" | "keys" => 0.3,
            _ => 0.4,
        };
        Mix {
            profile,
            weights,
            callback_share,
        }
    }
}

/// A short tag of the run in every key and name (unique per seed; a fresh store per run).
pub fn run_tag(seed: u64) -> String {
    format!("t{:06x}", seed & 0xff_ffff)
}

pub fn now_rfc3339(offset: Duration) -> String {
    humantime::format_rfc3339_seconds(SystemTime::now() - offset).to_string()
}

pub fn sign_provider(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(body);
    let out = mac.finalize().into_bytes();
    format!(
        "sha256={}",
        out.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

// ---------------------------------------------------------------------------------------------
// Setup.

/// Sends a setup request, retrying transient answers for up to a minute (no fault runs yet).
async fn setup_call(ctx: &Arc<Ctx>, http: &reqwest::Client, req: Req) -> Result<Value, String> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let r = http::send(ctx, http, &req).await;
        if r.ok() {
            return r
                .json()
                .ok_or_else(|| format!("{} {}: not JSON", req.method, req.path));
        }
        if Instant::now() > until || r.status.is_some_and(|s| (400..500).contains(&s)) {
            return Err(format!(
                "setup {} {}: {}",
                req.method,
                req.path,
                r.describe()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn setup(ctx: &Arc<Ctx>) -> Result<(), String> {
    let http = http::client();
    let tag = run_tag(ctx.cfg.seed);
    for (i, product) in PRODUCTS.iter().enumerate() {
        let req = Req::new(
            "setup",
            Method::PUT,
            format!("/admin/products/{}", product.0),
            0,
            usize::MAX,
        )
        .auth(Auth::Admin)
        .json(&product_body(i));
        setup_call(ctx, &http, req).await?;
    }
    let clients = ctx.cfg.clients;
    let mut accounts = Vec::new();
    for (idx, (suffix, wholesale, region, credit, funds)) in ACCOUNTS.iter().enumerate() {
        let name = format!("{tag}-{suffix}");
        let req = Req::new("setup", Method::POST, "/admin/accounts", 0, usize::MAX)
            .auth(Auth::Admin)
            .json(&json!({"name": name, "wholesale": wholesale, "creditLimit": credit, "region": region}));
        let v = setup_call(ctx, &http, req).await?;
        let id = v["account"]["id"]
            .as_str()
            .ok_or("account without id")?
            .to_string();
        let secret = v["account"]["webhookSecret"]
            .as_str()
            .unwrap_or("")
            .to_string();
        ctx.state.add_secret(idx, &secret, Some((0, 0)));
        let n_keys = if *wholesale { clients } else { 1 };
        let mut keys = Vec::new();
        for _ in 0..n_keys {
            let req = Req::new(
                "setup",
                Method::POST,
                format!("/admin/accounts/{id}/api-keys"),
                0,
                usize::MAX,
            )
            .auth(Auth::Admin)
            .json(&json!({"scopes": SCOPES}));
            let v = setup_call(ctx, &http, req).await?;
            keys.push(
                v["apiKey"]["key"]
                    .as_str()
                    .ok_or("apiKey without key")?
                    .to_string(),
            );
        }
        if *funds > 0 {
            fund(ctx, &http, idx, &id, *funds, format!("{tag}-fund-{idx}")).await?;
        }
        // The rotation owner: the first client whose home is this account (one writer at a
        // time, so a 503's "nothing changed" can be checked exactly).
        let rotation_owner = (0..clients).find(|c| home_of(*c) == idx);
        accounts.push(Account {
            idx,
            id,
            region,
            client_keys: keys,
            rotation_owner,
        });
    }
    if ctx.cfg.profile == "near-limits" {
        edge_setup(ctx, &http, &mut accounts).await?;
    }
    *ctx.state.accounts.write().unwrap() = accounts;
    ctx.state
        .pollers
        .lock()
        .unwrap()
        .resize(clients, Poller::default());
    Ok(())
}

/// A keyed credit of the setup (held by the model like any other).
async fn fund(
    ctx: &Arc<Ctx>,
    http: &reqwest::Client,
    idx: usize,
    id: &str,
    amount: i64,
    key: String,
) -> Result<(), String> {
    let body: Arc<[u8]> = Arc::from(
        json!({"amount": amount, "reason": key})
            .to_string()
            .into_bytes(),
    );
    let path = format!("/admin/accounts/{id}/credits");
    let req = Req::new("setup", Method::POST, path.clone(), 0, usize::MAX)
        .auth(Auth::Admin)
        .key(key.clone())
        .body(body.clone());
    // The funding is a keyed write like any other: the model holds it too.
    ctx.state
        .keys
        .lock()
        .unwrap()
        .on_send(&key, || KeyRecord::new(idx, "credit", "POST", path, body));
    let r = http::send(ctx, http, &req).await;
    let findings = ctx.state.keys.lock().unwrap().on_answer(
        &key,
        &r.outcome(),
        &key,
        amount,
        r.start_ms,
        r.end_ms,
        &crate::model::Rewinds::default(),
    );
    report(ctx, findings);
    if !r.ok() {
        return Err(format!("setup: funding account {idx}: {}", r.describe()));
    }
    Ok(())
}

/// One API key of every scope for account `id` (its plaintext).
async fn make_key(ctx: &Arc<Ctx>, http: &reqwest::Client, id: &str) -> Result<String, String> {
    let req = Req::new(
        "setup",
        Method::POST,
        format!("/admin/accounts/{id}/api-keys"),
        0,
        usize::MAX,
    )
    .auth(Auth::Admin)
    .json(&json!({"scopes": SCOPES}));
    let v = setup_call(ctx, http, req).await?;
    v["apiKey"]["key"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "apiKey without key".to_string())
}

/// A request of the setup that the rules must refuse with a 422 (nothing written).
async fn setup_refused(ctx: &Arc<Ctx>, http: &reqwest::Client, req: Req, what: &str) {
    let r = http::send(ctx, http, &req).await;
    ctx.check();
    if r.status != Some(422) {
        ctx.violation(
            "edge-answer",
            &format!("{what}: expected 422, got {}", r.describe()),
        );
    }
}

/// near-limits: the catalog's products at the bounds (and one past them refused), and each
/// client's own accounts: one with no credit line and one with the largest (a line past it
/// refused), each funded with 10^12, and the one carried over (restored before the instances
/// started: `restore_carried`), each with one key.
async fn edge_setup(
    ctx: &Arc<Ctx>,
    http: &reqwest::Client,
    accounts: &mut Vec<Account>,
) -> Result<(), String> {
    let tag = run_tag(ctx.cfg.seed);
    for (id, price) in EDGE_PRODUCTS {
        let req = Req::new(
            "setup",
            Method::PUT,
            format!("/admin/products/{id}"),
            0,
            usize::MAX,
        )
        .auth(Auth::Admin)
        .json(&json!({"name": format!("torture {id}"), "price": price, "regions": [], "deliveryFields": [], "active": true}));
        setup_call(ctx, http, req).await?;
    }
    let req = Req::new("setup", Method::PUT, "/admin/products/tp-max", 0, usize::MAX)
        .auth(Auth::Admin)
        .json(&json!({"name": "torture tp-max", "price": MAX_AMOUNT + 1, "regions": [], "deliveryFields": [], "active": true}));
    setup_refused(ctx, http, req, "a product priced 10^12 + 1").await;
    let req = Req::new("setup", Method::POST, "/admin/accounts", 0, usize::MAX)
        .auth(Auth::Admin)
        .json(&json!({"name": format!("{tag}-edge-over"), "wholesale": true, "creditLimit": MAX_AMOUNT + 1, "region": "EU"}));
    setup_refused(ctx, http, req, "an account with a credit line of 10^12 + 1").await;
    // The product refused at 10^12 + 1 kept its price.
    let hot_key = accounts[HOT].client_keys[0].clone();
    let req = Req::new(
        "setup",
        Method::GET,
        "/b2b/products?limit=100",
        0,
        usize::MAX,
    )
    .auth(Auth::Key(hot_key));
    let v = setup_call(ctx, http, req).await?;
    let price = v["products"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["id"] == "tp-max"))
        .and_then(|p| p["price"].as_i64());
    ctx.check();
    if price != Some(MAX_AMOUNT) {
        ctx.violation(
            "edge-answer",
            &format!("tp-max after a PUT at 10^12 + 1 refused: price {price:?}, want {MAX_AMOUNT}"),
        );
    }
    let mut sets = Vec::new();
    for c in 0..ctx.cfg.clients {
        let mut set = [0usize; 2];
        for (k, (suffix, line)) in [("plain", 0), ("line", MAX_AMOUNT)].into_iter().enumerate() {
            let req = Req::new("setup", Method::POST, "/admin/accounts", 0, usize::MAX)
                .auth(Auth::Admin)
                .json(&json!({"name": format!("{tag}-edge-{suffix}-c{c}"), "wholesale": true, "creditLimit": line, "region": "EU"}));
            let v = setup_call(ctx, http, req).await?;
            let id = v["account"]["id"]
                .as_str()
                .ok_or("account without id")?
                .to_string();
            let secret = v["account"]["webhookSecret"].as_str().unwrap_or("");
            let idx = accounts.len();
            ctx.state.add_secret(idx, secret, Some((0, 0)));
            let key = make_key(ctx, http, &id).await?;
            fund(ctx, http, idx, &id, MAX_AMOUNT, format!("{tag}-fund-{idx}")).await?;
            accounts.push(Account {
                idx,
                id,
                region: "EU",
                client_keys: vec![key],
                rotation_owner: None,
            });
            set[k] = idx;
        }
        let id = carried_id(ctx.cfg.seed, c);
        let idx = accounts.len();
        ctx.state.add_secret(idx, CARRIED_SECRET, Some((0, 0)));
        let key = make_key(ctx, http, &id).await?;
        accounts.push(Account {
            idx,
            id,
            region: "EU",
            client_keys: vec![key],
            rotation_owner: None,
        });
        sets.push(crate::state::EdgeSet {
            plain: set[0],
            credit: set[1],
            rich: idx,
        });
    }
    *ctx.state.edge.write().unwrap() = sets;
    Ok(())
}

/// The webhook secret of the carried-over accounts (32 zero bytes).
const CARRIED_SECRET: &str = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

/// The id of client `c`'s carried-over account.
pub fn carried_id(seed: u64, c: usize) -> String {
    format!("acc_0000{:012x}{:016x}", seed & 0xffff_ffff_ffff, c)
}

/// A backup of an earlier deployment, from before a credit was bounded (docs/contract.md: "a
/// restore of a deployment from before that bound is the likelier way to meet one"): one
/// account per client with a balance near i64's end (`CARRIED_BALANCE`) and the one ledger
/// entry that made it, in the documented format (JSON lines, the SHA-256 of every byte before
/// the last line in it).
pub fn carried_backup(seed: u64, clients: usize) -> Vec<u8> {
    let created = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
        - 86_400_000;
    let tag = run_tag(seed);
    let mut body = String::new();
    body.push_str(
        &json!({"kind": "header", "format": "orderly-backup", "version": 1, "createdAt": humantime::format_rfc3339_seconds(SystemTime::now() - Duration::from_secs(86_400)).to_string()}).to_string(),
    );
    body.push('\n');
    for c in 0..clients {
        let id = carried_id(seed, c);
        let account = json!({"kind": "account", "account": {"id": id, "name": format!("{tag}-carried-c{c}"), "wholesale": true, "credit_limit": 0, "region": "EU", "webhook_secret": CARRIED_SECRET, "created_at": created}, "balance": CARRIED_BALANCE});
        body.push_str(&account.to_string());
        body.push('\n');
        let entry = json!({"kind": "ledger", "account": id, "entry": {"id": format!("txn_0000{:012x}{:016x}", seed & 0xffff_ffff_ffff, c), "amount": CARRIED_BALANCE, "reason": "Credit", "reference": format!("{tag}-carried-over"), "balance_after": CARRIED_BALANCE, "created_at": created}});
        body.push_str(&entry.to_string());
        body.push('\n');
    }
    let digest: [u8; 32] = <Sha256 as sha2::Digest>::digest(body.as_bytes()).into();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let end =
        json!({"kind": "end", "counts": {"account": clients, "ledger": clients}, "sha256": hex});
    let mut out = body.into_bytes();
    out.extend_from_slice(end.to_string().as_bytes());
    out.push(b'\n');
    out
}

/// near-limits: the carried-over accounts restored (`orderly restore` of `carried_backup`)
/// into the run's empty store, before any instance starts. Returns a note.
pub async fn restore_carried(ctx: &Arc<Ctx>) -> Result<String, String> {
    let path = ctx.cfg.work.join("carried.backup");
    std::fs::write(&path, carried_backup(ctx.cfg.seed, ctx.cfg.clients))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let storage: Vec<String> = match (&ctx.cluster.data_dir, &ctx.cluster.pg) {
        (Some(d), _) => vec!["--data-dir".into(), d.display().to_string()],
        (None, Some(pg)) => vec!["--database-url".into(), pg.primary_role_url(&pg.db)],
        (None, None) => return Err("no store to restore into".into()),
    };
    let t = Instant::now();
    // By the build the instances start on: with rolling-upgrade, the earlier one (a store the
    // newer build created, compressed, is one the build before compressed stores cannot open).
    let bin = ctx.cluster.spawner.old_bin.as_ref().unwrap_or(&ctx.cfg.bin);
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("restore")
        .arg("--from")
        .arg(&path)
        .args(&storage)
        .stdin(std::process::Stdio::null())
        .env("RUST_LOG", "warn");
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .map_err(|_| {
            "orderly restore of the carried-over accounts: no end within 120 s".to_string()
        })?
        .map_err(|e| format!("orderly restore: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "orderly restore of the carried-over accounts exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(format!(
        "near-limits: {} accounts carried over from an earlier deployment (balance {CARRIED_BALANCE}, i64's end less {}) restored in {:.1} s",
        ctx.cfg.clients,
        i64::MAX - CARRIED_BALANCE,
        t.elapsed().as_secs_f64()
    ))
}

/// A client's home account: the wholesale accounts but the bulk one, in turn.
pub fn home_of(client: usize) -> usize {
    [0, 1, 2, 3][client % 4]
}

pub fn report(ctx: &Ctx, findings: Vec<crate::model::Finding>) {
    for f in findings {
        ctx.violation(f.check, &f.detail);
    }
}

// ---------------------------------------------------------------------------------------------
// Prefill: a store large enough that a backup's walk takes seconds.

pub async fn prefill(ctx: &Arc<Ctx>, n: u64) -> Result<(), String> {
    if n == 0 {
        return Ok(());
    }
    let started = Instant::now();
    let tag = run_tag(ctx.cfg.seed);
    let acc = ctx.state.account(BULK);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..48usize {
        let ctx = ctx.clone();
        let next = next.clone();
        let failures = failures.clone();
        let tag = tag.clone();
        let api_key = acc.client_keys[w % acc.client_keys.len()].clone();
        tasks.push(tokio::spawn(async move {
            let http = http::client();
            let ninst = ctx.cluster.instances.len();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || ctx.stopping.load(Ordering::Relaxed) {
                    return;
                }
                if failures.load(Ordering::Relaxed) > 1000 {
                    return;
                }
                let key = format!("{tag}-pre-{i}");
                let body = json!({"items": [{"productId": "tp-gem", "quantity": 1}], "externalOrderId": key}).to_string().into_bytes();
                let req = Req::new("prefill", Method::POST, "/b2b/orders", (i as usize) % ninst, w)
                    .auth(Auth::Key(api_key.clone()))
                    .key(key.clone())
                    .body(Arc::from(body.clone()));
                let r = http::send(&ctx, &http, &req).await;
                if r.ok() && !r.replayed {
                    let v = r.json().unwrap_or(Value::Null);
                    let order_id = v["order"]["id"].as_str().unwrap_or("").to_string();
                    let total = v["order"]["total"].as_i64().unwrap_or(0);
                    let seq = {
                        let mut keys = ctx.state.keys.lock().unwrap();
                        keys.ack_seq += 1;
                        keys.ack_seq - 1
                    };
                    ctx.state.prefill_keys.lock().unwrap().push(PrefillKey { key, body, digest: r.digest(), order_id, total, seq });
                } else {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let done = ctx.state.prefill_keys.lock().unwrap().len();
    let secs = started.elapsed().as_secs_f64();
    let line = format!(
        "prefill: {done} of {n} orders in {secs:.1} s ({:.0}/s)",
        done as f64 / secs.max(0.001)
    );
    println!("torture: {line}");
    ctx.note(&line);
    if done == 0 {
        return Err("prefill: no order was acknowledged".into());
    }
    Ok(())
}
