//! The end-of-run checks, once the faults have stopped and every instance is ready: every
//! account's orders and ledger against what was acknowledged (never charged twice, never a
//! paid order lost, every ledger sums to its balance, cancels, refunds, credits and provider
//! payments each once), every acknowledged key replayed byte for byte, every "nothing was
//! changed" left without a trace, every delivered event received, every poller without a gap;
//! what a rewind of the database may have undone is not expected, and what it did undo is
//! counted (per kind). And the online checks of API keys on every instance: a key created works
//! at once, a key revoked is refused at once (docs/contract.md "A revoked key is refused by
//! every instance", "A created key works on every instance" and "When the database goes back
//! in time").

use crate::ctx::Ctx;
use crate::http::{Auth, Req};
use crate::model::{EndExpectation, Finding, Rewinds, Span};
use crate::rng::Rng;
use crate::setup::report;
use futures_util::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Every item of an admin list, following `nextCursor` (transient answers retried).
pub async fn list_all(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    path: &str,
    field: &str,
) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    let sep = if path.contains('?') { '&' } else { '?' };
    loop {
        let mut url = format!("{base}{path}{sep}limit=100");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let mut tries = 0;
        let v: Value = loop {
            tries += 1;
            let r = http
                .get(&url)
                .header("Authorization", format!("Bearer {token}"))
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => {
                    break r.json().await.map_err(|e| format!("{url}: {e}"))?
                }
                Ok(r) if tries >= 20 || r.status().is_client_error() => {
                    return Err(format!("{url}: {}", r.status()))
                }
                Err(e) if tries >= 20 => return Err(format!("{url}: {e}")),
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        };
        if let Some(items) = v[field].as_array() {
            out.extend(items.iter().cloned());
        }
        cursor = v["nextCursor"].as_str().map(str::to_string);
        if cursor.is_none() {
            return Ok(out);
        }
    }
}

/// One acknowledged key to send again.
#[derive(Clone, Debug)]
pub struct ReplayItem {
    pub key: String,
    pub account: usize,
    pub path: String,
    pub body: Vec<u8>,
    pub digest: [u8; 32],
}

/// The acknowledged keys (those acknowledged before `below_seq` when given), with a sample of the
/// prefill's (at most 5,000: they are many and alike). Acknowledgements a rewind may have undone
/// are left out (docs/contract.md "When the database goes back in time"): a backup taken in or
/// after a rewind's window holds a history that may not have them.
pub fn acked_items(ctx: &Ctx, below_seq: Option<u64>) -> Vec<ReplayItem> {
    let rw = ctx.state.rewinds();
    let mut items: Vec<ReplayItem> = {
        let keys = ctx.state.keys.lock().unwrap();
        keys.map
            .iter()
            .filter_map(|(k, r)| {
                let a = r.safe_ack(&rw)?;
                if below_seq.is_some_and(|s| a.seq >= s) {
                    return None;
                }
                Some(ReplayItem {
                    key: k.clone(),
                    account: r.account,
                    path: r.path.clone(),
                    body: r.body.to_vec(),
                    digest: a.digest,
                })
            })
            .collect()
    };
    items.sort_by(|a, b| a.key.cmp(&b.key));
    let bulk = crate::setup::BULK;
    let mut pre: Vec<ReplayItem> = ctx
        .state
        .prefill_keys
        .lock()
        .unwrap()
        .iter()
        .filter(|p| below_seq.is_none_or(|s| p.seq < s))
        .map(|p| ReplayItem {
            key: p.key.clone(),
            account: bulk,
            path: "/b2b/orders".into(),
            body: p.body.clone(),
            digest: p.digest,
        })
        .collect();
    if pre.len() > 5_000 {
        let mut rng = Rng::stream(
            ctx.cfg.seed,
            "prefill-sample",
            below_seq.unwrap_or(u64::MAX),
        );
        rng.shuffle(&mut pre);
        pre.truncate(5_000);
    }
    items.extend(pre);
    items
}

/// Sends each item again to one of `bases`: it must be a 200 with `Idempotency-Replayed:
/// true` and the acknowledged bytes. Returns how many were not.
pub async fn direct_replay(
    ctx: &Arc<Ctx>,
    http: &reqwest::Client,
    base: &str,
    items: Vec<ReplayItem>,
    check: &'static str,
    label: &str,
) -> usize {
    direct_replay_many(ctx, http, &[base.to_string()], items, check, label).await
}

pub async fn direct_replay_many(
    ctx: &Arc<Ctx>,
    http: &reqwest::Client,
    bases: &[String],
    items: Vec<ReplayItem>,
    check: &'static str,
    label: &str,
) -> usize {
    replay_inner(ctx, http, bases, items, Some(check), label)
        .await
        .0
}

/// As `direct_replay`, reporting nothing: how many did not replay, and the first few of them
/// (a caller that judges the whole, as restore-swap does).
pub async fn replay_quietly(
    ctx: &Arc<Ctx>,
    http: &reqwest::Client,
    base: &str,
    items: Vec<ReplayItem>,
) -> (usize, Vec<String>) {
    replay_inner(ctx, http, &[base.to_string()], items, None, "").await
}

