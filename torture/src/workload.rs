//! The clients: each draws its next operation from the seed (every endpoint, with the shapes
//! real callers send: new orders, replays, other bodies, bursts of one key, refusals, cancels,
//! refunds, credits, provider payments, key cycles, product PUTs, rotations, redeliveries,
//! account creations, reads, lists, event polling) and gives every answer to the model.

use crate::ctx::Ctx;
use crate::http::{self, Auth, Req, Resp};
use crate::model::{KeyRecord, Outcome, Span, Unkeyed};
use crate::rng::Rng;
use crate::setup::{
    home_of, now_rfc3339, product_body, report, run_tag, sign_provider, Mix, HOT, OPS, PRODUCTS,
    RETAIL, SCOPES,
};
use crate::state::{Account, Provider, Revocable};
use reqwest::Method;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod edge;

// ---------------------------------------------------------------------------------------------
// The clients.

#[derive(Clone, Debug)]
struct MyOrder {
    id: String,
    /// The idempotency key (and externalOrderId) it was placed under.
    key: String,
    account: usize,
    total: i64,
    placed: Instant,
    /// The span of the answer that showed it (a rewind may have undone it).
    seen: Span,
}

pub struct Client {
    ctx: Arc<Ctx>,
    idx: usize,
    rng: Rng,
    http: reqwest::Client,
    mix: Mix,
    tag: String,
    seq: u64,
    home: usize,
    /// Keys of this client's keyed writes (the replay op draws from them).
    my_keys: VecDeque<String>,
    orders: VecDeque<MyOrder>,
    providers: VecDeque<String>,
    poll_after: Option<String>,
    /// After a rotation whose outcome is unknown, no exact check until then.
    rotation_unknown_until: Option<Instant>,
    /// Keys made, used on every instance (so each keeps a copy) and kept for a later revocation:
    /// (id, plaintext, when made).
    parked: VecDeque<(String, String, Instant)>,
    /// near-limits: this client's own accounts and what the model knows of them.
    edge: Option<edge::Edge>,
}

const KEEP: usize = 256;

impl Client {
    pub fn new(ctx: Arc<Ctx>, idx: usize, mix: Mix) -> Client {
        let rng = Rng::stream(ctx.cfg.seed, "client", idx as u64);
        let tag = run_tag(ctx.cfg.seed);
        let home = home_of(idx);
        ctx.state.pollers.lock().unwrap()[idx].account = home;
        let edge = edge::Edge::of_client(&ctx, idx);
        Client {
            ctx,
            idx,
            rng,
            http: http::client(),
            mix,
            tag,
            seq: 0,
            home,
            my_keys: VecDeque::new(),
            orders: VecDeque::new(),
            providers: VecDeque::new(),
            poll_after: None,
            rotation_unknown_until: None,
            parked: VecDeque::new(),
            edge,
        }
    }

    pub async fn run(mut self) {
        while !self.ctx.stopping.load(Ordering::Relaxed) {
            let op = OPS[self.rng.weighted(&self.mix.weights)].0;
            self.step(op).await;
        }
    }

    fn next_key(&mut self, what: &str) -> String {
        self.seq += 1;
        format!("{}-c{}-{what}{}", self.tag, self.idx, self.seq)
    }

    fn instance(&mut self) -> usize {
        let live = self.ctx.cluster.live();
        *self.rng.pick(&live)
    }

    /// A request with the operator's token, to instance `inst`.
    fn admin_req(
        &self,
        inst: usize,
        kind: &'static str,
        method: Method,
        path: impl Into<String>,
    ) -> Req {
        Req::new(kind, method, path, inst, self.idx).auth(Auth::Admin)
    }

    fn api_key(&self, account: usize) -> String {
        self.ctx.state.account(account).client_keys[self.idx].clone()
    }

    fn remember_key(&mut self, key: String) {
        self.my_keys.push_back(key);
        if self.my_keys.len() > KEEP {
            self.my_keys.pop_front();
        }
    }

