//! Public identifiers: a type prefix (`acc_`, `ord_`, ...) and a UUIDv7 in simple form.
//!
//! UUIDv7 is time-ordered, so the 16 raw bytes make sled keys that sort by creation time:
//! the newest-first lists are reverse scans with no secondary time index.

use std::sync::Mutex;

use uuid::timestamp::context::ContextV7;
use uuid::{Timestamp, Uuid};

/// Keeps the ids this process makes strictly increasing, even within one millisecond or
/// when now steps back (a re-anchoring to the database's clock).
static CONTEXT: Mutex<ContextV7> = Mutex::new(ContextV7::new());

/// What an id names; each kind has its own public prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    /// An account (`acc_`).
    Account,
    /// An order (`ord_`).
    Order,
    /// An event (`evt_`).
    Event,
    /// A refund (`ref_`).
    Refund,
    /// A ledger transaction (`txn_`).
    Transaction,
    /// An API key (`key_`).
    ApiKey,
}

impl IdKind {
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            IdKind::Account => "acc_",
            IdKind::Order => "ord_",
            IdKind::Event => "evt_",
            IdKind::Refund => "ref_",
            IdKind::Transaction => "txn_",
            IdKind::ApiKey => "key_",
        }
    }
}

/// A typed id; `Display` gives the public form, `bytes` the 16-byte storage form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id {
    kind_prefix: &'static str,
    uuid: Uuid,
}

impl Id {
    /// A fresh, time-ordered id, stamped with the process's now (`time::now_micros`: the
    /// database's clock when instances share one). UUIDv7 from one process is monotonic.
    pub fn new(kind: IdKind) -> Self {
        let micros = super::time::now_micros().max(0) as u64;
        let (seconds, nanos) = (micros / 1_000_000, (micros % 1_000_000) as u32 * 1_000);
        let context = CONTEXT.lock().unwrap_or_else(|e| e.into_inner());
        Id {
            kind_prefix: kind.prefix(),
            uuid: Uuid::new_v7(Timestamp::from_unix(&*context, seconds, nanos)),
        }
    }

    /// A fresh id greater than `last`: where ids made by several processes must follow one
    /// order (an account's events, made under its lock), each is made after the newest.
    /// When the clock has not passed `last`, it is `last` plus one, which changes only its
    /// random bits (a carry into the variant bits needs 62 random bits that are all ones).
    pub(crate) fn after(kind: IdKind, last: Option<Id>) -> Self {
        let fresh = Id::new(kind);
        match last {
            Some(last) if last.uuid >= fresh.uuid => Id {
                kind_prefix: kind.prefix(),
                uuid: Uuid::from_u128(last.uuid.as_u128().wrapping_add(1)),
            },
            _ => fresh,
        }
    }

    /// Parses `acc_<32 lowercase hex>`; anything else is `None`.
    pub fn parse(kind: IdKind, text: &str) -> Option<Self> {
        let hex = text.strip_prefix(kind.prefix())?;
        let valid = hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !valid {
            return None;
        }
        Uuid::try_parse(hex).ok().map(|uuid| Id {
            kind_prefix: kind.prefix(),
            uuid,
        })
    }

    pub(crate) fn from_bytes(kind: IdKind, bytes: &[u8]) -> Option<Self> {
        let array: [u8; 16] = bytes.try_into().ok()?;
        Some(Id {
            kind_prefix: kind.prefix(),
            uuid: Uuid::from_bytes(array),
        })
    }

    pub(crate) fn bytes(&self) -> [u8; 16] {
        *self.uuid.as_bytes()
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.kind_prefix, self.uuid.simple())
    }
}

/// Declares a typed id over `Id`: parsed once at the edge, then carried as a value whose
/// kind cannot be confused. It is stored and sent as its public string, so records that held
/// a plain `String` id read the same bytes.
macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident, $kind:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Id);

        impl $name {
            /// A new id of this kind, later than every one this process made before.
            pub fn new() -> Self {
                $name(Id::new($kind))
            }

            /// The public form (`acc_…`); anything else is `None`.
            pub fn parse(text: &str) -> Option<Self> {
                Id::parse($kind, text).map($name)
            }

            pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Self> {
                Id::from_bytes($kind, bytes).map($name)
            }

            /// The 16-byte storage form.
            pub(crate) fn bytes(&self) -> [u8; 16] {
                self.0.bytes()
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                $name::parse(&text).ok_or_else(|| {
                    serde::de::Error::custom(format!("not a {} id: {text:?}", $kind.prefix()))
                })
            }
        }
    };
}

typed_id!(
    /// An account's id (`acc_…`).
    AccountId,
    IdKind::Account
);
typed_id!(
    /// An order's id (`ord_…`).
    OrderId,
    IdKind::Order
);

/// 32 lowercase hex characters of fresh randomness (122 bits from a v4 UUID).
pub(crate) fn random_hex() -> String {
    Uuid::new_v4().simple().to_string()
}

/// `len` random bytes, drawn from v4 UUIDs (the OS generator behind them).
pub(crate) fn random_bytes(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        out.extend_from_slice(Uuid::new_v4().as_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_made_after_another_is_greater_even_when_the_other_is_from_the_future() {
        let now = Id::new(IdKind::Event);
        assert!(Id::after(IdKind::Event, Some(now)) > now);
        // Ten minutes ahead, as another instance's clock might have made it.
        let ahead = Id {
            kind_prefix: "evt_",
            uuid: Uuid::from_u128(now.uuid.as_u128() + (600_000u128 << 80)),
        };
        let next = Id::after(IdKind::Event, Some(ahead));
        assert!(next > ahead);
        assert_eq!(next.uuid.as_u128(), ahead.uuid.as_u128() + 1);
        assert!(Id::after(IdKind::Event, None) > now);
    }

    #[test]
    fn an_id_round_trips_through_its_public_form() {
        let id = Id::new(IdKind::Order);
        let text = id.to_string();
        assert!(text.starts_with("ord_") && text.len() == 36);
        assert_eq!(Id::parse(IdKind::Order, &text), Some(id));
    }

    #[test]
    fn an_id_of_another_kind_or_case_does_not_parse() {
        let text = Id::new(IdKind::Order).to_string();
        assert_eq!(Id::parse(IdKind::Account, &text), None);
        assert_eq!(Id::parse(IdKind::Order, &text.to_uppercase()), None);
        assert_eq!(Id::parse(IdKind::Order, "ord_123"), None);
    }

    #[test]
    fn a_typed_id_is_stored_as_the_string_a_plain_id_was() {
        let id = AccountId::new();
        let typed = bincode::serde::encode_to_vec(id, bincode::config::standard()).unwrap();
        let plain =
            bincode::serde::encode_to_vec(id.to_string(), bincode::config::standard()).unwrap();
        assert_eq!(typed, plain);
        let (back, _): (AccountId, usize) =
            bincode::serde::decode_from_slice(&plain, bincode::config::standard()).unwrap();
        assert_eq!(back, id);
    }

    #[test]
    fn later_ids_sort_after_earlier_ones() {
        let a = Id::new(IdKind::Transaction);
        let b = Id::new(IdKind::Transaction);
        assert!(a.bytes() < b.bytes());
    }
}
