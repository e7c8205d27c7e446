//! near-limits: accounts driven to the ends of their ranges (docs/contract.md "A total that
//! does not fit is refused, not wrapped", docs/api.md's limits). Each client has accounts of
//! its own, which no other client writes to, so the model knows each balance exactly and
//! predicts every answer: credits and provider payments at 10^12 (200) and 10^12 + 1 (422,
//! nothing credited); orders of exactly the funds (200, the balance at `-creditLimit`) and of
//! one more (402 `INSUFFICIENT_BALANCE` or `EXCEEDS_CREDIT_LIMIT`, per the account); totals
//! at i64's end and past it (402; 400 `ORDER_TOTAL_TOO_LARGE`), quantities past 10^6 (422),
//! more than 200 lines (400 `TOO_MANY_ITEMS`); refunds of the remainder plus one (409), of
//! exactly the remainder (200) and of one more (409); cancels; and, on an account carried over
//! from an earlier deployment with a balance near i64::MAX, credits, payments, cancels and
//! refunds whose money would not fit (400 `BALANCE_TOO_LARGE`, nothing changed, the key free:
//! the same key succeeds once there is room). A 200 whose money does not add up is
//! `edge-money`, any other answer than the predicted one `edge-answer`; what a rule refused
//! must never show (the end: `edge-refused-visible`).

use super::Client;
use crate::http::{Auth, Req, Resp};
use crate::setup::{sign_provider, MAX_AMOUNT, MAX_QTY};
use crate::state::{Provider, Refused};
use reqwest::Method;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The slots of a client's own accounts.
const PLAIN: usize = 0;
const CREDIT: usize = 1;
const RICH: usize = 2;

/// How long a write is sent again (same key) until its answer is definite.
const DEFINITE_WITHIN: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug)]
struct Acct {
    /// Index into the run's accounts.
    idx: usize,
    /// Its credit line.
    line: i64,
    /// The balance as the model knows it (None: not known, read before the next use).
    balance: Option<i64>,
    /// The rewinds of the database as they were when the balance was known (a rewind since, or
    /// one running then, may undo what made it).
    basis: Epoch,
}

/// Where the database's history stands: how many rewinds began, and whether one runs.
type Epoch = (usize, bool);

fn epoch_of(rw: &crate::model::Rewinds) -> Epoch {
    (rw.list.len(), rw.list.iter().any(|r| r.w1.is_none()))
}

#[derive(Clone, Debug)]
struct EdgeOrder {
    id: String,
    /// The span of its 200 (a rewind may have undone it).
    seen: crate::model::Span,
    slot: usize,
    total: i64,
    refunded: i64,
    placed: Instant,
    closed: bool,
}

/// One client's near-limits accounts.
pub struct Edge {
    accts: [Acct; 3],
    orders: VecDeque<EdgeOrder>,
    /// The history when the op under way began: its answers are judged only while it stays
    /// (an answer across a rewind may belong to a history that was lost).
    op_epoch: Epoch,
}

impl Edge {
    /// The client's accounts, in a near-limits run (None in other profiles).
    pub fn of_client(ctx: &crate::ctx::Ctx, client: usize) -> Option<Edge> {
        let set = *ctx.state.edge.read().unwrap().get(client)?;
        let acct = |idx, line| Acct {
            idx,
            line,
            balance: None,
            basis: (0, false),
        };
        Some(Edge {
            accts: [
                acct(set.plain, 0),
                acct(set.credit, MAX_AMOUNT),
                acct(set.rich, 0),
            ],
            orders: VecDeque::new(),
            op_epoch: (0, false),
        })
    }
}

/// A basket whose total is exactly `total`: lines of the product at 10^12, of one at 10^6 and of
/// one at 1, each line at most 10^6.
fn basket_for(total: i128) -> Vec<Value> {
    let (t, m) = (i128::from(MAX_AMOUNT), 1_000_000i128);
    let mut a = total / t;
    let rest = total % t;
    let (b, c) = (rest / m, rest % m);
    let mut items = Vec::new();
    while a > 0 {
        let q = a.min(i128::from(MAX_QTY));
        items.push(json!({"productId": "tp-max", "quantity": q as i64}));
        a -= q;
    }
    if b > 0 {
        items.push(json!({"productId": "tp-mega", "quantity": b as i64}));
    }
    if c > 0 {
        items.push(json!({"productId": "tp-one", "quantity": c as i64}));
    }
    items
}