    async fn send(&mut self, req: &Req) -> Resp {
        let r = http::send(&self.ctx, &self.http, req).await;
        if r.failure == Some(http::Failure::Connect) {
            // Nothing listens (an instance down): a client backs off instead of spinning.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        r
    }

    /// Sends a keyed write with the key's own body and gives the answer to the model.
    async fn keyed(&mut self, req: Req, account: usize, op: &'static str) -> Resp {
        let key = req.idem_key.clone().expect("a keyed write has a key");
        let body = req.body.clone().unwrap_or_else(|| Arc::from(&b""[..]));
        let path = req.path.clone();
        let method = if req.method == Method::POST {
            "POST"
        } else {
            "PUT"
        };
        self.ctx
            .state
            .keys
            .lock()
            .unwrap()
            .on_send(&key, || KeyRecord::new(account, op, method, path, body));
        let r = self.send(&req).await;
        self.judge(&key, &r, op);
        r
    }

    fn judge(&self, key: &str, r: &Resp, op: &str) {
        judge_keyed(&self.ctx, key, r, op);
        self.quiet_500(r);
    }

    /// A 500 while no fault is in force: the opaque 500 means "outcome unknown", which needs a
    /// storage that failed.
    fn quiet_500(&self, r: &Resp) {
        if r.status == Some(500) && !r.exempt && !self.ctx.faults_busy() {
            self.ctx.violation(
                "500-without-fault",
                &format!(
                    "instance {} answered 500 with no fault in force: {}",
                    r.instance,
                    r.describe()
                ),
            );
        }
    }

    async fn step(&mut self, op: &'static str) {
        match op {
            "order.new" => self.order_new().await,
            "replay" => self.replay().await,
            "order.other-body" => self.other_body().await,
            "order.burst" => self.burst().await,
            "order.refused" => self.refused(false).await,
            "order.402" => self.refused(true).await,
            "cancel" => self.cancel().await,
            "refund" => self.refund().await,
            "credit" => self.credit().await,
            "provider" => self.provider(None).await,
            "provider.repeat" => {
                if self.providers.is_empty() {
                    self.provider(None).await
                } else {
                    let i = self.rng.below(self.providers.len() as u64) as usize;
                    let id = self.providers[i].clone();
                    self.provider(Some(id)).await
                }
            }
            "key.cycle" => self.key_cycle().await,
            "product.put" => self.product_put().await,
            "rotate" => self.rotate().await,
            "redeliver" => self.redeliver().await,
            "recover" => self.recover().await,
            "account.create" => self.account_create().await,
            "read.order" => self.read_order().await,
            "read.list" => self.read_list().await,
            "read.events" => self.poll_events().await,
            "read.balance" => {
                let (acc, inst) = (self.order_account(), self.instance());
                let req = Req::new("read.balance", Method::GET, "/b2b/balance", inst, self.idx)
                    .auth(Auth::Key(self.api_key(acc)));
                let r = self.send(&req).await;
                self.expect_not_auth_failure(&r, "a setup key");
                if let (true, Some(body)) = (r.ok(), r.json()) {
                    self.ctx.state.saw_head(acc, &body, (r.start_ms, r.end_ms));
                }
            }
            "read.admin" => self.read_admin().await,
            "readyz" => {
                let inst = self.instance();
                self.send(&Req::new("readyz", Method::GET, "/readyz", inst, self.idx))
                    .await;
            }
            "retail" => {
                let inst = self.instance();
                let key = self.ctx.state.account(RETAIL).client_keys[0].clone();
                let req = Req::new("retail", Method::GET, "/b2b/balance", inst, self.idx)
                    .auth(Auth::Key(key));
                let r = self.send(&req).await;
                self.ctx.check();
                if r.ok() || r.status == Some(401) {
                    self.ctx.violation(
                        "retail-forbidden",
                        &format!("a retail account's key on /b2b/balance: {}", r.describe()),
                    );
                }
            }
            "edge.credit" => self.edge_credit().await,
            "edge.exact" => self.edge_exact().await,
            "edge.overflow" => self.edge_overflow().await,
            "edge.refund" => self.edge_refund().await,
            "edge.rich" => self.edge_rich().await,
            _ => unreachable!("op {op}"),
        }
    }

    /// A 401 for a key made at setup (never revoked) is a lost key.
    fn expect_not_auth_failure(&self, r: &Resp, what: &str) {
        self.ctx.check();
        if r.status == Some(401) {
            self.ctx.violation(
                "key-refused",
                &format!(
                    "{what} answered 401 on instance {}: {}",
                    r.instance,
                    r.describe()
                ),
            );
        }
    }

    fn order_account(&mut self) -> usize {
        if self.rng.chance(0.4) {
            HOT
        } else {
            self.home
        }
    }

    fn basket(&mut self, account: usize) -> Vec<Value> {
        let lines = self.rng.range(1, 5);
        let us = self.ctx.state.account(account).region == "US";
        let mut items: Vec<Value> = (0..lines)
            .map(|_| {
                let choices: &[&str] = if us { &["tp-uc", "tp-gem", "tp-card", "tp-us"] } else { &["tp-uc", "tp-gem", "tp-card"] };
                let p = *self.rng.pick(choices);
                let q = if self.rng.chance(0.9) { self.rng.range(1, 5) } else { self.rng.range(6, 40) };
                let player = format!("@Player{}", self.rng.below(1000));
                match p {
                    "tp-uc" => json!({"productId": p, "quantity": q, "deliveryData": {"username": player}}),
                    "tp-card" => json!({"productId": p, "quantity": q, "deliveryData": {"username": player, "server": "eu-1"}}),
                    _ if self.rng.chance(0.5) => json!({"productId": p, "quantity": q}),
                    _ => json!({"productId": p, "quantity": q, "deliveryData": {}}),
                }
            })
            .collect();
        // Drawn only when asked for, so a seed without --medium-orders draws what it always did.
        let medium = self.ctx.cfg.medium_orders;
        if medium > 0.0 && self.rng.chance(medium) {
            let size = self.rng.range(3 * 1024, 8 * 1024) as usize;
            // Random letters: a note that does not compress, since sled compresses the pages
            // of a store orderly creates and the note is there to make pages pass sled's blob
            // threshold. Drawn from a generator of its own, so that the workload's stream
            // takes one draw per note whatever its size.
            let mut letters = Rng::new(self.rng.next_u64());
            let note: String = (0..size)
                .map(|_| char::from(b'a' + letters.below(26) as u8))
                .collect();
            items[0]["deliveryData"]["note"] = json!(note);
        }
        items
    }

    fn order_body(&mut self, key: &str, items: Vec<Value>, account: usize) -> Value {
        let mut body = json!({"items": items, "externalOrderId": key});
        if self.rng.chance(self.mix.callback_share) {
            body["callbackUrl"] = json!(self.ctx.receiver_url(account));
        }
        body
    }

    fn note_order(&mut self, r: &Resp, account: usize, key: &str) {
        if !r.ok() {
            return;
        }
        let v = r.json().unwrap_or(Value::Null);
        let o = &v["order"];
        if let Some(id) = o["id"].as_str() {
            if self.orders.iter().any(|x| x.id == id) {
                return;
            }
            self.orders.push_back(MyOrder {
                id: id.to_string(),
                key: key.to_string(),
                account,
                total: o["total"].as_i64().unwrap_or(0),
                placed: Instant::now(),
                seen: (r.start_ms, r.end_ms),
            });
            if self.orders.len() > KEEP {
                self.orders.pop_front();
            }
        }
    }

    async fn place(
        &mut self,
        key: String,
        body: Value,
        account: usize,
        kind: &'static str,
    ) -> Resp {
        let inst = self.instance();
        let req = Req::new(kind, Method::POST, "/b2b/orders", inst, self.idx)
            .auth(Auth::Key(self.api_key(account)))
            .key(key.clone())
            .json(&body);
        let r = self.keyed(req, account, "order").await;
        self.note_order(&r, account, &key);
        self.remember_key(key);
        r
    }

    async fn order_new(&mut self) {
        let account = self.order_account();
        let key = self.next_key("o");
        let items = self.basket(account);
        let body = self.order_body(&key, items, account);
        let r = self.place(key.clone(), body, account, "order.new").await;
        // A client whose answer was lost sends the very same request again (and now and then
        // one that did get its answer, as a retrying proxy would).
        let again = if r.ok() {
            0.1
        } else if r.status == Some(402) {
            0.0
        } else {
            0.7
        };
        if self.rng.chance(again) {
            self.resend(&key, "order.retry").await;
        }
    }

    /// Sends a key's recorded request again (same path, body, account).
    async fn resend(&mut self, key: &str, kind: &'static str) -> Option<Resp> {
        let rec = self.ctx.state.keys.lock().unwrap().map.get(key).cloned()?;
        let inst = self.instance();
        let auth = if rec.path.starts_with("/admin/") {
            Auth::Admin
        } else {
            Auth::Key(self.api_key(rec.account))
        };
        let method = if rec.method == "PUT" {
            Method::PUT
        } else {
            Method::POST
        };
        let mut req = Req::new(kind, method, rec.path.clone(), inst, self.idx)
            .auth(auth)
            .key(key.to_string());
        if !rec.body.is_empty() {
            req = req.body(rec.body.clone());
        }
        let r = self.keyed(req, rec.account, rec.op).await;
        if rec.op == "order" {
            self.note_order(&r, rec.account, key);
        }
        Some(r)
    }

    async fn replay(&mut self) {
        if self.my_keys.is_empty() {
            return self.order_new().await;
        }
        let i = self.rng.below(self.my_keys.len() as u64) as usize;
        let key = self.my_keys[i].clone();
        self.resend(&key, "replay").await;
    }

    async fn other_body(&mut self) {
        // An acknowledged order key of this client, with one more of its first line (not one a
        // rewind may have undone: another body may then be its first use).
        let rw = self.ctx.state.rewinds();
        let acked: Vec<String> = {
            let keys = self.ctx.state.keys.lock().unwrap();
            self.my_keys
                .iter()
                .filter(|k| {
                    keys.map
                        .get(*k)
                        .is_some_and(|r| r.op == "order" && r.safe_ack(&rw).is_some())
                })
                .cloned()
                .collect()
        };
        if acked.is_empty() {
            return self.order_new().await;
        }
        let key = self.rng.pick(&acked).clone();
        let rec = self
            .ctx
            .state
            .keys
            .lock()
            .unwrap()
            .map
            .get(&key)
            .cloned()
            .expect("listed above");
        let mut body: Value = serde_json::from_slice(&rec.body).unwrap_or(Value::Null);
        let q = body["items"][0]["quantity"].as_u64().unwrap_or(1);
        body["items"][0]["quantity"] = json!(q + 1);
        let inst = self.instance();
        let req = Req::new(
            "order.other-body",
            Method::POST,
            "/b2b/orders",
            inst,
            self.idx,
        )
        .auth(Auth::Key(self.api_key(rec.account)))
        .key(key.clone())
        .json(&body);
        let r = self.send(&req).await;
        self.ctx.check();
        let f = self.ctx.state.keys.lock().unwrap().on_other_body_answer(
            &key,
            &r.outcome(),
            (r.start_ms, r.end_ms),
            &self.ctx.state.rewinds(),
        );
        report(&self.ctx, f);
        self.quiet_500(&r);
    }

    /// One new key sent by several "clients" at once, to any instances: one order, never two.
    async fn burst(&mut self) {
        let account = self.order_account();
        let key = self.next_key("b");
        let items = self.basket(account);
        let body = self.order_body(&key, items, account);
        let n = self.rng.range(2, 4) as usize;
        let reqs: Vec<Req> = (0..n)
            .map(|_| {
                let inst = self.instance();
                Req::new("order.burst", Method::POST, "/b2b/orders", inst, self.idx)
                    .auth(Auth::Key(self.api_key(account)))
                    .key(key.clone())
                    .json(&body)
            })
            .collect();
        let path = "/b2b/orders".to_string();
        let b: Arc<[u8]> = reqs[0].body.clone().expect("json body");
        {
            let mut keys = self.ctx.state.keys.lock().unwrap();
            for _ in 0..n {
                keys.on_send(&key, || {
                    KeyRecord::new(account, "order", "POST", path.clone(), b.clone())
                });
            }
        }
        let ctx = self.ctx.clone();
        let futs = reqs.iter().map(|r| {
            let ctx = ctx.clone();
            let http = self.http.clone();
            async move { http::send(&ctx, &http, r).await }
        });
        let mut answers = futures_util::future::join_all(futs).await;
        // The model takes answers in the order they came.
        answers.sort_by_key(|r| r.end_ms);
        let mut ids = std::collections::BTreeSet::new();
        for r in &answers {
            self.judge(&key, r, "order");
            if r.ok() {
                if let Some(id) = r
                    .json()
                    .and_then(|v| v["order"]["id"].as_str().map(str::to_string))
                {
                    ids.insert(id);
                }
            }
            self.note_order(r, account, &key);
        }
        self.ctx.check();
        // Answers that straddle a rewind may come from two histories, each with its order.
        let rw = self.ctx.state.rewinds();
        let straddled = answers.iter().any(|r| rw.at_risk((r.start_ms, r.end_ms)));
        if ids.len() > 1 && !straddled {
            self.ctx.violation(
                "burst-two-orders",
                &format!(
                    "key {key} sent {n} times at once made {} orders: {ids:?}",
                    ids.len()
                ),
            );
        }
        self.remember_key(key);
    }

    /// An order refused by a business rule (region, zero price) or for money (402): nothing
    /// is written, and the same key with a valid basket afterwards is a new order.
    async fn refused(&mut self, money: bool) {
        let account = if money {
            if self.rng.chance(0.5) {
                1
            } else {
                self.home
            }
        } else {
            self.home
        };
        let key = self.next_key("r");
        let items = if money {
            vec![json!({"productId": "tp-gold", "quantity": 1_000_000})]
        } else if self.ctx.state.account(account).region != "US" && self.rng.chance(0.5) {
            vec![json!({"productId": "tp-us", "quantity": 1})]
        } else {
            vec![json!({"productId": "tp-free", "quantity": 1})]
        };
        let body = json!({"items": items, "externalOrderId": key});
        let inst = self.instance();
        let kind = if money { "order.402" } else { "order.refused" };
        let req = Req::new(kind, Method::POST, "/b2b/orders", inst, self.idx)
            .auth(Auth::Key(self.api_key(account)))
            .key(key.clone())
            .json(&body);
        let r = self.send(&req).await;
        self.ctx.check();
        let want = if money { 402 } else { 400 };
        if r.ok() {
            self.ctx.violation(
                "expected-refusal",
                &format!("key {key}: an order the rules refuse got {}", r.describe()),
            );
            return;
        }
        // A busy answer is no decision: the in-progress 409, or on PostgreSQL the 402 of a
        // balance row held past the retries (its lock is taken before the rules run).
        let busy = r.status == Some(409)
            || (r.status == Some(402) && r.error_text() == "Concurrent balance modification");
        if r.status.is_some()
            && r.status != Some(want)
            && r.status.is_some_and(|s| s < 500)
            && !busy
        {
            self.ctx.violation(
                "expected-refusal",
                &format!("key {key}: expected {want}, got {}", r.describe()),
            );
        }
        self.quiet_500(&r);
        if r.status == Some(want) && self.rng.chance(0.5) {
            let items = self.basket(account);
            let body = self.order_body(&key, items, account);
            self.place(key, body, account, "order.after-refusal").await;
        }
    }

    fn pick_order(&mut self, min_age: Duration, max_age: Duration) -> Option<MyOrder> {
        let c: Vec<MyOrder> = self
            .orders
            .iter()
            .filter(|o| o.placed.elapsed() >= min_age && o.placed.elapsed() <= max_age)
            .cloned()
            .collect();
        if c.is_empty() {
            None
        } else {
            Some(self.rng.pick(&c).clone())
        }
    }

    async fn cancel(&mut self) {
        // A fresh order: cancels race the fulfillment, both ways.
        let Some(o) = self.pick_order(Duration::ZERO, Duration::from_secs(3)) else {
            return self.order_new().await;
        };
        let inst = self.instance();
        let path = format!("/b2b/orders/{}/cancel", o.id);
        let mut req = Req::new("cancel", Method::POST, path, inst, self.idx)
            .auth(Auth::Key(self.api_key(o.account)));
        if self.rng.chance(0.5) {
            req = req.json(&json!({}));
        }
        let keyed = self.rng.chance(0.5);
        let r = if keyed {
            let key = self.next_key("x");
            let r = self.keyed(req.key(key.clone()), o.account, "cancel").await;
            self.remember_key(key);
            r
        } else {
            let r = self.send(&req).await;
            if r.ok() {
                self.ctx
                    .state
                    .cancelled
                    .lock()
                    .unwrap()
                    .entry(o.id.clone())
                    .or_insert((r.start_ms, r.end_ms));
            }
            self.quiet_500(&r);
            r
        };
        self.ctx.check();
        if r.ok() {
            let st = r
                .json()
                .map(|v| v["order"]["status"].as_str().unwrap_or("").to_string())
                .unwrap_or_default();
            if st != "cancelled" {
                self.ctx.violation(
                    "cancel-shape",
                    &format!("cancel of {} answered 200 with status {st:?}", o.id),
                );
            }
        } else if r.status == Some(409)
            && !keyed
            && r.token() != "order_not_cancellable"
            && !r.error_text().starts_with("Duplicate request in progress")
        {
            self.ctx.violation(
                "cancel-shape",
                &format!("cancel of {}: {}", o.id, r.describe()),
            );
        }
    }

    async fn refund(&mut self) {
        let Some(o) = self.pick_order(Duration::from_millis(2500), Duration::from_secs(3600))
        else {
            return self.order_new().await;
        };
        let key = self.next_key("f");
        let inst = self.instance();
        let path = format!("/b2b/orders/{}/refunds", o.id);
        let mut req = Req::new("refund", Method::POST, path, inst, self.idx)
            .auth(Auth::Key(self.api_key(o.account)))
            .key(key.clone());
        if o.total > 1 && self.rng.chance(0.7) {
            let amount = self.rng.range(1, (o.total as u64 / 2).max(1));
            req = req.json(&json!({"amount": amount, "reason": key}));
        } else if self.rng.chance(0.5) {
            req = req.json(&json!({"reason": key}));
        }
        let r = self.keyed(req, o.account, "refund").await;
        self.remember_key(key.clone());
        if !r.ok() && r.status.is_none_or(|s| s >= 500) && self.rng.chance(0.7) {
            self.resend(&key, "refund.retry").await;
        }
    }

    async fn credit(&mut self) {
        let account = self.order_account();
        let key = self.next_key("k");
        let amount = self.rng.range(1_000, 100_000) as i64;
        let id = self.ctx.state.account(account).id;
        let inst = self.instance();
        let req = self
            .admin_req(
                inst,
                "credit",
                Method::POST,
                format!("/admin/accounts/{id}/credits"),
            )
            .key(key.clone())
            .json(&json!({"amount": amount, "reason": key}));
        let r = self.keyed(req, account, "credit").await;
        self.remember_key(key.clone());
        if !r.ok() && self.rng.chance(0.7) {
            self.resend(&key, "credit.retry").await;
        }
    }

    async fn provider(&mut self, repeat: Option<String>) {
        let (id, body) = match &repeat {
            Some(id) => {
                let p = self.ctx.state.providers.lock().unwrap().get(id).cloned();
                match p {
                    Some(p) => (id.clone(), p.body),
                    None => return,
                }
            }
            None => {
                self.seq += 1;
                let id = format!("{}-pay-c{}-{}", self.tag, self.idx, self.seq);
                let account = if self.rng.chance(0.5) { 1 } else { self.home };
                let amount = self.rng.range(100, 50_000) as i64;
                let acc_id = self.ctx.state.account(account).id;
                let body = json!({"id": id, "type": "payment.succeeded", "accountId": acc_id, "amount": amount, "currency": "USD"})
                    .to_string()
                    .into_bytes();
                self.ctx.state.providers.lock().unwrap().insert(
                    id.clone(),
                    Provider {
                        account,
                        amount,
                        body: body.clone(),
                        answers: Unkeyed::default(),
                    },
                );
                self.providers.push_back(id.clone());
                if self.providers.len() > KEEP {
                    self.providers.pop_front();
                }
                (id, body)
            }
        };
        let inst = self.instance();
        let sig = sign_provider(&self.ctx.cluster.provider_secret, &body);
        let kind = if repeat.is_some() {
            "provider.repeat"
        } else {
            "provider"
        };
        let req = Req::new(
            kind,
            Method::POST,
            "/webhooks/providers/torture",
            inst,
            self.idx,
        )
        .header("X-Signature", sig)
        .body(Arc::from(body));
        let r = self.send(&req).await;
        self.quiet_500(&r);
        let dup = r.json().and_then(|v| v["duplicate"].as_bool());
        let span = (r.start_ms, r.end_ms);
        let rw = self.ctx.state.rewinds();
        let mut providers = self.ctx.state.providers.lock().unwrap();
        let Some(p) = providers.get_mut(&id) else {
            return;
        };
        self.ctx.check();
        if r.ok() {
            match dup {
                // A payment acknowledged in a rewind's window may be gone after it: then it
                // is new again there.
                Some(false) if p.answers.ok_in_history_of(span, &rw) => {
                    self.ctx.violation(
                        "provider-credited-twice",
                        &format!("provider payment {id}: a second duplicate:false"),
                    );
                }
                Some(true) if p.answers.must_not_show() => {
                    self.ctx.violation(
                        "nothing-changed-visible",
                        &format!(
                            "provider payment {id}: duplicate:true after only 503s ({} of them)",
                            p.answers.nothing
                        ),
                    );
                }
                _ => {}
            }
        }
        p.answers.record(&r.outcome(), span);
    }

    /// Make a key, use it on every instance, revoke it twice in a row (a retrying client), then
    /// it must be 401 on every instance. A third of the keys are kept a while instead, then used
    /// on every instance again (each keeps a copy) and revoked by a later cycle, at least 4 s
    /// after they were made: a revocation of a key older than the changes around it (a
    /// rewind's, a restart's).
    async fn key_cycle(&mut self) {
        if self
            .parked
            .front()
            .is_some_and(|k| k.2.elapsed() >= Duration::from_secs(4))
        {
            // Used until the day it is revoked (every instance keeps a copy), then revoked.
            let (key_id, plaintext, _) = self.parked.pop_front().expect("checked");
            let created = self.ctx.state.revocables.lock().unwrap()[&key_id].created;
            crate::checks::created_key_works(
                &self.ctx, &self.http, self.idx, &key_id, &plaintext, created,
            )
            .await;
            return self.revoke_key(&key_id, &plaintext).await;
        }
        let account = self.home;
        let acc = self.ctx.state.account(account);
        let inst = self.instance();
        let req = self
            .admin_req(
                inst,
                "key.create",
                Method::POST,
                format!("/admin/accounts/{}/api-keys", acc.id),
            )
            .json(&json!({"scopes": SCOPES}));
        let r = self.send(&req).await;
        self.quiet_500(&r);
        let Some(v) = r.json().filter(|_| r.ok()) else {
            return;
        };
        let key_id = v["apiKey"]["id"].as_str().unwrap_or("").to_string();
        let plaintext = v["apiKey"]["key"].as_str().unwrap_or("").to_string();
        if key_id.is_empty() || plaintext.is_empty() {
            self.ctx.violation(
                "key-shape",
                &format!("api key creation answered {}", r.describe()),
            );
            return;
        }
        let created = (r.start_ms, r.end_ms);
        self.ctx.state.revocables.lock().unwrap().insert(
            key_id.clone(),
            Revocable {
                key_id: key_id.clone(),
                plaintext: plaintext.clone(),
                created,
                revokes: Unkeyed::default(),
            },
        );
        // docs/contract.md "A revoked key is refused by every instance" and "When the database goes
        // back in time": a key whose creation was answered works on every instance at once.
        crate::checks::created_key_works(
            &self.ctx, &self.http, self.idx, &key_id, &plaintext, created,
        )
        .await;
        if self.rng.chance(0.33) && self.parked.len() < 8 {
            self.parked.push_back((key_id, plaintext, Instant::now()));
            return;
        }
        self.revoke_key(&key_id, &plaintext).await;
    }

    /// Revokes a key of `key_cycle` once or twice in a row (a retrying client); a revocation
    /// answered 200 must leave it refused on every instance.
    async fn revoke_key(&mut self, key_id: &str, plaintext: &str) {
        let created = self.ctx.state.revocables.lock().unwrap()[key_id].created;
        let twice = self.rng.chance(0.8);
        for n in 0..(if twice { 2 } else { 1 }) {
            let inst = self.instance();
            let req = Req::new(
                if n == 0 {
                    "key.revoke"
                } else {
                    "key.revoke-again"
                },
                Method::DELETE,
                format!("/admin/api-keys/{key_id}"),
                inst,
                self.idx,
            )
            .auth(Auth::Admin);
            let r = self.send(&req).await;
            self.quiet_500(&r);
            let o = r.outcome();
            let tally = {
                let mut rv = self.ctx.state.revocables.lock().unwrap();
                let e = rv.get_mut(key_id).expect("made by key_cycle");
                e.revokes.record(&o, (r.start_ms, r.end_ms));
                e.revokes.clone()
            };
            if matches!(o, Outcome::NothingWritten) && tally.must_not_show() {
                // The revocation says nothing was changed: the key must still work, first of
                // all on the instance that said so (the others may not have caught up with a
                // revocation that did commit; that one knows its own writes). Unless a rewind
                // may have undone the key's creation.
                let req = Req::new(
                    "key.check",
                    Method::GET,
                    "/b2b/balance",
                    r.instance,
                    self.idx,
                )
                .auth(Auth::Key(plaintext.to_string()));
                let c = self.send(&req).await;
                self.ctx.check();
                if c.status == Some(401) && !self.ctx.state.rewinds().at_risk(created) {
                    self.ctx.violation(
                        "nothing-changed-visible",
                        &format!("revocation of {key_id} answered 503 ({}), yet the key is refused (401) on instance {}", excerpt_err(&r), c.instance),
                    );
                }
            }
        }
        let first_safe = {
            let rw = self.ctx.state.rewinds();
            self.ctx.state.revocables.lock().unwrap()[key_id]
                .revokes
                .safe_oks(&rw)
                .first()
                .copied()
        };
        if let Some(revoked) = first_safe {
            crate::checks::revoked_key_refused(
                &self.ctx, &self.http, self.idx, key_id, plaintext, revoked,
            )
            .await;
        }
    }

    async fn product_put(&mut self) {
        // Identical PUTs of the catalog (a retried PUT rewrites the same bytes), or a change of
        // this client's own product.
        let (path, body) = if self.rng.chance(0.7) {
            let i = self.rng.below(3) as usize;
            (
                format!("/admin/products/{}", PRODUCTS[i].0),
                product_body(i),
            )
        } else {
            let price = self.rng.range(1, 10_000);
            (
                format!("/admin/products/tp-var-{}", self.idx),
                json!({"name": "torture var", "price": price, "regions": [], "deliveryFields": [], "active": true}),
            )
        };
        for kind in ["product.put", "product.put-again"] {
            let inst = self.instance();
            let req = Req::new(kind, Method::PUT, path.clone(), inst, self.idx)
                .auth(Auth::Admin)
                .json(&body);
            let r = self.send(&req).await;
            self.quiet_500(&r);
            if !self.rng.chance(0.8) {
                break;
            }
        }
    }

    async fn rotate(&mut self) {
        let acc = self.ctx.state.account(self.home);
        if acc.rotation_owner != Some(self.idx) {
            return self.read_admin().await;
        }
        if let Some(t) = self.rotation_unknown_until {
            if Instant::now() < t {
                return self.read_admin().await;
            }
            // Long enough for a late commit to have landed: learn the current secret.
            if self.sync_secret(&acc).await {
                self.rotation_unknown_until = None;
            } else {
                return;
            }
        }
        let inst = self.instance();
        let mut req = self.admin_req(
            inst,
            "rotate",
            Method::POST,
            format!("/admin/accounts/{}/webhook-secret", acc.id),
        );
        if self.rng.chance(0.5) {
            req = req.json(&json!({}));
        }
        let r = self.send(&req).await;
        self.quiet_500(&r);
        match r.outcome() {
            Outcome::Ok { .. } => {
                let s = r
                    .json()
                    .and_then(|v| v["webhookSecret"].as_str().map(str::to_string))
                    .unwrap_or_default();
                let span = (r.start_ms, r.end_ms);
                self.ctx.state.add_secret(acc.idx, &s, Some(span));
                self.ctx
                    .state
                    .secrets
                    .lock()
                    .unwrap()
                    .entry(acc.idx)
                    .or_default()
                    .rotations
                    .push((s, span));
            }
            Outcome::NothingWritten => {
                // What the model knows, unless a rewind may have undone what told it.
                let known = self.ctx.state.current_secret(acc.idx);
                let inst = self.instance();
                let g = self.admin_req(
                    inst,
                    "rotate.check",
                    Method::GET,
                    format!("/admin/accounts/{}", acc.id),
                );
                let c = self.send(&g).await;
                if let (Some(known), Some(now)) = (
                    known,
                    c.json()
                        .and_then(|v| v["account"]["webhookSecret"].as_str().map(str::to_string)),
                ) {
                    self.ctx.check();
                    if c.ok() && now != known {
                        self.ctx
                            .state
                            .add_secret(acc.idx, &now, Some((c.start_ms, c.end_ms)));
                        self.ctx.violation(
                            "nothing-changed-visible",
                            &format!("rotation of {}'s webhook secret answered 503 ({}), yet the secret changed", acc.id, excerpt_err(&r)),
                        );
                    }
                }
            }
            Outcome::Unknown => {
                let mut secrets = self.ctx.state.secrets.lock().unwrap();
                let e = secrets.entry(acc.idx).or_default();
                e.current = None;
                e.current_at = None;
                drop(secrets);
                self.rotation_unknown_until = Some(Instant::now() + Duration::from_secs(65));
            }
            _ => {}
        }
    }

    /// Reads the account's current secret into the model; false when the read failed.
    async fn sync_secret(&mut self, acc: &Account) -> bool {
        let inst = self.instance();
        let g = self.admin_req(
            inst,
            "rotate.sync",
            Method::GET,
            format!("/admin/accounts/{}", acc.id),
        );
        let c = self.send(&g).await;
        match c
            .json()
            .and_then(|v| v["account"]["webhookSecret"].as_str().map(str::to_string))
        {
            Some(s) if c.ok() => {
                self.ctx
                    .state
                    .add_secret(acc.idx, &s, Some((c.start_ms, c.end_ms)));
                true
            }
            _ => false,
        }
    }

    async fn redeliver(&mut self) {
        let events = self
            .ctx
            .state
            .callback_events
            .lock()
            .unwrap()
            .get(&self.home)
            .cloned()
            .unwrap_or_default();
        if events.is_empty() {
            return self.poll_events().await;
        }
        let (id, seen) = self.rng.pick(&events).clone();
        let inst = self.instance();
        let req = if self.rng.chance(0.5) {
            self.admin_req(
                inst,
                "redeliver.admin",
                Method::POST,
                format!("/admin/events/{id}/redeliver"),
            )
        } else {
            Req::new(
                "redeliver.partner",
                Method::POST,
                format!("/b2b/events/{id}/redeliver"),
                inst,
                self.idx,
            )
            .auth(Auth::Key(self.api_key(self.home)))
        };
        let r = self.send(&req).await;
        self.quiet_500(&r);
        self.ctx.check();
        if r.ok()
            && r.json()
                .and_then(|v| v["delivery"].as_str().map(str::to_string))
                .as_deref()
                != Some("pending")
        {
            self.ctx.violation(
                "redeliver-shape",
                &format!("redeliver of {id}: {}", r.describe()),
            );
        }
        // An event listed in a rewind's window may be gone after it.
        let lost = self.ctx.state.rewinds().at_risk(seen);
        if (r.status == Some(404) || r.status == Some(409)) && !lost {
            self.ctx.violation(
                "redeliver-refused",
                &format!(
                    "redeliver of {id} (an event with a callback, seen by the poller): {}",
                    r.describe()
                ),
            );
        }
    }

    async fn recover(&mut self) {
        let acc = self.ctx.state.account(self.home);
        let inst = self.instance();
        let since = now_rfc3339(Duration::from_secs(600));
        let req = self
            .admin_req(
                inst,
                "recover",
                Method::POST,
                format!("/admin/accounts/{}/deliveries/recover", acc.id),
            )
            .json(&json!({"since": since}));
        let r = self.send(&req).await;
        self.quiet_500(&r);
    }

    async fn account_create(&mut self) {
        self.seq += 1;
        let name = format!("{}-acct-c{}-{}", self.tag, self.idx, self.seq);
        for attempt in 0..2 {
            let inst = self.instance();
            let req = Req::new(
                if attempt == 0 {
                    "account.create"
                } else {
                    "account.create-retry"
                },
                Method::POST,
                "/admin/accounts",
                inst,
                self.idx,
            )
            .auth(Auth::Admin)
            .json(&json!({"name": name, "wholesale": true, "creditLimit": 0, "region": "EU"}));
            let r = self.send(&req).await;
            self.quiet_500(&r);
            let o = r.outcome();
            self.ctx
                .state
                .created
                .lock()
                .unwrap()
                .entry(name.clone())
                .or_default()
                .record(&o, (r.start_ms, r.end_ms));
            // A client retries what said "nothing was changed" (and what it never heard).
            if !matches!(
                o,
                Outcome::NothingWritten | Outcome::Unknown | Outcome::NotSent
            ) {
                break;
            }
        }
    }

    async fn read_order(&mut self) {
        let Some(o) = self.pick_order(Duration::ZERO, Duration::from_secs(36_000)) else {
            return self.order_new().await;
        };
        let inst = self.instance();
        let req = Req::new(
            "read.order",
            Method::GET,
            format!("/b2b/orders/{}", o.id),
            inst,
            self.idx,
        )
        .auth(Auth::Key(self.api_key(o.account)));
        let r = self.send(&req).await;
        self.ctx.check();
        // An order acknowledged in a rewind's window may be gone after it.
        let lost = self.ctx.state.rewinds().at_risk(o.seen);
        if r.status == Some(404) && !lost {
            self.ctx.violation(
                "acked-order-missing",
                &format!(
                    "order {} (acknowledged) answered 404 on instance {}",
                    o.id, r.instance
                ),
            );
        } else if r.ok() {
            let v = r.json().unwrap_or(Value::Null);
            if v["order"]["id"].as_str() != Some(&o.id)
                || v["order"]["total"].as_i64() != Some(o.total)
            {
                self.ctx.violation(
                    "read-order",
                    &format!("order {}: read back as {}", o.id, r.describe()),
                );
            }
        }
        self.expect_not_auth_failure(&r, "a setup key");
    }

    async fn read_list(&mut self) {
        let account = self.order_account();
        let key = self.api_key(account);
        let what = *self
            .rng
            .pick(&["orders", "transactions", "products", "external"]);
        if what == "external" {
            // The caller's reconciliation: an acknowledged order found by its externalOrderId.
            let Some(o) = self.pick_order(Duration::ZERO, Duration::from_secs(36_000)) else {
                return;
            };
            let ext = o.key.clone();
            let inst = self.instance();
            let req = Req::new(
                "read.external",
                Method::GET,
                format!("/b2b/orders?externalOrderId={ext}"),
                inst,
                self.idx,
            )
            .auth(Auth::Key(self.api_key(o.account)));
            let r = self.send(&req).await;
            if r.ok() {
                self.ctx.check();
                let v = r.json().unwrap_or(Value::Null);
                let ids: Vec<&str> = v["orders"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|o| o["id"].as_str()).collect())
                    .unwrap_or_default();
                if ids != [o.id.as_str()] && !self.ctx.state.rewinds().at_risk(o.seen) {
                    self.ctx.violation(
                        "external-id-lookup",
                        &format!(
                            "externalOrderId {ext} (acknowledged as {}) lists {ids:?}",
                            o.id
                        ),
                    );
                }
            }
            return;
        }
        let pages = self.rng.range(1, 3);
        let limit = self.rng.range(1, 100);
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..pages {
            let mut path = format!("/b2b/{what}?limit={limit}");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let inst = self.instance();
            let req = Req::new("read.list", Method::GET, path, inst, self.idx)
                .auth(Auth::Key(key.clone()));
            let r = self.send(&req).await;
            self.expect_not_auth_failure(&r, "a setup key");
            let Some(v) = r.json().filter(|_| r.ok()) else {
                return;
            };
            let items = v[what].as_array().cloned().unwrap_or_default();
            self.ctx.check();
            if items.len() as u64 > limit {
                self.ctx.violation(
                    "list-shape",
                    &format!("/b2b/{what}?limit={limit} returned {} items", items.len()),
                );
            }
            for it in &items {
                if let Some(id) = it["id"].as_str() {
                    if !seen.insert(id.to_string()) {
                        self.ctx.violation(
                            "list-duplicate",
                            &format!("/b2b/{what}: {id} on two pages of one walk"),
                        );
                    }
                }
            }
            cursor = v["nextCursor"].as_str().map(str::to_string);
            if cursor.is_none() {
                break;
            }
        }
    }

