//! The JSON shapes partners and operators see, built from stored records: shared by the HTTP
//! API and the webhook worker, so an event body is the same wherever it is rendered.

use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

use crate::domain::account::Account;
use crate::domain::chain::{to_hex, LedgerHead};
use crate::domain::event::{DeliveryLog, DeliveryState, Event};
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::domain::order::{BalanceView, Order, Refund};
use crate::domain::product::Product;
use crate::domain::time::rfc3339;

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OrderItemJson<'a> {
    product_id: &'a str,
    quantity: u64,
    delivery_data: &'a BTreeMap<String, String>,
    unit_price: i64,
    amount: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OrderJson<'a> {
    id: String,
    status: &'static str,
    items: Vec<OrderItemJson<'a>>,
    total: i64,
    currency: &'a str,
    callback_url: Option<&'a str>,
    external_order_id: Option<&'a str>,
    refunded_amount: i64,
    created_at: String,
    updated_at: String,
}

impl<'a> From<&'a Order> for OrderJson<'a> {
    fn from(order: &'a Order) -> Self {
        OrderJson {
            id: order.id.to_string(),
            status: order.status.as_str(),
            items: order
                .items
                .iter()
                .map(|line| OrderItemJson {
                    product_id: &line.product_id,
                    quantity: line.quantity,
                    delivery_data: &line.delivery_data,
                    unit_price: line.unit_price.0,
                    amount: line.amount.0,
                })
                .collect(),
            total: order.total.0,
            currency: &order.currency,
            callback_url: order.callback_url.as_deref(),
            external_order_id: order.external_order_id.as_deref(),
            refunded_amount: order.refunded.0,
            created_at: rfc3339(order.created_at),
            updated_at: rfc3339(order.updated_at),
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BalanceJson<'a> {
    available: i64,
    credit_limit: i64,
    currency: &'a str,
}

impl<'a> From<&'a BalanceView> for BalanceJson<'a> {
    fn from(b: &'a BalanceView) -> Self {
        BalanceJson {
            available: b.available.0,
            credit_limit: b.credit_limit.0,
            currency: &b.currency,
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LedgerEntryJson<'a> {
    id: &'a str,
    amount: i64,
    reason: &'static str,
    reference: &'a str,
    balance_after: i64,
    created_at: String,
    /// The entry's place in the account's ledger: 1, 2, 3 ... without gaps (`null` only for
    /// an entry an instance of an earlier version wrote moments ago, not chained yet).
    #[schema(minimum = 1)]
    seq: Option<u64>,
    /// SHA-256 (lowercase hex) over this entry and `previousHash`: docs/api.md "Verifying
    /// your ledger".
    hash: Option<String>,
    /// The hash of the entry before (for seq 1, the account's genesis hash).
    previous_hash: Option<String>,
}

impl<'a> From<&'a LedgerEntry> for LedgerEntryJson<'a> {
    fn from(e: &'a LedgerEntry) -> Self {
        let chained = e.seq != 0;
        LedgerEntryJson {
            id: &e.id,
            amount: e.amount.0,
            reason: e.reason.as_str(),
            reference: &e.reference,
            balance_after: e.balance_after.0,
            created_at: rfc3339(e.created_at),
            seq: chained.then_some(e.seq),
            hash: chained.then(|| to_hex(&e.hash)),
            previous_hash: chained.then(|| to_hex(&e.previous_hash)),
        }
    }
}

/// The newest entry of a ledger: `seq` 0 and the genesis hash when it has none.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LedgerHeadJson {
    seq: u64,
    hash: String,
}