/// The 402 of an order past the funds, per the account.
fn short_code(line: i64) -> &'static str {
    if line == 0 {
        "INSUFFICIENT_BALANCE"
    } else {
        "EXCEEDS_CREDIT_LIMIT"
    }
}

/// An answer that decides nothing: sent again (the same key) until one does.
fn transient(r: &Resp) -> bool {
    match r.status {
        None => true,
        Some(429) => true,
        Some(s) if s >= 500 => true,
        Some(409) => r.error_text().starts_with("Duplicate request in progress"),
        Some(402) => r.error_text() == "Concurrent balance modification",
        _ => false,
    }
}

fn code_of(r: &Resp) -> String {
    r.json()
        .and_then(|v| v["code"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A 422 whose `detail` names `loc`.
fn is_422_at(r: &Resp, loc: &Value) -> bool {
    r.status == Some(422)
        && r.json().is_some_and(|v| {
            v["detail"]
                .as_array()
                .is_some_and(|d| d.iter().any(|x| x["loc"] == *loc))
        })
}

impl Client {
    fn edge_acct(&self, slot: usize) -> Acct {
        self.edge.as_ref().expect("near-limits").accts[slot]
    }

    fn edge_set(&mut self, slot: usize, balance: Option<i64>) {
        let basis = epoch_of(&self.ctx.state.rewinds());
        let a = &mut self.edge.as_mut().expect("near-limits").accts[slot];
        a.balance = balance;
        a.basis = basis;
    }

    /// The model's balance moves by `delta` (a 200 that moved money).
    fn edge_moved(&mut self, slot: usize, delta: i64) {
        let a = &mut self.edge.as_mut().expect("near-limits").accts[slot];
        a.balance = a.balance.and_then(|b| b.checked_add(delta));
    }

    fn edge_key(&self, slot: usize) -> String {
        self.ctx.state.account(self.edge_acct(slot).idx).client_keys[0].clone()
    }

    /// The model's knowledge still holds: it was made while no rewind ran, and none began
    /// since (nor in the op under way).
    fn edge_valid(&self, slot: usize) -> bool {
        let now = epoch_of(&self.ctx.state.rewinds());
        let basis = self.edge_acct(slot).basis;
        !now.1 && !basis.1 && now == basis && self.edge_judging()
    }

    /// The op under way began in the history that still holds: its answers are judged.
    fn edge_judging(&self) -> bool {
        let now = epoch_of(&self.ctx.state.rewinds());
        !now.1 && self.edge.as_ref().is_some_and(|e| e.op_epoch == now)
    }

    /// An op begins: the history it is judged in.
    fn edge_begin(&mut self) {
        let now = epoch_of(&self.ctx.state.rewinds());
        if let Some(e) = self.edge.as_mut() {
            e.op_epoch = now;
        }
    }

    /// The ops wait while the database goes back in time (a normal op instead); otherwise the
    /// op begins.
    fn edge_off(&mut self) -> bool {
        if self.edge.is_none() || epoch_of(&self.ctx.state.rewinds()).1 {
            return true;
        }
        self.edge_begin();
        false
    }

    fn edge_refused(&self, slot: usize, what: &'static str, reference: &str, why: &str) {
        self.ctx.state.edge_refused.lock().unwrap().push(Refused {
            account: self.edge_acct(slot).idx,
            what,
            reference: reference.to_string(),
            why: why.to_string(),
        });
    }

    fn edge_wrong(&self, slot: usize, what: &str, r: &Resp) {
        let id = self.ctx.state.account(self.edge_acct(slot).idx).id;
        let line = format!("account {id}: {what}: got {}", r.describe());
        if self.edge_judging() {
            self.ctx.violation("edge-answer", &line);
        } else {
            // The database went back in time under the op: what its answers assumed may be
            // gone (docs/contract.md "When the database goes back in time").
            self.ctx.note(&format!(
                "near-limits, not judged (a rewind under the op): {line}"
            ));
        }
    }

    /// A balance the server showed, against the model's: `edge-money` when they differ (and
    /// the model takes the server's from then on).
    fn edge_money(&mut self, slot: usize, got: i64, what: &str) {
        let a = self.edge_acct(slot);
        self.ctx.check();
        if let (Some(want), true) = (a.balance, self.edge_valid(slot)) {
            if got != want {
                let id = self.ctx.state.account(a.idx).id;
                self.ctx.violation(
                    "edge-money",
                    &format!("account {id}: {what}: the balance is {got}, the answers so far make it {want}"),
                );
            }
        }
        self.edge_set(slot, Some(got));
    }

    /// `balance.available` of a 200 that carries one, checked against the model.
    fn edge_money_of(&mut self, slot: usize, r: &Resp, what: &str) {
        match r.json().and_then(|v| v["balance"]["available"].as_i64()) {
            Some(got) => self.edge_money(slot, got, what),
            None => self.edge_wrong(slot, &format!("{what}: no balance in the 200"), r),
        }
    }

    /// The balance the server shows now (`GET /b2b/balance`), transient answers retried.
    async fn edge_read(&mut self, slot: usize) -> Option<i64> {
        let until = Instant::now() + DEFINITE_WITHIN;
        loop {
            let inst = self.instance();
            let req = Req::new("edge.balance", Method::GET, "/b2b/balance", inst, self.idx)
                .auth(Auth::Key(self.edge_key(slot)));
            let r = self.send(&req).await;
            if r.ok() {
                return r.json().and_then(|v| v["balance"]["available"].as_i64());
            }
            if Instant::now() > until
                || self.ctx.stopping.load(std::sync::atomic::Ordering::Relaxed)
            {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Reads the balance and checks it against the model.
    async fn edge_check(&mut self, slot: usize, what: &str) -> bool {
        match self.edge_read(slot).await {
            Some(got) => {
                self.edge_money(slot, got, what);
                true
            }
            None => {
                self.edge_set(slot, None);
                false
            }
        }
    }

    /// The balance the model starts from: known, or read.
    async fn edge_basis(&mut self, slot: usize) -> Option<i64> {
        let a = self.edge_acct(slot);
        if a.balance.is_some() && self.edge_valid(slot) {
            return a.balance;
        }
        let b = self.edge_read(slot).await;
        self.edge_set(slot, b);
        b
    }

    /// A keyed write sent (the same key, the same body) until its answer is definite: a 2xx or
    /// a refusal. None: none came (the balance is then unknown).
    async fn edge_keyed(&mut self, req: Req, slot: usize, op: &'static str) -> Option<Resp> {
        let until = Instant::now() + DEFINITE_WITHIN;
        let account = self.edge_acct(slot).idx;
        loop {
            let mut req = req.clone();
            req.instance = self.instance();
            let r = self.keyed(req, account, op).await;
            if !transient(&r) {
                return Some(r);
            }
            if Instant::now() > until
                || self.ctx.stopping.load(std::sync::atomic::Ordering::Relaxed)
            {
                self.edge_set(slot, None);
                return None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn edge_order(
        &mut self,
        slot: usize,
        items: Vec<Value>,
        what: &str,
    ) -> (String, Option<Resp>) {
        let key = self.next_key(what);
        let body = json!({"items": items, "externalOrderId": key});
        let req = Req::new("edge.order", Method::POST, "/b2b/orders", 0, self.idx)
            .auth(Auth::Key(self.edge_key(slot)))
            .key(key.clone())
            .json(&body);
        let r = self.edge_keyed(req, slot, "order").await;
        (key, r)
    }

    /// An order the funds pay: 200, its total, the balance after it. Returns the order.
    async fn edge_paid_order(&mut self, slot: usize, total: i64, what: &str) -> Option<EdgeOrder> {
        let (_, r) = self
            .edge_order(slot, basket_for(i128::from(total)), "eo")
            .await;
        let r = r?;
        self.ctx.check();
        let v = r.json().unwrap_or(Value::Null);
        let id = v["order"]["id"].as_str().unwrap_or("").to_string();
        if !r.ok() || id.is_empty() {
            self.edge_wrong(slot, &format!("{what} (total {total}): expected a 200"), &r);
            self.edge_set(slot, None);
            return None;
        }
        if v["order"]["total"].as_i64() != Some(total) {
            self.edge_wrong(slot, &format!("{what}: expected the total {total}"), &r);
        }
        self.edge_moved(slot, -total);
        self.edge_money_of(slot, &r, what);
        let o = EdgeOrder {
            id,
            seen: (r.start_ms, r.end_ms),
            slot,
            total,
            refunded: 0,
            placed: Instant::now(),
            closed: false,
        };
        let e = self.edge.as_mut().expect("near-limits");
        e.orders.push_back(o.clone());
        if e.orders.len() > 64 {
            e.orders.pop_front();
        }
        Some(o)
    }

    /// An admin credit of `amount` (within the bound): 200 and the balance after it. False
    /// when it was not.
    async fn edge_credit_once(&mut self, slot: usize, amount: i64) -> bool {
        let key = self.next_key("ek");
        let id = self.ctx.state.account(self.edge_acct(slot).idx).id;
        let req = self
            .admin_req(
                0,
                "edge.credit",
                Method::POST,
                format!("/admin/accounts/{id}/credits"),
            )
            .key(key.clone())
            .json(&json!({"amount": amount, "reason": key}));
        let Some(r) = self.edge_keyed(req, slot, "credit").await else {
            return false;
        };
        self.ctx.check();
        if !r.ok() {
            self.edge_wrong(slot, &format!("a credit of {amount}: expected a 200"), &r);
            self.edge_set(slot, None);
            return false;
        }
        self.edge_moved(slot, amount);
        self.edge_money_of(slot, &r, &format!("after a credit of {amount}"));
        true
    }

    /// A keyed request that a rule must refuse with `status` and `code` (or, for 422, a detail
    /// at `loc`): checked, and its reference remembered (nothing of it may ever show).
    #[allow(clippy::too_many_arguments)]
    async fn edge_refusal(
        &mut self,
        slot: usize,
        req: Req,
        op: &'static str,
        what: &str,
        want: (u16, &str),
        reference: (&'static str, &str),
    ) -> Option<Resp> {
        let r = self.edge_keyed(req, slot, op).await?;
        self.ctx.check();
        let ok = match want {
            (422, loc) => is_422_at(&r, &serde_json::from_str(loc).unwrap_or(Value::Null)),
            (status, code) => r.status == Some(status) && code_of(&r) == code,
        };
        if !ok {
            self.edge_wrong(slot, &format!("{what}: expected {} {}", want.0, want.1), &r);
        }
        if r.ok() {
            // Money moved where none should have: what the server says is the model's now.
            self.edge_set(slot, None);
        } else {
            self.edge_refused(slot, reference.0, reference.1, what);
        }
        Some(r)
    }

    /// A provider notification of `amount` to the slot's account, sent again (the same id)
    /// until its answer is definite. Returns it and the id.
    async fn edge_provider(&mut self, slot: usize, amount: i64) -> Option<(Resp, String)> {
        self.seq += 1;
        let id = format!("{}-epay-c{}-{}", self.tag, self.idx, self.seq);
        let a = self.edge_acct(slot);
        let acc_id = self.ctx.state.account(a.idx).id;
        let body = json!({"id": id, "type": "payment.succeeded", "accountId": acc_id, "amount": amount, "currency": "USD"})
            .to_string()
            .into_bytes();
        self.ctx.state.providers.lock().unwrap().insert(
            id.clone(),
            Provider {
                account: a.idx,
                amount,
                body: body.clone(),
                answers: crate::model::Unkeyed::default(),
            },
        );
        let sig = sign_provider(&self.ctx.cluster.provider_secret, &body);
        let body: Arc<[u8]> = Arc::from(body);
        let until = Instant::now() + DEFINITE_WITHIN;
        loop {
            let inst = self.instance();
            let req = Req::new(
                "edge.provider",
                Method::POST,
                "/webhooks/providers/torture",
                inst,
                self.idx,
            )
            .header("X-Signature", sig.clone())
            .body(body.clone());
            let r = self.send(&req).await;
            self.quiet_500(&r);
            if let Some(p) = self.ctx.state.providers.lock().unwrap().get_mut(&id) {
                p.answers.record(&r.outcome(), (r.start_ms, r.end_ms));
            }
            if !transient(&r) {
                return Some((r, id));
            }
            if Instant::now() > until
                || self.ctx.stopping.load(std::sync::atomic::Ordering::Relaxed)
            {
                self.edge_set(slot, None);
                return None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A provider payment the rules must refuse (`want`: a status and code, or 422 and a
    /// detail's loc): nothing credited, and it must never show.
    async fn edge_provider_refused(
        &mut self,
        slot: usize,
        amount: i64,
        what: &str,
        want: (u16, &str),
    ) {
        let Some((r, id)) = self.edge_provider(slot, amount).await else {
            return;
        };
        self.ctx.check();
        let ok = match want {
            (422, loc) => is_422_at(&r, &serde_json::from_str(loc).unwrap_or(Value::Null)),
            (status, code) => r.status == Some(status) && code_of(&r) == code,
        };
        if !ok {
            self.edge_wrong(slot, &format!("{what}: expected {} {}", want.0, want.1), &r);
        }
        if r.ok() {
            self.edge_set(slot, None);
        } else {
            self.edge_refused(slot, "provider", &id, what);
        }
    }

    fn edge_slot(&mut self) -> usize {
        if self.rng.chance(0.5) {
            PLAIN
        } else {
            CREDIT
        }
    }

    /// Credits and provider payments at the bound (credited) and past it (422, nothing).
    pub(super) async fn edge_credit(&mut self) {
        if self.edge_off() {
            return self.order_new().await;
        }
        let slot = self.edge_slot();
        if self.edge_basis(slot).await.is_none() {
            return;
        }
        let id = self.ctx.state.account(self.edge_acct(slot).idx).id;
        let over = if self.rng.chance(0.8) {
            MAX_AMOUNT + 1
        } else {
            0
        };
        let key = self.next_key("ek");
        let req = self
            .admin_req(
                0,
                "edge.credit",
                Method::POST,
                format!("/admin/accounts/{id}/credits"),
            )
            .key(key.clone())
            .json(&json!({"amount": over, "reason": key}));
        let what = format!("a credit of {over}");
        if self
            .edge_refusal(
                slot,
                req,
                "credit",
                &what,
                (422, r#"["body","amount"]"#),
                ("credit", &key),
            )
            .await
            .is_none()
        {
            return;
        }
        if !self.edge_credit_once(slot, MAX_AMOUNT).await {
            return;
        }
        let over = if self.rng.chance(0.8) {
            MAX_AMOUNT + 1
        } else {
            0
        };
        self.edge_provider_refused(
            slot,
            over,
            &format!("a provider payment of {over}"),
            (422, r#"["body","amount"]"#),
        )
        .await;
        let Some((r, _)) = self.edge_provider(slot, MAX_AMOUNT).await else {
            return;
        };
        self.ctx.check();
        let dup = r.json().and_then(|v| v["duplicate"].as_bool());
        if !r.ok() || dup.is_none() {
            self.edge_wrong(slot, "a provider payment of 10^12: expected a 200", &r);
            self.edge_set(slot, None);
            return;
        }
        self.edge_moved(slot, MAX_AMOUNT);
        self.edge_check(slot, "after a provider payment of 10^12")
            .await;
    }

    /// An order of one more than the funds (402), then of exactly the funds (200, the balance at
    /// `-creditLimit`), cancelled half the time.
    pub(super) async fn edge_exact(&mut self) {
        if self.edge_off() {
            return self.order_new().await;
        }
        let slot = self.edge_slot();
        let Some(mut b) = self.edge_basis(slot).await else {
            return;
        };
        let line = self.edge_acct(slot).line;
        if b + line < 1 {
            if !self.edge_credit_once(slot, MAX_AMOUNT).await {
                return;
            }
            match self.edge_acct(slot).balance {
                Some(x) => b = x,
                None => return,
            }
        }
        let funds = b + line;
        let (key, r) = self
            .edge_order(slot, basket_for(i128::from(funds) + 1), "eo")
            .await;
        let Some(r) = r else {
            return;
        };
        self.ctx.check();
        let code = short_code(line);
        if r.status != Some(402) || code_of(&r) != code {
            self.edge_wrong(
                slot,
                &format!(
                    "an order of {} (one more than the funds {funds}): expected 402 {code}",
                    funds + 1
                ),
                &r,
            );
        }
        if r.ok() {
            self.edge_set(slot, None);
            return;
        }
        self.edge_refused(slot, "order", &key, "an order of one more than the funds");
        let Some(o) = self
            .edge_paid_order(slot, funds, "an order of exactly the funds")
            .await
        else {
            return;
        };
        if self.rng.chance(0.5) {
            self.edge_cancel(&o).await;
        }
    }

    /// Cancels an order of this client's: 200 and the money back, or 409 if it was fulfilled
    /// first. Returns whether it was cancelled.
    async fn edge_cancel(&mut self, o: &EdgeOrder) -> bool {
        let key = self.next_key("ex");
        let req = Req::new(
            "edge.cancel",
            Method::POST,
            format!("/b2b/orders/{}/cancel", o.id),
            0,
            self.idx,
        )
        .auth(Auth::Key(self.edge_key(o.slot)))
        .key(key);
        let Some(r) = self.edge_keyed(req, o.slot, "cancel").await else {
            return false;
        };
        self.ctx.check();
        if r.ok() {
            if r.json()
                .and_then(|v| v["order"]["status"].as_str().map(str::to_string))
                .as_deref()
                != Some("cancelled")
            {
                self.edge_wrong(o.slot, "a cancel: expected the order cancelled", &r);
            }
            self.edge_close(&o.id);
            self.edge_moved(o.slot, o.total);
            self.edge_check(
                o.slot,
                &format!("after the cancel of {} (total {})", o.id, o.total),
            )
            .await;
            return true;
        }
        if r.status != Some(409) || r.token() != "order_not_cancellable" {
            self.edge_wrong(
                o.slot,
                &format!(
                    "a cancel of {}: expected 200 or 409 order_not_cancellable",
                    o.id
                ),
                &r,
            );
        }
        false
    }

    fn edge_close(&mut self, id: &str) {
        if let Some(x) = self
            .edge
            .as_mut()
            .expect("near-limits")
            .orders
            .iter_mut()
            .find(|x| x.id == id)
        {
            x.closed = true;
        }
    }

    /// Totals at i64's end and past it, quantities past 10^6, more than 200 lines: refused,
    /// nothing charged.
    pub(super) async fn edge_overflow(&mut self) {
        if self.edge_off() {
            return self.order_new().await;
        }
        let slot = self.edge_slot();
        if self.edge_basis(slot).await.is_none() {
            return;
        }
        let line = self.edge_acct(slot).line;
        let (items, what, want): (Vec<Value>, String, (u16, String)) = match self.rng.below(5) {
            0 => (
                basket_for(i128::from(i64::MAX)),
                "an order whose total is i64::MAX".into(),
                (402, short_code(line).into()),
            ),
            1 => (
                basket_for(i128::from(i64::MAX) + 1),
                "an order whose total is i64::MAX + 1".into(),
                (400, "ORDER_TOTAL_TOO_LARGE".into()),
            ),
            2 => {
                // Lines of the product at 10^12 whose quantities sum past i64's end.
                let n = self.rng.range(10, 200);
                let least = 9_223_373u64.div_ceil(n).min(MAX_QTY as u64);
                let items = (0..n)
                    .map(|_| json!({"productId": "tp-max", "quantity": self.rng.range(least, MAX_QTY as u64)}))
                    .collect();
                (
                    items,
                    format!("an order of {n} lines at 10^12 whose total passes i64::MAX"),
                    (400, "ORDER_TOTAL_TOO_LARGE".into()),
                )
            }
            3 => {
                let n = self.rng.range(1, 5) as usize;
                let at = self.rng.below(n as u64) as usize;
                let items = (0..n)
                    .map(|i| {
                        let q = if i == at { MAX_QTY + 1 } else { 1 };
                        json!({"productId": "tp-one", "quantity": q})
                    })
                    .collect();
                (
                    items,
                    "an order with a quantity of 10^6 + 1".into(),
                    (422, format!(r#"["body","items",{at},"quantity"]"#)),
                )
            }
            _ => (
                (0..201)
                    .map(|_| json!({"productId": "tp-one", "quantity": 1}))
                    .collect(),
                "an order of 201 lines".into(),
                (400, "TOO_MANY_ITEMS".into()),
            ),
        };
        let key = self.next_key("eo");
        let body = json!({"items": items, "externalOrderId": key});
        let req = Req::new("edge.order", Method::POST, "/b2b/orders", 0, self.idx)
            .auth(Auth::Key(self.edge_key(slot)))
            .key(key.clone())
            .json(&body);
        let Some(_) = self
            .edge_refusal(
                slot,
                req,
                "order",
                &what,
                (want.0, &want.1),
                ("order", &key),
            )
            .await
        else {
            return;
        };
        self.edge_check(slot, &format!("after {what} was refused"))
            .await;
    }

    /// On a fulfilled order: a refund of the remainder and one more (409), of exactly the
    /// remainder (200, the money back), then of 1 more (409).
    pub(super) async fn edge_refund(&mut self) {
        if self.edge_off() {
            return self.order_new().await;
        }
        let rw = self.ctx.state.rewinds();
        let o = self.edge.as_ref().and_then(|e| {
            e.orders
                .iter()
                .rev()
                .find(|o| {
                    o.slot != RICH
                        && !rw.at_risk(o.seen)
                        && !o.closed
                        && o.refunded < o.total
                        && o.placed.elapsed() >= Duration::from_millis(1500)
                })
                .cloned()
        });
        let Some(o) = o else {
            return self.edge_exact().await;
        };
        if self.edge_basis(o.slot).await.is_none() {
            return;
        }
        let rem = o.total - o.refunded;
        let path = format!("/b2b/orders/{}/refunds", o.id);
        let refund = |c: &mut Client, body: Option<Value>| {
            let key = c.next_key("ef");
            let mut req = Req::new("edge.refund", Method::POST, path.clone(), 0, c.idx)
                .auth(Auth::Key(c.edge_key(o.slot)))
                .key(key);
            if let Some(b) = body {
                req = req.json(&b);
            }
            req
        };
        let req = refund(self, Some(json!({"amount": rem + 1})));
        let Some(r) = self.edge_keyed(req, o.slot, "refund").await else {
            return;
        };
        self.ctx.check();
        if r.status == Some(409) && r.token() == "order_not_refundable" {
            // Not fulfilled yet (or cancelled by another path): later.
            return;
        }
        let at_most = format!("at most {rem} can still be refunded");
        if r.status != Some(409)
            || r.token() != "refund_exceeds_remaining"
            || !r.error_text().contains(&at_most)
        {
            self.edge_wrong(o.slot, &format!("a refund of {} on {} ({rem} left): expected 409 refund_exceeds_remaining, {at_most}", rem + 1, o.id), &r);
        }
        if r.ok() {
            self.edge_set(o.slot, None);
            return;
        }
        // Exactly the remainder: with the amount, or without a body (the whole remainder).
        let body = if self.rng.chance(0.5) {
            Some(json!({"amount": rem}))
        } else {
            None
        };
        let req = refund(self, body);
        let Some(r) = self.edge_keyed(req, o.slot, "refund").await else {
            return;
        };
        self.ctx.check();
        let v = r.json().unwrap_or(Value::Null);
        if !r.ok()
            || v["refund"]["amount"].as_i64() != Some(rem)
            || v["order"]["refundedAmount"].as_i64() != Some(o.total)
        {
            self.edge_wrong(o.slot, &format!("a refund of the remainder {rem} of {}: expected 200, that amount, refundedAmount {}", o.id, o.total), &r);
            self.edge_set(o.slot, None);
            return;
        }
        if let Some(x) = self
            .edge
            .as_mut()
            .and_then(|e| e.orders.iter_mut().find(|x| x.id == o.id))
        {
            x.refunded = x.total;
        }
        self.edge_moved(o.slot, rem);
        self.edge_check(o.slot, &format!("after a refund of {rem} on {}", o.id))
            .await;
        let req = refund(self, Some(json!({"amount": 1})));
        let Some(r) = self.edge_keyed(req, o.slot, "refund").await else {
            return;
        };
        self.ctx.check();
        if r.status != Some(409) || r.token() != "refund_exceeds_remaining" {
            self.edge_wrong(
                o.slot,
                &format!(
                    "a refund of 1 on {} (nothing left): expected 409 refund_exceeds_remaining",
                    o.id
                ),
                &r,
            );
        }
        if r.ok() {
            self.edge_set(o.slot, None);
        }
    }

    /// The account carried over with a balance near i64::MAX: an order, credits up to i64's
    /// end exactly, then a credit of 1 and a payment of 1 (400 BALANCE_TOO_LARGE), the
    /// order's cancel (or, fulfilled, its refund) refused for the same reason, room made by
    /// another order, and the same key then succeeds.
    pub(super) async fn edge_rich(&mut self) {
        if self.edge_off() {
            return self.order_new().await;
        }
        if self.edge_basis(RICH).await.is_none() {
            return;
        }
        let total = MAX_AMOUNT + self.rng.range(1, 999_999) as i64;
        let Some(o) = self
            .edge_paid_order(RICH, total, "an order on the account near i64::MAX")
            .await
        else {
            return;
        };
        // Credits up to i64::MAX exactly.
        loop {
            let Some(b) = self.edge_acct(RICH).balance else {
                return;
            };
            let room = i64::MAX - b;
            if room == 0 {
                break;
            }
            if !self.edge_credit_once(RICH, room.min(MAX_AMOUNT)).await {
                return;
            }
        }
        let id = self.ctx.state.account(self.edge_acct(RICH).idx).id;
        let key = self.next_key("ek");
        let req = self
            .admin_req(
                0,
                "edge.credit",
                Method::POST,
                format!("/admin/accounts/{id}/credits"),
            )
            .key(key.clone())
            .json(&json!({"amount": 1, "reason": key}));
        if self
            .edge_refusal(
                RICH,
                req,
                "credit",
                "a credit of 1 at i64::MAX",
                (400, "BALANCE_TOO_LARGE"),
                ("credit", &key),
            )
            .await
            .is_none()
        {
            return;
        }
        self.edge_provider_refused(
            RICH,
            1,
            "a provider payment of 1 at i64::MAX",
            (400, "BALANCE_TOO_LARGE"),
        )
        .await;
        // The order's money back does not fit: refused, nothing changed, the key free.
        let ckey = self.next_key("ex");
        let cancel = Req::new(
            "edge.cancel",
            Method::POST,
            format!("/b2b/orders/{}/cancel", o.id),
            0,
            self.idx,
        )
        .auth(Auth::Key(self.edge_key(RICH)))
        .key(ckey.clone());
        let Some(r) = self.edge_keyed(cancel.clone(), RICH, "cancel").await else {
            return;
        };
        self.ctx.check();
        let (again, op, what) = if r.status == Some(409) && r.token() == "order_not_cancellable" {
            // Fulfilled first: its refund, the same way.
            let rkey = self.next_key("ef");
            let refund = Req::new(
                "edge.refund",
                Method::POST,
                format!("/b2b/orders/{}/refunds", o.id),
                0,
                self.idx,
            )
            .auth(Auth::Key(self.edge_key(RICH)))
            .key(rkey);
            let Some(r) = self.edge_keyed(refund.clone(), RICH, "refund").await else {
                return;
            };
            self.ctx.check();
            if r.status == Some(409) && r.token() == "order_not_refundable" {
                return;
            }
            if r.status != Some(400)
                || code_of(&r) != "BALANCE_TOO_LARGE"
                || !r.error_text().contains("this refund")
            {
                self.edge_wrong(RICH, &format!("a refund of {} ({total}) at i64::MAX: expected 400 BALANCE_TOO_LARGE (this refund)", o.id), &r);
                if r.ok() {
                    self.edge_set(RICH, None);
                }
                return;
            }
            (refund, "refund", "refund")
        } else {
            if r.status != Some(400)
                || code_of(&r) != "BALANCE_TOO_LARGE"
                || !r.error_text().contains("this cancel")
            {
                self.edge_wrong(RICH, &format!("a cancel of {} ({total}) at i64::MAX: expected 400 BALANCE_TOO_LARGE (this cancel)", o.id), &r);
                if r.ok() {
                    self.edge_set(RICH, None);
                }
                return;
            }
            (cancel, "cancel", "cancel")
        };
        if !self
            .edge_check(RICH, &format!("after the {what} of {} was refused", o.id))
            .await
        {
            return;
        }
        // Room made by another order; the same key then succeeds.
        if self
            .edge_paid_order(RICH, total, "an order that makes room")
            .await
            .is_none()
        {
            return;
        }
        let Some(r) = self.edge_keyed(again, RICH, op).await else {
            return;
        };
        self.ctx.check();
        if !r.ok() {
            if what == "cancel" && r.status == Some(409) && r.token() == "order_not_cancellable" {
                // Fulfilled meanwhile: the room stays for the next round.
                return;
            }
            self.edge_wrong(
                RICH,
                &format!(
                    "the same {what} key of {} once there was room: expected 200",
                    o.id
                ),
                &r,
            );
            self.edge_set(RICH, None);
            return;
        }
        self.edge_close(&o.id);
        self.edge_moved(RICH, total);
        self.edge_check(
            RICH,
            &format!("after the {what} of {} once there was room", o.id),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total_of(items: &[Value]) -> i128 {
        items
            .iter()
            .map(|i| {
                let p = match i["productId"].as_str().unwrap() {
                    "tp-max" => 1_000_000_000_000i128,
                    "tp-mega" => 1_000_000,
                    _ => 1,
                };
                p * i128::from(i["quantity"].as_i64().unwrap())
            })
            .sum()
    }

    #[test]
    fn a_basket_makes_any_total_exactly_within_the_bounds() {
        for t in [
            1i128,
            999_999,
            1_000_000,
            1_000_000_000_000,
            2_000_000_000_001,
            i128::from(i64::MAX),
            i128::from(i64::MAX) + 1,
        ] {
            let items = basket_for(t);
            assert_eq!(total_of(&items), t, "{t}");
            assert!(items.len() <= 200);
            assert!(items
                .iter()
                .all(|i| (1..=MAX_QTY).contains(&i["quantity"].as_i64().unwrap())));
        }
        assert_eq!(basket_for(i128::from(i64::MAX)).len(), 12);
    }
}