    /// One step of a poller of /b2b/events?after= (a partner catching up on callbacks).
    async fn poll_events(&mut self) {
        self.restart_poller_after_rewind().await;
        let key = self.api_key(self.home);
        let mut path = "/b2b/events?limit=100".to_string();
        if let Some(a) = &self.poll_after {
            path.push_str(&format!("&after={a}"));
        }
        let inst = self.instance();
        let req = Req::new("read.events", Method::GET, path, inst, self.idx).auth(Auth::Key(key));
        let r = self.send(&req).await;
        self.expect_not_auth_failure(&r, "a setup key");
        let Some(v) = r.json().filter(|_| r.ok()) else {
            return;
        };
        let span = (r.start_ms, r.end_ms);
        let events = v["events"].as_array().cloned().unwrap_or_default();
        let mut pollers = self.ctx.state.pollers.lock().unwrap();
        let p = &mut pollers[self.idx];
        self.ctx.check();
        for e in &events {
            let Some(id) = e["id"].as_str() else { continue };
            if p.seen.last().is_some_and(|l| l.as_str() >= id) {
                self.ctx.violation(
                    "events-order",
                    &format!(
                        "account {}: event {id} listed after {:?} (after={:?})",
                        self.home,
                        p.seen.last(),
                        self.poll_after
                    ),
                );
            }
            p.seen.push(id.to_string());
            p.seen_at.push(span);
            p.cursor_at = Some(span);
            if !e["data"]["order"]["callbackUrl"].is_null() {
                let mut cb = self.ctx.state.callback_events.lock().unwrap();
                let list = cb.entry(self.home).or_default();
                list.push((id.to_string(), span));
                if list.len() > 500 {
                    list.remove(0);
                }
            }
        }
        if let Some(last) = p.seen.last() {
            self.poll_after = Some(last.clone());
        }
    }