impl From<&LedgerHead> for LedgerHeadJson {
    fn from(head: &LedgerHead) -> Self {
        LedgerHeadJson {
            seq: head.seq,
            hash: to_hex(&head.hash),
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ProductJson<'a> {
    id: &'a str,
    name: &'a str,
    price: i64,
    regions: &'a [String],
    delivery_fields: &'a [String],
    active: bool,
}

impl<'a> From<&'a Product> for ProductJson<'a> {
    fn from(p: &'a Product) -> Self {
        ProductJson {
            id: &p.id,
            name: &p.name,
            price: p.price.0,
            regions: &p.regions,
            delivery_fields: &p.delivery_fields,
            active: p.active,
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AccountJson<'a> {
    id: String,
    name: &'a str,
    wholesale: bool,
    balance: i64,
    credit_limit: i64,
    region: Option<&'a str>,
    webhook_secret: &'a str,
    created_at: String,
}

impl<'a> AccountJson<'a> {
    pub(crate) fn new(account: &'a Account, balance: Cents) -> Self {
        AccountJson {
            id: account.id.to_string(),
            name: &account.name,
            wholesale: account.wholesale,
            balance: balance.0,
            credit_limit: account.credit_limit.0,
            region: account.region.as_deref(),
            webhook_secret: &account.webhook_secret,
            created_at: rfc3339(account.created_at),
        }
    }
}

/// An account in the operator's list: the object of `GET /admin/accounts/{id}` without its
/// webhook secret.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AccountSummaryJson<'a> {
    id: String,
    name: &'a str,
    wholesale: bool,
    balance: i64,
    credit_limit: i64,
    region: Option<&'a str>,
    created_at: String,
}

impl<'a> AccountSummaryJson<'a> {
    pub(crate) fn new(account: &'a Account, balance: Cents) -> Self {
        AccountSummaryJson {
            id: account.id.to_string(),
            name: &account.name,
            wholesale: account.wholesale,
            balance: balance.0,
            credit_limit: account.credit_limit.0,
            region: account.region.as_deref(),
            created_at: rfc3339(account.created_at),
        }
    }
}

/// One attempt of a callback, as the console shows it.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveryAttemptJson<'a> {
    attempt: u32,
    at: String,
    /// The receiver's HTTP status, or null when it did not answer.
    status: Option<u16>,
    /// Why there was no answer (or why delivery was given up), else null.
    error: Option<&'a str>,
}

/// An event as the operator sees it: the partner's event and its callback's state.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdminEventJson<'a> {
    #[serde(flatten)]
    event: EventJson<'a>,
    /// `none` (no callbackUrl), `pending`, `delivered`, `retrying` or `given_up`.
    delivery: &'static str,
    next_attempt_at: Option<String>,
    deliveries: Vec<DeliveryAttemptJson<'a>>,
}