async fn replay_inner(
    ctx: &Arc<Ctx>,
    http: &reqwest::Client,
    bases: &[String],
    items: Vec<ReplayItem>,
    check: Option<&'static str>,
    label: &str,
) -> (usize, Vec<String>) {
    let bad = Arc::new(AtomicUsize::new(0));
    let examples: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    // A server that stopped answering would make every key wait its retries: after this many
    // in a row with no lasting answer, the rest are counted, not sent.
    let unanswered = Arc::new(AtomicUsize::new(0));
    let skipped = Arc::new(AtomicUsize::new(0));
    let n = bases.len().max(1);
    futures_util::stream::iter(items.into_iter().enumerate())
        .for_each_concurrent(16, |(i, it)| {
            let base = bases[i % n].clone();
            let bad = bad.clone();
            let examples = examples.clone();
            let unanswered = unanswered.clone();
            let skipped = skipped.clone();
            let ctx = ctx.clone();
            let http = http.clone();
            let label = label.to_string();
            async move {
                if unanswered.load(Ordering::Relaxed) >= 50 {
                    skipped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let answer = send_again(&ctx, &http, &base, &it).await;
                if answer.is_err() {
                    unanswered.fetch_add(1, Ordering::Relaxed);
                } else {
                    unanswered.store(0, Ordering::Relaxed);
                }
                ctx.check();
                let wrong = match &answer {
                    Ok((200, true, body)) => {
                        let d: [u8; 32] = Sha256::digest(body).into();
                        (d != it.digest)
                            .then(|| format!("other bytes: {}", crate::history::excerpt(body, 160)))
                    }
                    Ok((s, rp, body)) => Some(format!(
                        "{s} (replayed={rp}) {}",
                        crate::history::excerpt(body, 160)
                    )),
                    Err(e) => Some(e.clone()),
                };
                if let Some(w) = wrong {
                    bad.fetch_add(1, Ordering::Relaxed);
                    let line = format!("key {} ({}) acknowledged, now: {w}", it.key, it.path);
                    match check {
                        Some(check) => ctx.violation(check, &format!("{label}: {line}")),
                        None => {
                            let mut e = examples.lock().unwrap();
                            if e.len() < 3 {
                                e.push(line);
                            }
                        }
                    }
                }
            }
        })
        .await;
    let sk = skipped.load(Ordering::Relaxed);
    if sk > 0 {
        let line = format!("50 keys in a row got no lasting answer; {sk} more were not sent");
        match check {
            Some(check) => ctx.violation(check, &format!("{label}: {line}")),
            None => examples.lock().unwrap().push(line),
        }
    }
    let examples = std::mem::take(&mut *examples.lock().unwrap());
    (bad.load(Ordering::Relaxed) + sk, examples)
}

/// One request with a key's recorded body, retried while the answer is transient.
async fn send_again(
    ctx: &Ctx,
    http: &reqwest::Client,
    base: &str,
    it: &ReplayItem,
) -> Result<(u16, bool, Vec<u8>), String> {
    let mut last = String::new();
    for _ in 0..8 {
        let mut b = http
            .post(format!("{base}{}", it.path))
            .header("X-Idempotency-Key", &it.key);
        if it.path.starts_with("/admin/") {
            b = b.header(
                "Authorization",
                format!("Bearer {}", ctx.cluster.admin_token),
            );
        } else {
            b = b.header(
                "X-Api-Key",
                ctx.state.account(it.account).client_keys[0].clone(),
            );
        }
        if !it.body.is_empty() {
            b = b
                .header("Content-Type", "application/json")
                .body(it.body.clone());
        }
        match b.send().await {
            Ok(r) => {
                let s = r.status().as_u16();
                let rp = r
                    .headers()
                    .get("idempotency-replayed")
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                let body = r.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
                let in_progress = s == 409
                    && String::from_utf8_lossy(&body).contains("Duplicate request in progress");
                if s < 500 && !in_progress {
                    return Ok((s, rp, body));
                }
                last = format!("{s} {}", crate::history::excerpt(&body, 120));
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!("no lasting answer after 8 tries: {last}"))
}

// ---------------------------------------------------------------------------------------------
// One account's orders and ledger against what was acknowledged (pure).

#[derive(Clone, Debug, Default)]
pub struct AccountData {
    pub id: String,
    pub balance: i64,
    /// As listed (newest first).
    pub orders: Vec<Value>,
    /// As listed (newest first).
    pub ledger: Vec<Value>,
}

#[derive(Clone, Debug, Default)]
pub struct Expected {
    /// Acknowledged orders of this account: order id -> (key, total).
    pub orders: HashMap<String, (String, i64)>,
    /// Orders whose cancel was acknowledged.
    pub cancelled: HashSet<String>,
    /// Acknowledged refunds: refund id -> amount.
    pub refunds: HashMap<String, i64>,
    /// Acknowledged credits: key (the entry's reference) -> amount.
    pub credits: HashMap<String, i64>,
    /// Acknowledged provider payments: provider id -> amount.
    pub providers: HashMap<String, i64>,
    /// Order keys that must have no order (only "nothing was written" answers): key -> why.
    pub no_order: HashMap<String, String>,
    /// Credit keys that must have no entry.
    pub no_credit: HashMap<String, String>,
    /// near-limits: writes a rule refused (nothing written), which must never show: what
    /// (`order`: an externalOrderId, `credit`: a reference, `provider`: a provider's id), the
    /// reference, and the request.
    pub refused: Vec<(&'static str, String, String)>,
}

fn s(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or("").to_string()
}

/// What the end check could not say of the heads answered during the run.
#[derive(Default)]
struct HeadsNotOnTheChain {
    /// A rewind may have undone them.
    lost: u64,
    /// The run ended on the earlier build (rolling-upgrade), whose answers carry no chain:
    /// the entry of the head's seq is there, its hash is not shown.
    unjudged: u64,
}

/// Every ledger head a balance of account `idx` answered is on its final chain (the entry of
/// its seq has its hash), unless a rewind may have undone it, or the final entries come from
/// a build before chained ledgers (both counted in `not_on`).
fn heads_on_the_chain(
    ctx: &Arc<Ctx>,
    idx: usize,
    d: &AccountData,
    rw: &Rewinds,
    not_on: &mut HeadsNotOnTheChain,
) {
    let heads: Vec<crate::state::SeenHead> = {
        let all = ctx.state.heads.lock().unwrap();
        all.0.iter().filter(|h| h.account == idx).cloned().collect()
    };
    let oldest_first: Vec<&Value> = d.ledger.iter().rev().collect();
    for head in heads {
        ctx.check();
        let entry = match head.seq {
            0 => continue,
            seq => oldest_first.get(seq as usize - 1),
        };
        if entry.is_some_and(|e| e["hash"].as_str() == Some(head.hash.as_str())) {
            continue;
        }
        if entry.is_some_and(|e| e.get("hash").is_none()) {
            not_on.unjudged += 1;
        } else if rw.at_risk(head.span) {
            not_on.lost += 1;
        } else {
            ctx.violation(
                "ledger-head-lost",
                &format!(
                    "account {}: a balance answered at {:?} had ledgerHead seq {} hash {}, not on the final chain ({} entries)",
                    d.id, head.span, head.seq, head.hash, oldest_first.len()
                ),
            );
        }
    }
}

fn chain_field(hasher: &mut Sha256, text: &str) {
    hasher.update((text.len() as u32).to_be_bytes());
    hasher.update(text.as_bytes());
}

fn chain_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first account's ledger entry (oldest first) that is not the next link of the chain:
/// its `seq` the next, its `previousHash` the hash before (the genesis of the account for the
/// first), its `hash` what the documented encoding gives. Entries an earlier build wrote
/// (rolling-upgrade) have no chain yet, and may only be the newest.
pub fn chain_break(account: &str, oldest_first: &[&Value]) -> Option<String> {
    let mut hasher = Sha256::new();
    for text in ["orderly-ledger-v1", "genesis", account] {
        chain_field(&mut hasher, text);
    }
    let mut previous = chain_hex(&hasher.finalize());
    let mut unchained_from = None;
    for (i, x) in oldest_first.iter().enumerate() {
        let id = s(x, "id");
        if x["seq"].is_null() {
            unchained_from.get_or_insert(i);
            continue;
        }
        if let Some(first) = unchained_from {
            return Some(format!(
                "entry {id} (seq {}) is chained after an entry without a chain ({} from the oldest)",
                x["seq"], first + 1
            ));
        }
        if x["seq"].as_u64() != Some(i as u64 + 1) {
            return Some(format!(
                "entry {id} is seq {}, the {}th entry",
                x["seq"],
                i + 1
            ));
        }
        if x["previousHash"].as_str() != Some(previous.as_str()) {
            return Some(format!(
                "entry {id} (seq {}) does not link to the hash before it",
                i + 1
            ));
        }
        let mut hasher = Sha256::new();
        let number = |name: &str| x[name].as_i64().map(|n| n.to_string()).unwrap_or_default();
        for text in [
            "orderly-ledger-v1".to_string(),
            account.to_string(),
            id.clone(),
            (i + 1).to_string(),
            number("amount"),
            s(x, "reason"),
            s(x, "reference"),
            number("balanceAfter"),
            s(x, "createdAt"),
            previous.clone(),
        ] {
            chain_field(&mut hasher, &text);
        }
        let hash = chain_hex(&hasher.finalize());
        if x["hash"].as_str() != Some(hash.as_str()) {
            return Some(format!(
                "entry {id} (seq {}): its hash is not what its fields give",
                i + 1
            ));
        }
        previous = hash;
    }
    None
}

pub fn check_account(d: &AccountData, e: &Expected) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut f = |check: &'static str, detail: String| {
        out.push(Finding {
            check,
            detail: format!("account {}: {detail}", d.id),
        })
    };
    // The ledger sums to the balance, and each entry's balanceAfter follows from the ones
    // before it (oldest first).
    let sum: i64 = d
        .ledger
        .iter()
        .map(|x| x["amount"].as_i64().unwrap_or(0))
        .sum();
    if sum != d.balance {
        f(
            "ledger-sum",
            format!(
                "ledger sums to {sum}, balance is {} ({} entries)",
                d.balance,
                d.ledger.len()
            ),
        );
    }
    let mut running = 0i64;
    let oldest_first: Vec<&Value> = d.ledger.iter().rev().collect();
    for (i, x) in oldest_first.iter().enumerate() {
        running += x["amount"].as_i64().unwrap_or(0);
        if x["balanceAfter"].as_i64() != Some(running) {
            let around: Vec<String> = oldest_first
                [i.saturating_sub(2)..(i + 3).min(oldest_first.len())]
                .iter()
                .map(|e| {
                    format!(
                        "{} {} {} after {} at {}",
                        s(e, "id"),
                        s(e, "reason"),
                        e["amount"],
                        e["balanceAfter"],
                        s(e, "createdAt")
                    )
                })
                .collect();
            f(
                "ledger-chain",
                format!("entry {} says balanceAfter {:?}, the entries up to it (oldest first) sum to {running}; around it: {}", s(x, "id"), x["balanceAfter"], around.join("; ")),
            );
            break;
        }
    }
    // The chain (docs/api.md "Verifying your ledger"), each hash recomputed here.
    if let Some(detail) = chain_break(&d.id, &oldest_first) {
        f("ledger-hash-chain", detail);
    }
    // Entries by reason and reference.
    let mut by: HashMap<(String, String), Vec<i64>> = HashMap::new();
    for x in &d.ledger {
        by.entry((s(x, "reason"), s(x, "reference")))
            .or_default()
            .push(x["amount"].as_i64().unwrap_or(0));
    }
    let get = |reason: &str, r: &str| {
        by.get(&(reason.to_string(), r.to_string()))
            .cloned()
            .unwrap_or_default()
    };
    // Orders: one per key, each with its one charge; cancels with their one credit back.
    let mut by_ext: HashMap<String, Vec<String>> = HashMap::new();
    let mut order_ids = HashSet::new();
    let mut refunded_total = 0i64;
    for o in &d.orders {
        let id = s(o, "id");
        order_ids.insert(id.clone());
        let ext = s(o, "externalOrderId");
        if !ext.is_empty() {
            by_ext.entry(ext).or_default().push(id.clone());
        }
        let total = o["total"].as_i64().unwrap_or(0);
        refunded_total += o["refundedAmount"].as_i64().unwrap_or(0);
        let charges = get("order", &id);
        if charges.len() > 1 {
            f(
                "charged-twice",
                format!("order {id} has {} charges {charges:?}", charges.len()),
            );
        } else if charges.first() != Some(&-total) {
            f(
                "order-charge",
                format!("order {id} (total {total}) has charges {charges:?}"),
            );
        }
        let cancels = get("cancel", &id);
        let cancelled = s(o, "status") == "cancelled";
        if cancelled && cancels != [total] {
            f(
                "cancel-entry",
                format!("cancelled order {id} (total {total}) has cancel entries {cancels:?}"),
            );
        }
        if !cancelled && !cancels.is_empty() {
            f(
                "cancel-entry",
                format!(
                    "order {id} is {} but has cancel entries {cancels:?}",
                    s(o, "status")
                ),
            );
        }
    }
    for (ext, ids) in &by_ext {
        if ids.len() > 1 {
            f(
                "charged-twice",
                format!(
                    "externalOrderId {ext} (one idempotency key) has {} orders: {ids:?}",
                    ids.len()
                ),
            );
        }
        if let Some(why) = e.no_order.get(ext) {
            f(
                "nothing-changed-visible",
                format!("key {ext}: {why}, yet order {:?} exists", ids),
            );
        }
    }
    for x in &d.ledger {
        if s(x, "reason") == "order" && !order_ids.contains(&s(x, "reference")) {
            f(
                "orphan-charge",
                format!(
                    "ledger entry {} charges {} for order {}, which is not listed",
                    s(x, "id"),
                    x["amount"],
                    s(x, "reference")
                ),
            );
        }
    }
    let by_id: HashMap<String, &Value> = d.orders.iter().map(|o| (s(o, "id"), o)).collect();
    for (id, (key, total)) in &e.orders {
        match by_id.get(id) {
            None => f(
                "order-lost",
                format!("order {id} (key {key}, total {total}) was acknowledged and is not listed"),
            ),
            Some(o) if o["total"].as_i64() != Some(*total) => f(
                "order-lost",
                format!(
                    "order {id} (key {key}) was acknowledged with total {total}, is listed with {}",
                    o["total"]
                ),
            ),
            _ => {}
        }
    }
    for id in &e.cancelled {
        if let Some(o) = by_id.get(id) {
            if s(o, "status") != "cancelled" {
                f(
                    "cancel-lost",
                    format!(
                        "order {id}'s cancel was acknowledged; it is {}",
                        s(o, "status")
                    ),
                );
            }
        }
    }
    // Refunds: the entries sum to what the orders say was refunded; each acknowledged one once.
    let refund_entries: i64 = d
        .ledger
        .iter()
        .filter(|x| s(x, "reason") == "refund")
        .map(|x| x["amount"].as_i64().unwrap_or(0))
        .sum();
    if refund_entries != refunded_total {
        f("refund-sum", format!("refund entries sum to {refund_entries}, the orders' refundedAmount to {refunded_total}"));
    }
    for (id, amount) in &e.refunds {
        let got = get("refund", id);
        if got != [*amount] {
            f(
                "refund-lost",
                format!("refund {id} ({amount}) was acknowledged; its entries are {got:?}"),
            );
        }
    }
    // Credits and provider payments: at most one entry per reference, each acknowledged one.
    for ((reason, r), amounts) in &by {
        if (reason == "credit" || reason == "provider_payment") && amounts.len() > 1 {
            let check = if reason == "credit" {
                "credit-twice"
            } else {
                "provider-credited-twice"
            };
            f(
                check,
                format!("{reason} {r} has {} entries {amounts:?}", amounts.len()),
            );
        }
        if reason == "credit" {
            if let Some(why) = e.no_credit.get(r) {
                f(
                    "nothing-changed-visible",
                    format!("credit key {r}: {why}, yet it has entries {amounts:?}"),
                );
            }
        }
    }
    for (what, r, why) in &e.refused {
        let found = match *what {
            "order" => by_ext.get(r).map(|ids| format!("orders {ids:?}")),
            "credit" => by
                .get(&("credit".to_string(), r.clone()))
                .map(|a| format!("credit entries {a:?}")),
            _ => by
                .get(&("provider_payment".to_string(), r.clone()))
                .map(|a| format!("provider payment entries {a:?}")),
        };
        if let Some(found) = found {
            f(
                "edge-refused-visible",
                format!("{what} {r} ({why}) was refused by a rule, yet it has {found}"),
            );
        }
    }
    for (k, amount) in &e.credits {
        let got = get("credit", k);
        if got.is_empty() || got[0] != *amount {
            f(
                "credit-lost",
                format!("credit {k} ({amount}) was acknowledged; its entries are {got:?}"),
            );
        }
    }
    for (id, amount) in &e.providers {
        let got = get("provider_payment", id);
        if got.is_empty() || got[0] != *amount {
            f(
                "provider-lost",
                format!(
                    "provider payment {id} ({amount}) was acknowledged; its entries are {got:?}"
                ),
            );
        }
    }
    out
}

/// What the model expects of each account index (nothing a rewind may have undone).
fn expectations(ctx: &Ctx) -> HashMap<usize, Expected> {
    let rw = ctx.state.rewinds();
    let mut ex: HashMap<usize, Expected> = HashMap::new();
    {
        let keys = ctx.state.keys.lock().unwrap();
        for (k, r) in &keys.map {
            let e = ex.entry(r.account).or_default();
            match (r.op, r.safe_ack(&rw), r.end_expectation(&rw)) {
                ("order", Some(a), _) => {
                    e.orders.insert(a.object_id.clone(), (k.clone(), a.amount));
                }
                ("cancel", Some(a), _) => {
                    e.cancelled.insert(a.object_id.clone());
                }
                ("refund", Some(a), _) => {
                    e.refunds.insert(a.object_id.clone(), a.amount);
                }
                ("credit", Some(_), _) => {
                    let amount = serde_json::from_slice::<Value>(&r.body)
                        .ok()
                        .and_then(|v| v["amount"].as_i64())
                        .unwrap_or(0);
                    e.credits.insert(k.clone(), amount);
                }
                ("order", None, EndExpectation::NeverWritten) => {
                    e.no_order.insert(
                        k.clone(),
                        format!(
                            "only answers that said nothing was written ({} x 503)",
                            r.nothing_written
                        ),
                    );
                }
                ("credit", None, EndExpectation::NeverWritten) => {
                    e.no_credit.insert(
                        k.clone(),
                        format!(
                            "only answers that said nothing was written ({} x 503)",
                            r.nothing_written
                        ),
                    );
                }
                _ => {}
            }
        }
    }
    for p in ctx.state.prefill_keys.lock().unwrap().iter() {
        ex.entry(crate::setup::BULK)
            .or_default()
            .orders
            .insert(p.order_id.clone(), (p.key.clone(), p.total));
    }
    for (id, at) in ctx.state.cancelled.lock().unwrap().iter() {
        if rw.at_risk(*at) {
            continue;
        }
        // Unkeyed cancels: the order's account is found by listing; add to every account's
        // set is wrong, so they are checked against the order list wherever the order is.
        for e in ex.values_mut() {
            e.cancelled.insert(id.clone());
        }
    }
    for r in ctx.state.edge_refused.lock().unwrap().iter() {
        ex.entry(r.account)
            .or_default()
            .refused
            .push((r.what, r.reference.clone(), r.why.clone()));
    }
    for (id, p) in ctx.state.providers.lock().unwrap().iter() {
        if p.answers.must_show(&rw) {
            ex.entry(p.account)
                .or_default()
                .providers
                .insert(id.clone(), p.amount);
        }
    }
    ex
}

/// Runs every end-of-run check against the live cluster.
pub async fn end_checks(ctx: &Arc<Ctx>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let bases: Vec<String> = ctx.cluster.instances.iter().map(|i| i.url()).collect();
    let base = bases[0].clone();
    let token = ctx.cluster.admin_token.clone();
    let rw = ctx.state.rewinds();
    // What the store holds after the run, for the count of what the rewinds undid.
    let mut finals: HashMap<usize, AccountData> = HashMap::new();
    let mut heads_not_on = HeadsNotOnTheChain::default();

    // 1. Orders and ledgers.
    let ex = expectations(ctx);
    let n = ctx.state.account_count();
    for idx in 0..n {
        let acc = ctx.state.account(idx);
        let data = async {
            let a: Value = http
                .get(format!("{base}/admin/accounts/{}", acc.id))
                .header("Authorization", format!("Bearer {token}"))
                .send()
                .await
                .map_err(|e| e.to_string())?
                .json()
                .await
                .map_err(|e| e.to_string())?;
            let orders = list_all(
                &http,
                &base,
                &token,
                &format!("/admin/accounts/{}/orders", acc.id),
                "orders",
            )
            .await?;
            let ledger = list_all(
                &http,
                &base,
                &token,
                &format!("/admin/accounts/{}/transactions", acc.id),
                "transactions",
            )
            .await?;
            Ok::<_, String>(AccountData {
                id: acc.id.clone(),
                balance: a["account"]["balance"].as_i64().unwrap_or(i64::MIN),
                orders,
                ledger,
            })
        }
        .await;
        match data {
            Ok(d) => {
                let e = ex.get(&idx).cloned().unwrap_or_default();
                ctx.checks((d.orders.len() + d.ledger.len()) as u64 + 1);
                let findings = check_account(&d, &e);
                report(ctx, findings);
                heads_on_the_chain(ctx, idx, &d, &rw, &mut heads_not_on);
                ctx.note(&format!(
                    "end: account {} ({}): {} orders, {} ledger entries, balance {}",
                    idx,
                    acc.id,
                    d.orders.len(),
                    d.ledger.len(),
                    d.balance
                ));
                if !rw.list.is_empty() {
                    finals.insert(idx, d);
                }
            }
            Err(e) => ctx.violation(
                "end-read",
                &format!("account {}: could not be read at the end: {e}", acc.id),
            ),
        }
    }

    let (seen, unkept) = {
        let heads = ctx.state.heads.lock().unwrap();
        (heads.0.len(), heads.1)
    };
    println!(
        "torture: end: {seen} ledger heads answered ({unkept} more not kept), each on its final chain but {} a rewind lost and {} not judged (the run ended on the earlier build, which shows no chain)",
        heads_not_on.lost, heads_not_on.unjudged
    );

    // 2. Every acknowledged key, again; every key that only heard "nothing was changed" must
    // not replay (orders and credits are judged by the ledger above; cancels and refunds here).
    let items = acked_items(ctx, None);
    let count = items.len();
    let bad = direct_replay_many(ctx, &http, &bases, items, "end-replay", "end of run").await;
    println!("torture: end: {count} acknowledged keys replayed, {bad} wrong");
    let never: Vec<(String, crate::model::KeyRecord)> = {
        let keys = ctx.state.keys.lock().unwrap();
        keys.map
            .iter()
            .filter(|(_, r)| {
                (r.op == "refund" || r.op == "cancel")
                    && r.end_expectation(&rw) == EndExpectation::NeverWritten
            })
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect()
    };
    for (i, (k, r)) in never.iter().enumerate() {
        let it = ReplayItem {
            key: k.clone(),
            account: r.account,
            path: r.path.clone(),
            body: r.body.to_vec(),
            digest: [0; 32],
        };
        let a = send_again(ctx, &http, &bases[i % bases.len()], &it).await;
        ctx.check();
        if let Ok((200, true, body)) = a {
            ctx.violation(
                "nothing-changed-visible",
                &format!(
                    "key {k} ({}): only 503s ({}), replayed at the end: {}",
                    r.path,
                    r.nothing_written,
                    crate::history::excerpt(&body, 120)
                ),
            );
        }
    }

    // 3. Unkeyed writes: revocations, account creations, rotations.
    let revocables: Vec<_> = ctx
        .state
        .revocables
        .lock()
        .unwrap()
        .values()
        .cloned()
        .collect();
    let mut lost = Losses::default();
    for (i, rv) in revocables.iter().enumerate() {
        let risky_revoke = rv.revokes.risky_oks(&rw) > 0 && !rv.revokes.must_show(&rw);
        let risky_create = rw.at_risk(rv.created);
        if !rv.revokes.must_show(&rw)
            && !rv.revokes.must_not_show()
            && !risky_revoke
            && !risky_create
        {
            continue;
        }
        let r = http
            .get(format!("{}/b2b/balance", bases[i % bases.len()]))
            .header("X-Api-Key", &rv.plaintext)
            .send()
            .await;
        let st = r.map(|r| r.status().as_u16()).unwrap_or(0);
        ctx.check();
        if rv.revokes.must_show(&rw) && st == 200 {
            ctx.violation(
                "revoked-key-accepted",
                &format!(
                    "key {} was revoked (200) and authenticates at the end",
                    rv.key_id
                ),
            );
        }
        if rv.revokes.must_not_show() && st == 401 && !risky_create {
            ctx.violation(
                "nothing-changed-visible",
                &format!(
                    "key {}: its revocation only answered 503 ({}), yet it is refused at the end",
                    rv.key_id, rv.revokes.nothing
                ),
            );
        }
        if risky_revoke {
            lost.add("key revocation", st == 200);
        }
        if risky_create && st != 200 {
            // Refused: revoked, or never created in the history that remains. Revoking it
            // again tells (404: no such key); nothing is judged after this.
            let d = http
                .delete(format!("{base}/admin/api-keys/{}", rv.key_id))
                .header("Authorization", format!("Bearer {token}"))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0);
            lost.add("key creation", d == 404);
        } else if risky_create {
            lost.add("key creation", false);
        }
    }
    let created: Vec<(String, crate::model::Unkeyed)> = ctx
        .state
        .created
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    match list_all(&http, &base, &token, "/admin/accounts", "accounts").await {
        Ok(all) => {
            let mut count: HashMap<String, u32> = HashMap::new();
            for a in &all {
                *count.entry(s(a, "name")).or_insert(0) += 1;
            }
            for (name, u) in &created {
                let found = count.get(name).copied().unwrap_or(0);
                ctx.check();
                if !u.allowed(found, &rw) {
                    let check = if found > u.ok + u.unknown {
                        "nothing-changed-visible"
                    } else {
                        "account-lost"
                    };
                    ctx.violation(check, &format!("account name {name}: {found} accounts; answers: {} x 200 ({} of them in a rewind's window), {} unknown, {} x 503", u.ok, u.risky_oks(&rw), u.unknown, u.nothing));
                }
                if u.risky_oks(&rw) > 0 && !u.must_show(&rw) {
                    lost.add("account creation", found == 0);
                }
            }
        }
        Err(e) => ctx.violation("end-read", &format!("accounts: {e}")),
    }
    for idx in 0..n {
        let acc = ctx.state.account(idx);
        let known = ctx.state.current_secret(idx);
        let latest = ctx
            .state
            .secrets
            .lock()
            .unwrap()
            .get(&idx)
            .and_then(|s| s.rotations.iter().max_by_key(|r| r.1 .1).cloned());
        let r = http
            .get(format!("{base}/admin/accounts/{}", acc.id))
            .header("Authorization", format!("Bearer {token}"))
            .send()
            .await;
        if let Ok(r) = r {
            if let Ok(v) = r.json::<Value>().await {
                let now = s(&v["account"], "webhookSecret");
                ctx.check();
                if let Some(known) = known {
                    if !now.is_empty() && now != known {
                        ctx.violation("nothing-changed-visible", &format!("account {}: its webhook secret changed although no rotation the model knows of says so", acc.id));
                    }
                }
                if let Some((secret, at)) = latest.filter(|l| rw.at_risk(l.1)) {
                    // The latest rotation was answered in a rewind's window: undone if the
                    // secret is not the one it answered.
                    let _ = at;
                    lost.add("webhook secret rotation", !now.is_empty() && now != secret);
                }
                ctx.state.add_secret(idx, &now, None);
            }
        }
    }

    // 4. Webhooks: every delivered event was received; signatures that failed are judged with
    // every secret now known.
    // Read the receiver's record after each list: the receiver records a POST before it answers
    // 200, so anything listed `delivered` is recorded by then.
    let mut delivered_total = 0;
    // Taken again only when an event is missing from it (one set per account made the check
    // quadratic in the deliveries of a long run).
    let mut received = ctx.receiver.received_ids();
    for idx in 0..n {
        let acc = ctx.state.account(idx);
        match list_all(
            &http,
            &base,
            &token,
            &format!("/admin/accounts/{}/events?delivery=delivered", acc.id),
            "events",
        )
        .await
        {
            Ok(evs) => {
                for ev in evs {
                    delivered_total += 1;
                    let id = s(&ev, "id");
                    ctx.check();
                    if !received.contains(&id) {
                        received = ctx.receiver.received_ids();
                    }
                    if !received.contains(&id) {
                        ctx.violation(
                            "webhook-delivered-unseen",
                            &format!(
                                "event {id} of account {} is delivered, the receiver never got it",
                                acc.id
                            ),
                        );
                    }
                }
            }
            Err(e) => ctx.violation("end-read", &format!("events of {}: {e}", acc.id)),
        }
    }
    let unverified = std::mem::take(&mut *ctx.receiver.unverified.lock().unwrap());
    for u in unverified {
        ctx.check();
        if !crate::receiver::verify(
            &ctx.state.secrets_of(u.account),
            &u.id,
            &u.timestamp,
            &u.body,
            &u.signatures,
        ) {
            ctx.violation(
                "webhook-signature",
                &format!(
                    "webhook {} to account {}: no signature matches a secret the account has had",
                    u.id, u.account
                ),
            );
        }
    }
    ctx.note(&format!(
        "end: {delivered_total} events delivered, {} webhook-ids received",
        ctx.receiver.received_ids().len()
    ));

    // 5. The pollers of /b2b/events?after=: nothing before their last cursor missed. Events
    // listed in a rewind's window may be gone: a poller that did not start over after it is
    // judged up to the last event listed before it.
    let pollers = ctx.state.pollers.lock().unwrap().clone();
    let probes = ctx.state.cursor_probes.lock().unwrap().clone();
    let mut lists: HashMap<usize, Vec<String>> = HashMap::new();
    let wanted: HashSet<usize> = pollers
        .iter()
        .filter(|p| !p.seen.is_empty())
        .map(|p| p.account)
        .chain(probes.iter().map(|p| p.account))
        .collect();
    for account in wanted {
        let acc = ctx.state.account(account);
        if let Ok(evs) = list_all(
            &http,
            &base,
            &token,
            &format!("/admin/accounts/{}/events", acc.id),
            "events",
        )
        .await
        {
            lists.insert(account, evs.iter().map(|e| s(e, "id")).collect());
        }
    }
    for (c, p) in pollers.iter().enumerate() {
        let keep = p
            .seen_at
            .iter()
            .position(|at| rw.at_risk(*at))
            .unwrap_or(p.seen.len());
        let (Some(all), Some(last)) = (lists.get(&p.account), p.seen[..keep].last()) else {
            continue;
        };
        let Some(pos) = all.iter().position(|x| x == last) else {
            ctx.violation(
                "events-poller-missed",
                &format!("client {c}: its last event {last} is not in the final list"),
            );
            continue;
        };
        let seen: HashSet<&String> = p.seen[..keep].iter().collect();
        let missed: Vec<&String> = all[..=pos].iter().filter(|x| !seen.contains(x)).collect();
        ctx.check();
        if !missed.is_empty() {
            ctx.violation(
                "events-poller-missed",
                &format!("client {c}: {} events before its cursor {last} were never listed to it (first: {})", missed.len(), missed[0]),
            );
        }
    }

    // 6. What the rewinds undid: each acknowledged write they may have undone, looked up in
    // the store as it is now.
    if rw.list.is_empty() {
        return;
    }
    let restarts: u32 = pollers.iter().map(|p| p.restarts).sum();
    for p in &probes {
        let gone = lists
            .get(&p.account)
            .is_some_and(|all| !all.contains(&p.cursor));
        let line = format!(
            "history-rewind: a poller's cursor {} ({}) sent as after= at {} ms: {}",
            p.cursor,
            if gone {
                "an event the rewind lost"
            } else {
                "an event still there"
            },
            p.at_ms,
            p.answer
        );
        ctx.note(&line);
    }
    let gone_probes: Vec<&crate::state::CursorProbe> = probes
        .iter()
        .filter(|p| {
            lists
                .get(&p.account)
                .is_some_and(|all| !all.contains(&p.cursor))
        })
        .collect();
    if let Some(p) = gone_probes.first() {
        let line = format!(
            "history-rewind: pollers started over {restarts} times; after= of an event the rewind lost ({} of {} cursors probed) answered: {}",
            gone_probes.len(),
            probes.len(),
            p.answer
        );
        ctx.summary_line(&line);
    }
    let keys: Vec<crate::model::KeyRecord> = ctx
        .state
        .keys
        .lock()
        .unwrap()
        .map
        .values()
        .cloned()
        .collect();
    let present =
        |account: usize, f: &dyn Fn(&AccountData) -> bool| finals.get(&account).is_some_and(f);
    let order_status = |account: usize, id: &str| -> Option<String> {
        finals
            .get(&account)
            .and_then(|d| d.orders.iter().find(|o| s(o, "id") == id))
            .map(|o| s(o, "status"))
    };
    for r in &keys {
        for a in r.risky_acks(&rw) {
            let undone = match r.op {
                "order" => !present(r.account, &|d| {
                    d.orders.iter().any(|o| s(o, "id") == a.object_id)
                }),
                "cancel" => order_status(r.account, &a.object_id).as_deref() != Some("cancelled"),
                "refund" => !present(r.account, &|d| {
                    d.ledger
                        .iter()
                        .any(|x| s(x, "reason") == "refund" && s(x, "reference") == a.object_id)
                }),
                "credit" => !present(r.account, &|d| {
                    d.ledger
                        .iter()
                        .any(|x| s(x, "reason") == "credit" && s(x, "reference") == a.object_id)
                }),
                _ => continue,
            };
            lost.add(
                match r.op {
                    "order" => "order",
                    "cancel" => "cancel (keyed)",
                    "refund" => "refund",
                    _ => "credit",
                },
                undone,
            );
        }
    }
    for (id, at) in ctx.state.cancelled.lock().unwrap().iter() {
        if rw.at_risk(*at) {
            let cancelled = finals.values().any(|d| {
                d.orders
                    .iter()
                    .any(|o| s(o, "id") == *id && s(o, "status") == "cancelled")
            });
            lost.add("cancel (no key)", !cancelled);
        }
    }
    for (id, p) in ctx.state.providers.lock().unwrap().iter() {
        if p.answers.risky_oks(&rw) > 0 && !p.answers.must_show(&rw) {
            let there = present(p.account, &|d| {
                d.ledger
                    .iter()
                    .any(|x| s(x, "reason") == "provider_payment" && s(x, "reference") == *id)
            });
            lost.add("provider payment", !there);
        }
    }
    let line = format!(
        "history-rewind: {} rewinds; acknowledged writes in their windows, undone/at risk: {}; revocations soon after a rewind whose key an instance still accepted for a while (within the 2 s grace): {}",
        rw.list.len(),
        lost.show(),
        ctx.tally.rewind_grace_used.load(Ordering::Relaxed)
    );
    ctx.summary_line(&line);
}

/// Per kind of write: how many acknowledged ones a rewind may have undone, and how many it did.
#[derive(Default)]
pub struct Losses(std::collections::BTreeMap<&'static str, (u32, u32)>);

impl Losses {
    pub fn add(&mut self, kind: &'static str, undone: bool) {
        let e = self.0.entry(kind).or_insert((0, 0));
        e.1 += 1;
        if undone {
            e.0 += 1;
        }
    }

    pub fn show(&self) -> String {
        if self.0.is_empty() {
            return "none".into();
        }
        self.0
            .iter()
            .map(|(k, (l, n))| format!("{k} {l}/{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

// --------------------------------------------------------------------------------------------- API
// keys on every instance, as they are answered (docs/contract.md "A revoked key is refused by every
// instance", and "When the database goes back in time").

/// The instances running and not paused now.
fn live_instances(ctx: &Ctx) -> Vec<usize> {
    ctx.cluster
        .instances
        .iter()
        .filter(|i| i.is_live())
        .map(|i| i.idx)
        .collect()
}

/// Where `t` stands against the last rewind that ended before it (for the evidence).
fn after_rewind(rw: &Rewinds, t: u64) -> String {
    match rw
        .list
        .iter()
        .filter_map(|r| r.w1.filter(|w1| *w1 <= t).map(|w1| (r.w0, w1)))
        .next_back()
    {
        Some((w0, w1)) => format!(
            " ({} ms after the end of the rewind [{w0}, {w1}] ms)",
            t - w1
        ),
        None => String::new(),
    }
}

/// A key whose creation was answered 200 authenticates on every live instance, at once: a 401
/// is `created-key-refused` (unless a rewind may have undone the creation).
pub async fn created_key_works(
    ctx: &Arc<Ctx>,
    http: &reqwest::Client,
    client: usize,
    key_id: &str,
    plaintext: &str,
    created: Span,
) {
    for idx in live_instances(ctx) {
        let req = Req::new("key.use", reqwest::Method::GET, "/b2b/balance", idx, client)
            .auth(Auth::Key(plaintext.to_string()));
        let r = crate::http::send(ctx, http, &req).await;
        ctx.check();
        let rw = ctx.state.rewinds();
        if r.status == Some(401) && !rw.at_risk(created) {
            ctx.violation(
                "created-key-refused",
                &format!(
                    "key {key_id}, created (200: sent at {} ms, answered at {} ms), answered 401 on instance {idx} at {} ms{}",
                    created.0,
                    created.1,
                    r.end_ms,
                    after_rewind(&rw, created.1)
                ),
            );
        }
    }
}

/// A key whose revocation was answered 200 is refused on every live instance, at once; a
/// revocation answered soon after a rewind's end gets `REWIND_REVOCATION_GRACE_MS` from its
/// answer, the key tried again every 100 ms meanwhile. A revocation a rewind may have undone
/// is not judged.
pub async fn revoked_key_refused(
    ctx: &Arc<Ctx>,
    http: &reqwest::Client,
    client: usize,
    key_id: &str,
    plaintext: &str,
    revoked: Span,
) {
    let rw = ctx.state.rewinds();
    if rw.at_risk(revoked) {
        return;
    }
    let grace = rw.revocation_grace_until(revoked);
    for idx in live_instances(ctx) {
        let mut first_accepted: Option<u64> = None;
        let mut transient = 0;
        loop {
            let req = Req::new(
                "key.check",
                reqwest::Method::GET,
                "/b2b/balance",
                idx,
                client,
            )
            .auth(Auth::Key(plaintext.to_string()));
            let r = crate::http::send(ctx, http, &req).await;
            ctx.check();
            match r.status {
                Some(401) => {
                    if let Some(t) = first_accepted {
                        ctx.tally.rewind_grace_used.fetch_add(1, Ordering::Relaxed);
                        ctx.note(&format!(
                            "key {key_id}, revoked at {} ms after a rewind, was accepted by instance {idx} until {t} ms, refused at {} ms (within the grace)",
                            revoked.1, r.end_ms
                        ));
                    }
                    break;
                }
                Some(s) if (200..300).contains(&s) => {
                    if grace.is_some_and(|g| r.end_ms < g) {
                        first_accepted.get_or_insert(r.end_ms);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    ctx.violation(
                        "revoked-key-accepted",
                        &format!(
                            "key {key_id} revoked (200: sent at {} ms, answered at {} ms), then answered {s} on instance {idx} at {} ms{}{}",
                            revoked.0,
                            revoked.1,
                            r.end_ms,
                            after_rewind(&rw, revoked.1),
                            if grace.is_some() { " (past its 2 s of grace)" } else { "" }
                        ),
                    );
                    break;
                }
                _ => {
                    // Down, restarting or busy: a moment, then give up on this instance.
                    transient += 1;
                    if transient > 10 || !ctx.cluster.instances[idx].is_live() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Right after a rewind: a sample (at most 20) of the keys whose revocation was answered before its
/// point `w0` must be refused on every instance (docs/contract.md "When the database goes back in
/// time": what was acknowledged before the point the database went back to is there). Returns a
/// note.
pub async fn revoked_before_rewind_refused(ctx: &Arc<Ctx>, w0: u64) -> String {
    let rw = ctx.state.rewinds();
    let mut sample: Vec<(String, String, Span)> = ctx
        .state
        .revocables
        .lock()
        .unwrap()
        .values()
        .filter_map(|rv| {
            rv.revokes
                .safe_oks(&rw)
                .into_iter()
                .find(|s| s.1 < w0)
                .map(|s| (rv.key_id.clone(), rv.plaintext.clone(), s))
        })
        .collect();
    sample.sort();
    let mut rng = Rng::stream(ctx.cfg.seed, "rewind-revoked-sample", w0);
    rng.shuffle(&mut sample);
    sample.truncate(20);
    let http = crate::http::client();
    let (mut refused, mut accepted, mut unanswered) = (0, 0, 0);
    for (key_id, plaintext, revoked) in &sample {
        for idx in 0..ctx.cluster.instances.len() {
            let until = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                if ctx.cluster.instances[idx].is_live() {
                    let req = Req::new(
                        "rewind.revoked-check",
                        reqwest::Method::GET,
                        "/b2b/balance",
                        idx,
                        usize::MAX,
                    )
                    .auth(Auth::Key(plaintext.clone()));
                    let r = crate::http::send(ctx, &http, &req).await;
                    ctx.check();
                    match r.status {
                        Some(401) => {
                            refused += 1;
                            break;
                        }
                        Some(s) if (200..300).contains(&s) => {
                            accepted += 1;
                            ctx.violation(
                                "revoked-key-accepted",
                                &format!(
                                    "key {key_id}, revoked (200 at {} ms) before the rewind point ({w0} ms), answered {s} on instance {idx} at {} ms, after the rewind",
                                    revoked.1, r.end_ms
                                ),
                            );
                            break;
                        }
                        _ => {}
                    }
                }
                if std::time::Instant::now() > until {
                    unanswered += 1;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    format!(
        "{} keys revoked before the rewind point tried on every instance after it: {refused} refused, {accepted} accepted, {unanswered} without a lasting answer within 20 s",
        sample.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn order(id: &str, ext: &str, total: i64, status: &str, refunded: i64) -> Value {
        json!({"id": id, "externalOrderId": ext, "total": total, "status": status, "refundedAmount": refunded})
    }

    fn entry(id: &str, amount: i64, reason: &str, reference: &str, after: i64) -> Value {
        json!({"id": id, "amount": amount, "reason": reason, "reference": reference, "balanceAfter": after})
    }

    fn healthy() -> (AccountData, Expected) {
        // Oldest last, as listed: credit 1000, order 300, cancel of a 200 order, refund 50.
        let d = AccountData {
            id: "acc_1".into(),
            balance: 750,
            orders: vec![
                order("ord_b", "kb", 200, "cancelled", 0),
                order("ord_a", "ka", 300, "completed", 50),
            ],
            ledger: vec![
                entry("txn_5", 50, "refund", "ref_1", 750),
                entry("txn_4", 200, "cancel", "ord_b", 700),
                entry("txn_3", -200, "order", "ord_b", 500),
                entry("txn_2", -300, "order", "ord_a", 700),
                entry("txn_1", 1000, "credit", "kc", 1000),
            ],
        };
        let mut e = Expected::default();
        e.orders.insert("ord_a".into(), ("ka".into(), 300));
        e.orders.insert("ord_b".into(), ("kb".into(), 200));
        e.cancelled.insert("ord_b".into());
        e.refunds.insert("ref_1".into(), 50);
        e.credits.insert("kc".into(), 1000);
        (d, e)
    }

    #[test]
    fn a_consistent_account_passes() {
        let (d, e) = healthy();
        assert_eq!(check_account(&d, &e), vec![]);
    }

    #[test]
    fn a_second_charge_is_found() {
        let (mut d, e) = healthy();
        d.ledger
            .insert(0, entry("txn_6", -300, "order", "ord_a", 450));
        d.balance = 450;
        let f = check_account(&d, &e);
        assert!(f.iter().any(|x| x.check == "charged-twice"), "{f:?}");
    }

    #[test]
    fn a_lost_order_and_a_wrong_sum_are_found() {
        let (mut d, e) = healthy();
        d.orders.remove(1);
        d.balance = 751;
        let f = check_account(&d, &e);
        let checks: Vec<&str> = f.iter().map(|x| x.check).collect();
        assert!(checks.contains(&"order-lost"), "{f:?}");
        assert!(checks.contains(&"ledger-sum"), "{f:?}");
        assert!(checks.contains(&"orphan-charge"), "{f:?}");
    }

    #[test]
    fn two_orders_under_one_key_are_found() {
        let (mut d, e) = healthy();
        d.orders
            .insert(0, order("ord_c", "ka", 300, "completed", 0));
        d.ledger
            .insert(0, entry("txn_6", -300, "order", "ord_c", 450));
        d.balance = 450;
        let f = check_account(&d, &e);
        assert!(
            f.iter()
                .any(|x| x.check == "charged-twice" && x.detail.contains("externalOrderId ka")),
            "{f:?}"
        );
    }

    #[test]
    fn an_order_for_a_key_that_only_heard_503_is_found() {
        let (d, mut e) = healthy();
        e.no_order.insert("kb".into(), "only 503s".into());
        e.orders.remove("ord_b");
        let f = check_account(&d, &e);
        assert!(
            f.iter().any(|x| x.check == "nothing-changed-visible"),
            "{f:?}"
        );
    }

    #[test]
    fn what_a_rule_refused_must_not_show() {
        let (d, mut e) = healthy();
        e.refused
            .push(("order", "kzz".into(), "an order of one more".into()));
        e.refused
            .push(("credit", "kc2".into(), "a credit of 10^12 + 1".into()));
        assert_eq!(check_account(&d, &e), vec![]);
        e.refused
            .push(("order", "ka".into(), "an order of one more".into()));
        e.refused
            .push(("credit", "kc".into(), "a credit of 10^12 + 1".into()));
        let f = check_account(&d, &e);
        assert_eq!(
            f.iter()
                .filter(|x| x.check == "edge-refused-visible")
                .count(),
            2,
            "{f:?}"
        );
    }

    #[test]
    fn a_broken_chain_is_found() {
        let (mut d, e) = healthy();
        d.ledger[1]["balanceAfter"] = json!(701);
        let f = check_account(&d, &e);
        assert!(f.iter().any(|x| x.check == "ledger-chain"), "{f:?}");
    }
}