    /// A cursor listed in a rewind's window may point at an event the rewind lost: it cannot
    /// be continued. The poller sends it once (what the server answers is written down, judged
    /// at the end), then starts over from the beginning; the events it saw are forgotten, so
    /// that the lost ones are not counted as gaps.
    async fn restart_poller_after_rewind(&mut self) {
        let rw = self.ctx.state.rewinds();
        let cursor_at = self.ctx.state.pollers.lock().unwrap()[self.idx].cursor_at;
        if !cursor_at.is_some_and(|at| rw.at_risk_ended(at)) {
            return;
        }
        if let Some(cursor) = self.poll_after.clone() {
            let inst = self.instance();
            let req = Req::new(
                "read.events-lost-cursor",
                Method::GET,
                format!("/b2b/events?limit=100&after={cursor}"),
                inst,
                self.idx,
            )
            .auth(Auth::Key(self.api_key(self.home)));
            let r = self.send(&req).await;
            let answer = match r.json().filter(|_| r.ok()) {
                Some(v) => {
                    let evs = v["events"].as_array().cloned().unwrap_or_default();
                    format!(
                        "{} with {} events (first {:?})",
                        r.status.unwrap_or(0),
                        evs.len(),
                        evs.first().and_then(|e| e["id"].as_str()).unwrap_or("-")
                    )
                }
                None => r.describe(),
            };
            self.ctx
                .state
                .cursor_probes
                .lock()
                .unwrap()
                .push(crate::state::CursorProbe {
                    account: self.home,
                    cursor,
                    at_ms: r.end_ms,
                    answer,
                });
        }
        let mut pollers = self.ctx.state.pollers.lock().unwrap();
        let p = &mut pollers[self.idx];
        p.seen.clear();
        p.seen_at.clear();
        p.cursor_at = None;
        p.restarts += 1;
        self.poll_after = None;
    }

