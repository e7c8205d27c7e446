//! Byte keys built so that sled's ordering does the work: fixed 16-byte ids (UUIDv7, time
//! ordered), big-endian times, and length prefixes wherever a variable part is followed by more.

use crate::domain::idempotency_key::IdempotencyKey;

/// `account ‖ idempotency key`: the per-account key namespace.
pub(super) fn scoped_key(account: &[u8; 16], key: &IdempotencyKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + key.as_str().len());
    out.extend_from_slice(account);
    out.extend_from_slice(key.as_str().as_bytes());
    out
}

/// `expires_at ‖ account ‖ key`: the sweeper scans this up to now.
pub(super) fn expiry_key(expires_at: u64, scoped: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + scoped.len());
    out.extend_from_slice(&expires_at.to_be_bytes());
    out.extend_from_slice(scoped);
    out
}

/// `prefix ‖ id`.
pub(super) fn child_key(prefix: &[u8], id: &[u8; 16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 16);
    out.extend_from_slice(prefix);
    out.extend_from_slice(id);
    out
}

/// `account ‖ len(externalOrderId) ‖ externalOrderId`: the prefix of that id's orders.
pub(super) fn external_prefix(account: &[u8; 16], external_order_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(18 + external_order_id.len());
    out.extend_from_slice(account);
    out.extend_from_slice(&(external_order_id.len() as u16).to_be_bytes());
    out.extend_from_slice(external_order_id.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_external_id_is_never_a_prefix_of_another() {
        let account = [7u8; 16];
        let a = external_prefix(&account, "ab");
        let b = external_prefix(&account, "abc");
        assert!(!b.starts_with(&a));
    }
}
