//! The rows every run writes and checks, each a function of its number: nothing to remember
//! between the processes that write a store and the ones that read it.
//!
//! Row `i` goes to one tree by `i % 10`, shaped as orderly's rows are: orders under their
//! account (4 in 10, keys that grow per account), ledger entries (3 in 10, keys that only
//! grow, the oldest removed as a queue's), idempotency keys (2 in 10, keys anywhere), and
//! medium rows of 4 to 8 KiB (1 in 10), whose pages pass sled's blob threshold (a log record
//! over about 128 KiB goes to a file of its own). Beside them, 500 balances rewritten in place
//! by every writing pass, with that pass's generation.

/// Accounts the orders are spread over.
pub const ACCOUNTS: u64 = 500;
/// Balance rows, each rewritten by every writing pass.
pub const BALANCES: u16 = 500;

/// The trees, by name.
pub const ORDERS: &str = "orders";
pub const LEDGER: &str = "ledger";
pub const KEYS: &str = "idempotency_keys";
pub const MEDIUM: &str = "medium";
pub const BALANCE: &str = "balances";

/// splitmix64: a well-spread number from a row's number.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Which tree row `i` belongs to.
pub fn tree_of(i: u64) -> &'static str {
    match i % 10 {
        0..=3 => ORDERS,
        4..=6 => LEDGER,
        7..=8 => KEYS,
        _ => MEDIUM,
    }
}

/// Row `i`'s account.
pub fn account_of(i: u64) -> u64 {
    (i / 10) % ACCOUNTS
}

/// Row `i`'s key in its tree.
pub fn key(i: u64) -> Vec<u8> {
    match tree_of(i) {
        ORDERS => {
            let mut k = (account_of(i) as u16).to_be_bytes().to_vec();
            k.extend_from_slice(&i.to_be_bytes());
            k
        }
        KEYS => mix(i).to_be_bytes().to_vec(),
        _ => i.to_be_bytes().to_vec(),
    }
}

/// Row `i`'s value: its number, then bytes drawn from it, of a length its tree's rows have.
pub fn value(i: u64) -> Vec<u8> {
    let h = mix(i ^ 0x5EED);
    let len = match tree_of(i) {
        ORDERS => 300 + h % 1200,
        LEDGER => 120,
        KEYS => 400 + h % 2600,
        _ => 4096 + h % 4096,
    } as usize;
    filled(i, h, len)
}

/// A balance's key.
pub fn balance_key(b: u16) -> [u8; 2] {
    b.to_be_bytes()
}

/// A balance's value as pass `generation` writes it.
pub fn balance_value(b: u16, generation: u64) -> Vec<u8> {
    filled(generation, mix(u64::from(b) << 32 | generation), 96)
}

fn filled(head: u64, seed: u64, len: usize) -> Vec<u8> {
    let mut v = head.to_be_bytes().to_vec();
    let mut n = seed;
    while v.len() < len {
        n = mix(n);
        v.extend_from_slice(&n.to_le_bytes());
    }
    v.truncate(len.max(8));
    v
}

/// What a store holds after writing passes: rows `0..rows`, ledger rows below `removed`
/// removed, balances at `generation`.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub rows: u64,
    pub removed: u64,
    pub generation: u64,
}

impl Expected {
    /// Whether row `i` is there.
    pub fn holds(&self, i: u64) -> bool {
        i < self.rows && !(tree_of(i) == LEDGER && i < self.removed)
    }

    /// The row numbers of `tree` in key order.
    pub fn in_key_order(&self, tree: &str) -> Vec<u64> {
        match tree {
            ORDERS => {
                let mut rows = Vec::new();
                for account in 0..ACCOUNTS {
                    let mut block = account;
                    while block * 10 < self.rows {
                        for i in block * 10..block * 10 + 4 {
                            if self.holds(i) {
                                rows.push(i);
                            }
                        }
                        block += ACCOUNTS;
                    }
                }
                rows
            }
            KEYS => {
                let mut rows: Vec<u64> = (0..self.rows).filter(|&i| tree_of(i) == KEYS).collect();
                rows.sort_unstable_by_key(|&i| mix(i));
                rows
            }
            _ => (0..self.rows)
                .filter(|&i| tree_of(i) == tree && self.holds(i))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_in_key_order_are_sorted_by_their_keys() {
        let e = Expected {
            rows: 25_000,
            removed: 0,
            generation: 1,
        };
        let rows = e.in_key_order(ORDERS);
        assert_eq!(rows.len(), 10_000);
        assert!(rows.windows(2).all(|w| key(w[0]) < key(w[1])));
        let keys = e.in_key_order(KEYS);
        assert!(keys.windows(2).all(|w| key(w[0]) < key(w[1])));
    }
}