    async fn read_admin(&mut self) {
        let a = self.order_account();
        let acc = self.ctx.state.account(a);
        let path = match self.rng.below(4) {
            0 => "/admin/accounts?limit=20".to_string(),
            1 => format!("/admin/accounts/{}", acc.id),
            2 => format!("/admin/accounts/{}/orders?limit=10", acc.id),
            _ => format!(
                "/admin/accounts/{}/events?delivery={}&limit=10",
                acc.id,
                self.rng
                    .pick(&["pending", "retrying", "delivered", "given_up", "none"])
            ),
        };
        let inst = self.instance();
        let r = self
            .send(&Req::new("read.admin", Method::GET, path, inst, self.idx).auth(Auth::Admin))
            .await;
        self.ctx.check();
        if r.status == Some(401) || r.status == Some(404) {
            self.ctx.violation(
                "admin-read",
                &format!("an admin read answered {}", r.describe()),
            );
        }
    }
}

/// Judges the answer to a keyed write against what the model knows of its key (the object it
/// made and its amount, when it succeeded), and reports what the model finds.
pub fn judge_keyed(ctx: &Ctx, key: &str, r: &Resp, op: &str) {
    let (object, amount) = if r.ok() {
        object_of(op, r, key)
    } else {
        (String::new(), 0)
    };
    ctx.check();
    let rw = ctx.state.rewinds();
    let f = ctx.state.keys.lock().unwrap().on_answer(
        key,
        &r.outcome(),
        &object,
        amount,
        r.start_ms,
        r.end_ms,
        &rw,
    );
    report(ctx, f);
}

/// What a 200 of a keyed write names: (object id, amount).
pub fn object_of(op: &str, r: &Resp, key: &str) -> (String, i64) {
    let v = r.json().unwrap_or(Value::Null);
    match op {
        // A credit's ledger reference is its reason, which the workload sets to the key.
        "credit" => (key.to_string(), 0),
        "order" | "cancel" => (
            v["order"]["id"].as_str().unwrap_or("").to_string(),
            v["order"]["total"].as_i64().unwrap_or(0),
        ),
        "refund" => (
            v["refund"]["id"].as_str().unwrap_or("").to_string(),
            v["refund"]["amount"].as_i64().unwrap_or(0),
        ),
        _ => (String::new(), 0),
    }
}

fn excerpt_err(r: &Resp) -> String {
    let e = r.error_text();
    if e.is_empty() {
        r.describe()
    } else {
        e
    }
}
