//! What the cases build their requests from: an account with money, a product, a key claim,
//! and the port's requests as the handlers make them (with the real renderers, so the bytes
//! stored are the bytes a partner gets).

use std::time::Duration;

use orderly::now_millis;
use orderly::Account;
use orderly::Cents;
use orderly::Deadline;
use orderly::IdempotencyKey;
use orderly::LedgerReason;
use orderly::Product;
use orderly::RequestedLine;
use orderly::{balance_only, order_only, order_placed, refund_made};
use orderly::{AccountId, Id, IdKind, OrderId};
use orderly::{AddressPolicy, CallbackUrl};
use orderly::{CancelRequest, KeyClaim, NewCredit, NewOrder, RefundRequest, Store};
use orderly::{Fingerprint, Operation};

pub const PRODUCT: &str = "prd_port";
pub const PRICE: i64 = 100;

/// The deadline of a port call in these tests: long enough for any engine on a loaded machine.
pub fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(30))
}

pub async fn product(store: &dyn Store) {
    store
        .put_product(
            soon(),
            Product {
                id: PRODUCT.into(),
                name: "port".into(),
                price: Cents(PRICE),
                regions: vec![],
                delivery_fields: vec![],
                active: true,
                updated_at: now_millis(),
            },
        )
        .await
        .unwrap();
}

/// A new account holding `balance`, with the product in the catalog.
pub async fn account_with(store: &dyn Store, balance: i64, credit_limit: i64) -> Account {
    product(store).await;
    let account = Account {
        id: AccountId::new(),
        name: "port partner".into(),
        wholesale: true,
        credit_limit: Cents(credit_limit),
        region: None,
        webhook_secret: "whsec_cG9ydA==".into(),
        created_at: now_millis(),
    };
    store.create_account(soon(), account.clone()).await.unwrap();
    if balance > 0 {
        store
            .credit(soon(), credit(&account, balance, None))
            .await
            .unwrap()
            .unwrap();
    }
    account
}

pub fn claim(key: &str, operation: Operation, ttl: Duration) -> KeyClaim {
    KeyClaim {
        key: IdempotencyKey::parse(key.as_bytes()).unwrap(),
        operation,
        fingerprint: Fingerprint([7; 32]),
        ttl,
        wait_until: std::time::Instant::now() + Duration::from_secs(5),
    }
}

pub fn credit(account: &Account, amount: i64, claim: Option<KeyClaim>) -> NewCredit {
    NewCredit {
        account: account.clone(),
        amount: Cents(amount),
        reason: LedgerReason::Credit,
        reference: "port".into(),
        currency: "USD".into(),
        claim,
        render: balance_only,
    }
}

pub fn order(account: &Account, key: &str, quantity: u64) -> NewOrder {
    order_with(account, key, quantity, None)
}

pub fn order_with(account: &Account, key: &str, quantity: u64, url: Option<&str>) -> NewOrder {
    NewOrder {
        account: account.clone(),
        lines: vec![RequestedLine {
            product_id: PRODUCT.into(),
            quantity,
            delivery_data: Default::default(),
        }],
        currency: "USD".into(),
        callback_url: url.map(|u| CallbackUrl::parse(u, AddressPolicy::AllowPrivate).unwrap()),
        external_order_id: None,
        claim: claim(key, Operation::PlaceOrder, Duration::from_secs(3600)),
        render: order_placed,
    }
}

pub fn cancel(account: &Account, order: OrderId) -> CancelRequest {
    CancelRequest {
        account: account.id,
        order,
        claim: None,
        render: order_only,
    }
}

pub fn refund(account: &Account, order: OrderId, key: &str, amount: Option<i64>) -> RefundRequest {
    RefundRequest {
        account: account.id,
        order,
        amount: amount.map(Cents),
        reason: None,
        claim: claim(key, Operation::RefundOrder, Duration::from_secs(3600)),
        id: Id::new(IdKind::Refund),
        render: refund_made,
    }
}

/// Places an order (with `url` as its callbackUrl) and cancels it: one event, and one
/// callback when there is a url.
pub async fn placed_and_cancelled(
    store: &dyn Store,
    account: &Account,
    key: &str,
    url: Option<&str>,
) {
    let body = store
        .place_order(soon(), order_with(account, key, 1, url))
        .await
        .unwrap()
        .unwrap();
    store
        .cancel_order(soon(), cancel(account, placed_id(&body)))
        .await
        .unwrap()
        .unwrap();
}

/// The id of the order an accepted `place_order` answered with (from its stored body).
pub fn placed_id(body: &[u8]) -> OrderId {
    let json: serde_json::Value = serde_json::from_slice(body).unwrap();
    let id = json["order"]["id"]
        .as_str()
        .expect("the body names the order");
    OrderId::parse(id).expect("an order id")
}

/// Every ledger entry of the account, newest first, through the port's pages.
pub async fn ledger(store: &dyn Store, account: &Account) -> Vec<orderly::LedgerEntry> {
    let mut all = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .ledger_page(soon(), account.id, before, 7)
            .await
            .unwrap();
        all.extend(page.items);
        match page.next_cursor {
            Some(cursor) => before = orderly::Id::parse(orderly::IdKind::Transaction, &cursor),
            None => return all,
        }
    }
}