impl<'a> AdminEventJson<'a> {
    pub(crate) fn new(event: &'a Event, log: Option<&'a DeliveryLog>) -> Self {
        let state = DeliveryState::of(event, log);
        let next = match state {
            // The first attempt is due when the event is made.
            DeliveryState::Pending => Some(event.created_at),
            DeliveryState::Retrying => log.and_then(|l| l.next_attempt_at),
            _ => None,
        };
        AdminEventJson {
            event: event.into(),
            delivery: state.as_str(),
            next_attempt_at: next.map(rfc3339),
            deliveries: log
                .map(|l| {
                    l.attempts
                        .iter()
                        .map(|a| DeliveryAttemptJson {
                            attempt: a.attempt,
                            at: rfc3339(a.at),
                            status: a.status,
                            error: a.error.as_deref(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RefundJson<'a> {
    id: &'a str,
    order_id: String,
    amount: i64,
    reason: Option<&'a str>,
    created_at: String,
}

impl<'a> From<&'a Refund> for RefundJson<'a> {
    fn from(r: &'a Refund) -> Self {
        RefundJson {
            id: &r.id,
            order_id: r.order_id.to_string(),
            amount: r.amount.0,
            reason: r.reason.as_deref(),
            created_at: rfc3339(r.created_at),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub(crate) struct EventDataJson<'a> {
    order: OrderJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refund: Option<RefundJson<'a>>,
}

/// An event as listed and as POSTed to the callbackUrl:
/// `{"id","type","createdAt","data":{"order":{…}}}`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EventJson<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    created_at: String,
    data: EventDataJson<'a>,
}

impl<'a> From<&'a Event> for EventJson<'a> {
    fn from(e: &'a Event) -> Self {
        EventJson {
            id: &e.id,
            kind: e.kind.as_str(),
            created_at: rfc3339(e.created_at),
            data: EventDataJson {
                order: (&e.order).into(),
                refund: e.refund.as_ref().map(RefundJson::from),
            },
        }
    }
}

/// The callback body of an event; the same bytes on every attempt.
pub(crate) fn event_body(event: &Event) -> Vec<u8> {
    to_json(&EventJson::from(event))
}

/// Declares a response type: the struct that is serialized is the one `/openapi.json`
/// documents, so the document cannot drift from the wire.
macro_rules! response {
    ($(#[$doc:meta])* $name:ident<$lt:lifetime> { $($field:ident: $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Serialize, ToSchema)]
        #[serde(rename_all = "camelCase")]
        pub(crate) struct $name<$lt> {
            pub(crate) success: bool,
            $(pub(crate) $field: $ty),*
        }
    };
}

response!(
    /// `POST /b2b/orders`: the order and the balance after it.
    OrderPlaced<'a> { order: OrderJson<'a>, balance: BalanceJson<'a> }
);
response!(
    /// A single order: `GET /b2b/orders/{id}` and the 200 of a cancel.
    OrderOne<'a> { order: OrderJson<'a> }
);
response!(
    /// A refund and the order after it.
    RefundMade<'a> { refund: RefundJson<'a>, order: OrderJson<'a> }
);
response!(
    /// The balance after a credit.
    BalanceOne<'a> { balance: BalanceJson<'a> }
);
response!(
    /// `GET /b2b/balance`: the balance now and the head of the ledger that sums to it.
    BalanceNow<'a> { balance: BalanceJson<'a>, ledger_head: LedgerHeadJson }
);
response!(
    /// An account as the operator sees it.
    AccountOne<'a> { account: AccountJson<'a> }
);
response!(
    /// A new API key; its plaintext appears only here.
    ApiKeyCreated<'a> { api_key: ApiKeyJson<'a> }
);
response!(
    /// A product as stored.
    ProductOne<'a> { product: ProductJson<'a> }
);
response!(
    /// The account's orders, newest first.
    OrderList<'a> { orders: Vec<OrderJson<'a>>, next_cursor: Option<&'a str> }
);
response!(
    /// The ledger, newest first; it sums to the balance.
    TransactionList<'a> { transactions: Vec<LedgerEntryJson<'a>>, next_cursor: Option<&'a str> }
);
response!(
    /// Active products in id order.
    ProductList<'a> { products: Vec<ProductJson<'a>>, next_cursor: Option<&'a str> }
);
response!(
    /// The account's events, oldest first.
    EventList<'a> { events: Vec<EventJson<'a>>, next_cursor: Option<&'a str> }
);
response!(
    /// Every account, oldest first (the operator's list).
    AccountList<'a> { accounts: Vec<AccountSummaryJson<'a>>, next_cursor: Option<&'a str> }
);
response!(
    /// An account's events with their callbacks' state, oldest first.
    AdminEventList<'a> { events: Vec<AdminEventJson<'a>>, next_cursor: Option<&'a str> }
);
response!(
    /// `/healthz` and `/readyz`.
    Health<'a> { status: &'a str }
);

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ApiKeyJson<'a> {
    pub(crate) id: &'a str,
    /// The plaintext key: shown only in this answer.
    pub(crate) key: &'a str,
    pub(crate) scopes: Vec<&'static str>,
    pub(crate) account_id: String,
    /// The key's end, `null` when it has none.
    #[schema(format = DateTime)]
    pub(crate) expires_at: Option<String>,
}

/// `{"success":true}`.
#[derive(Serialize, ToSchema)]
pub(crate) struct Success {
    pub(crate) success: bool,
}

/// The answer to a provider notification.
#[derive(Serialize, ToSchema)]
pub(crate) struct ProviderAck {
    pub(crate) success: bool,
    /// True when this notification was already credited (nothing moved this time).
    pub(crate) duplicate: bool,
    /// Present (true) for notification types that move no money.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub(crate) ignored: Option<bool>,
}

/// `{"success":true,"order":{…}}`: a single order, also the 200 of a cancel.
pub fn order_only(order: &Order) -> Vec<u8> {
    to_json(&OrderOne {
        success: true,
        order: order.into(),
    })
}

/// The 200 of a refund: the refund and the order after it.
pub fn refund_made(refund: &Refund, order: &Order) -> Vec<u8> {
    to_json(&RefundMade {
        success: true,
        refund: refund.into(),
        order: order.into(),
    })
}

/// The 200 of `POST /b2b/orders`, rendered inside the order's transaction.
pub fn order_placed(order: &Order, balance: &BalanceView) -> Vec<u8> {
    to_json(&OrderPlaced {
        success: true,
        order: order.into(),
        balance: balance.into(),
    })
}

/// The 200 of a balance-changing admin call.
pub fn balance_only(balance: &BalanceView) -> Vec<u8> {
    to_json(&BalanceOne {
        success: true,
        balance: balance.into(),
    })
}

pub(crate) fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing these plain structs into a Vec cannot fail.
    serde_json::to_vec(value).expect("views serialize")
}
