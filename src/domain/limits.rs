//! Every size and range the API enforces, in one place: the checks and the messages that
//! name a limit both read it from here (and a test holds `/openapi.json` to the same numbers).

/// Lines in one order.
pub(crate) const MAX_LINES: usize = 200;
/// Units in one line.
pub(crate) const MAX_QUANTITY: i64 = 1_000_000;
pub(crate) const MAX_PRODUCT_ID_LEN: usize = 64;
pub(crate) const MAX_CALLBACK_URL_LEN: usize = 2048;
pub(crate) const MAX_EXTERNAL_ORDER_ID_LEN: usize = 128;
/// The free-text reason of a refund or a credit.
pub(crate) const MAX_REASON_LEN: usize = 256;
/// Account and product names.
pub(crate) const MAX_NAME_LEN: usize = 200;
/// A region code such as `EU`.
pub(crate) const MAX_REGION_LEN: usize = 16;
/// The name of a required delivery field.
pub(crate) const MAX_DELIVERY_FIELD_LEN: usize = 64;
/// A price, a credit line or a single credit: 10^12 minor units.
pub(crate) const MAX_AMOUNT: i64 = 1_000_000_000_000;
/// An idempotency key, in characters.
pub(crate) const MAX_KEY_LEN: usize = 255;
/// A payment provider's own id of a notification.
pub(crate) const MAX_PROVIDER_ID_LEN: usize = 255;
/// A request body.
pub(crate) const MAX_BODY_BYTES: usize = 1 << 20;
/// Items per list page, and the default.
pub(crate) const MAX_PAGE: usize = 100;
pub(crate) const DEFAULT_PAGE: usize = 50;
