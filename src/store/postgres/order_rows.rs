//! The rows new orders write (their balances, orders, ledger entries and key rows), each kind
//! as one statement over arrays (`unnest`) whatever the number of rows, and all four kinds as
//! one statement (`write_orders`): a batch's writes are planned once, not once per kind.
//! The statements are the same text either way, so a row restored from a backup, or
//! written by a refund, is the row a batch would have written.

use std::sync::LazyLock;

use tokio_postgres::types::Json;

use super::codec::{tag, time};
use super::tx::{execute, Fault, Param, Session};
use crate::domain::chain::Funds;
use crate::domain::ids::AccountId;
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::domain::order::Order;
use crate::store::KeyRecord;

/// A statement's parameters, owned: one array per column.
type Columns<'a> = Vec<Box<dyn Param + Send + Sync + 'a>>;

const SET_BALANCES: &str = "UPDATE balances b SET available = u.available
     FROM unnest($1::text[], $2::bigint[]) AS u(account_id, available)
     WHERE b.account_id = u.account_id";

const INSERT_ORDERS: &str = "INSERT INTO orders (id, account_id, status, items, total, currency,
         callback_url, external_order_id, refunded, created_at, updated_at)
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::bigint[],
         $6::text[], $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::bigint[])";

const INSERT_LEDGER: &str = "INSERT INTO ledger (id, account_id, amount, reason, reference,
         balance_after, created_at, seq, hash)
     SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[],
         $6::bigint[], $7::bigint[], $8::bigint[], $9::bytea[])";

const INSERT_KEY_ROWS: &str = "INSERT INTO idempotency_keys (account_id, key, operation,
         fingerprint, expires_at, status, content_type, body)
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::bigint[],
         $6::integer[], $7::text[], $8::bytea[])";

/// The four as one statement: data-modifying `WITH` parts each run once, to completion, on
/// the statement's one snapshot. None reads what another writes (four tables, no trigger and
/// no foreign key between them), so the result is that of the four statements in a row.
static WRITE_ORDERS: LazyLock<String> = LazyLock::new(|| {
    let mut first = 0;
    let mut part = |sql: &str| {
        let renumbered = renumbered(sql, first);
        first += placeholders(sql);
        renumbered
    };
    let balances = part(SET_BALANCES);
    let orders = part(INSERT_ORDERS);
    let ledger = part(INSERT_LEDGER);
    let keys = part(INSERT_KEY_ROWS);
    format!(
        "WITH set_balances AS ({balances}), new_orders AS ({orders}), \
         new_entries AS ({ledger}) {keys}"
    )
});

/// The accepted orders of a batch (or of one order alone) and each account's final balance,
/// in one statement. The caller holds the balance rows' locks.
pub(super) async fn write_orders<C: Session>(
    c: &C,
    balances: &[(AccountId, Funds)],
    orders: &[&Order],
    entries: &[(&AccountId, &LedgerEntry)],
    keys: &[(&AccountId, &str, &KeyRecord)],
) -> Result<(), Fault> {
    let columns: Columns = [
        balance_columns(balances.iter().map(|(a, f)| (a, f.available))),
        order_columns(orders),
        ledger_columns(entries),
        key_columns(keys),
    ]
    .into_iter()
    .flatten()
    .collect();
    execute(c, &WRITE_ORDERS, &refs(&columns)).await?;
    Ok(())
}

/// Balances as decisions left them, as one statement; the caller holds their rows' locks
/// (`lock_balance`, or a batch's view).
pub(super) async fn set_balances<C: Session>(
    c: &C,
    balances: &[(AccountId, Cents)],
) -> Result<(), Fault> {
    let columns = balance_columns(balances.iter().map(|(a, b)| (a, *b)));
    execute(c, SET_BALANCES, &refs(&columns)).await?;
    Ok(())
}

/// New orders, as one statement whatever their number (a batch's, or one alone).
pub(super) async fn insert_orders<C: Session>(c: &C, orders: &[&Order]) -> Result<(), Fault> {
    execute(c, INSERT_ORDERS, &refs(&order_columns(orders))).await?;
    Ok(())
}

/// Ledger entries of any accounts, as one statement.
pub(super) async fn insert_ledger<C: Session>(
    c: &C,
    entries: &[(&AccountId, &LedgerEntry)],
) -> Result<(), Fault> {
    execute(c, INSERT_LEDGER, &refs(&ledger_columns(entries))).await?;
    Ok(())
}

/// Key rows (account, key, row) of first uses, as one statement.
pub(super) async fn insert_key_rows<C: Session>(
    c: &C,
    rows: &[(&AccountId, &str, &KeyRecord)],
) -> Result<(), Fault> {
    execute(c, INSERT_KEY_ROWS, &refs(&key_columns(rows))).await?;
    Ok(())
}

fn balance_columns<'a>(balances: impl Iterator<Item = (&'a AccountId, Cents)>) -> Columns<'static> {
    let (accounts, available): (Vec<String>, Vec<i64>) =
        balances.map(|(a, b)| (a.to_string(), b.0)).unzip();
    vec![Box::new(accounts), Box::new(available)]
}

fn order_columns<'a>(orders: &[&'a Order]) -> Columns<'a> {
    let text = |f: fn(&Order) -> String| Box::new(orders.iter().map(|o| f(o)).collect::<Vec<_>>());
    let number = |f: fn(&Order) -> i64| Box::new(orders.iter().map(|o| f(o)).collect::<Vec<_>>());
    let optional = |f: fn(&'a Order) -> Option<&'a str>| {
        Box::new(orders.iter().map(|o| f(o)).collect::<Vec<_>>())
    };
    let items: Vec<Json<&'a Vec<crate::domain::order::OrderLine>>> =
        orders.iter().map(|o| Json(&o.items)).collect();
    vec![
        text(|o| o.id.to_string()),
        text(|o| o.account_id.to_string()),
        text(|o| tag(&o.status)),
        Box::new(items),
        number(|o| o.total.0),
        text(|o| o.currency.clone()),
        optional(|o| o.callback_url.as_deref()),
        optional(|o| o.external_order_id.as_deref()),
        number(|o| o.refunded.0),
        number(|o| time(o.created_at)),
        number(|o| time(o.updated_at)),
    ]
}

fn ledger_columns<'a>(entries: &[(&AccountId, &'a LedgerEntry)]) -> Columns<'a> {
    let text = |f: fn(&AccountId, &LedgerEntry) -> String| {
        Box::new(entries.iter().map(|(a, e)| f(a, e)).collect::<Vec<_>>())
    };
    let number = |f: fn(&LedgerEntry) -> i64| {
        Box::new(entries.iter().map(|(_, e)| f(e)).collect::<Vec<_>>())
    };
    vec![
        text(|_, e| e.id.clone()),
        text(|a, _| a.to_string()),
        number(|e| e.amount.0),
        text(|_, e| tag(&e.reason)),
        text(|_, e| e.reference.clone()),
        number(|e| e.balance_after.0),
        number(|e| time(e.created_at)),
        // An entry restored from a backup of a build before chained ledgers has none yet
        // (chained at the next start).
        Box::new(
            entries
                .iter()
                .map(|(_, e)| (e.seq != 0).then(|| i64::try_from(e.seq).unwrap_or(i64::MAX)))
                .collect::<Vec<_>>(),
        ),
        Box::new(
            entries
                .iter()
                .map(|(_, e)| (e.seq != 0).then_some(&e.hash[..]))
                .collect::<Vec<_>>(),
        ),
    ]
}

fn key_columns<'a>(rows: &[(&AccountId, &str, &'a KeyRecord)]) -> Columns<'a> {
    let text = |f: fn(&AccountId, &str, &KeyRecord) -> String| {
        Box::new(rows.iter().map(|(a, k, r)| f(a, k, r)).collect::<Vec<_>>())
    };
    let bytes = |f: fn(&'a KeyRecord) -> &'a [u8]| {
        Box::new(rows.iter().map(|(_, _, r)| f(r)).collect::<Vec<_>>())
    };
    let expires: Vec<i64> = rows.iter().map(|(_, _, r)| time(r.expires_at)).collect();
    let statuses: Vec<i32> = rows
        .iter()
        .map(|(_, _, r)| i32::from(r.response.status))
        .collect();
    vec![
        text(|a, _, _| a.to_string()),
        text(|_, k, _| k.to_string()),
        text(|_, _, r| tag(&r.operation)),
        bytes(|r| &r.fingerprint.0[..]),
        Box::new(expires),
        Box::new(statuses),
        text(|_, _, r| r.response.content_type.clone()),
        bytes(|r| &r.response.body),
    ]
}

/// `columns` as a statement takes its parameters.
fn refs<'c>(columns: &'c Columns<'_>) -> Vec<&'c (dyn Param + Sync)> {
    columns
        .iter()
        .map(|column| &**column as &(dyn Param + Sync))
        .collect()
}

/// The highest `$n` of `sql`: how many parameters it takes.
fn placeholders(sql: &str) -> usize {
    numbers(sql).map(|(_, n)| n).max().unwrap_or(0)
}

/// `sql` with every `$n` made `$(n + by)`, to follow another statement's parameters.
fn renumbered(sql: &str, by: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut copied = 0;
    for (span, n) in numbers(sql) {
        out.push_str(&sql[copied..span.start]);
        out.push_str(&format!("${}", n + by));
        copied = span.end;
    }
    out.push_str(&sql[copied..]);
    out
}

/// Each `$n` of `sql`: where it is and its number.
fn numbers(sql: &str) -> impl Iterator<Item = (std::ops::Range<usize>, usize)> + '_ {
    let bytes = sql.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < bytes.len() {
            let start = at;
            at += 1;
            if bytes[start] != b'$' {
                continue;
            }
            let digits = bytes[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if digits == 0 {
                continue;
            }
            at += digits;
            let n = sql[start + 1..at].parse().expect("ascii digits");
            return Some((start..at, n));
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renumbering_moves_every_placeholder_and_nothing_else() {
        let sql = "SELECT $1::text[], $2, '$x', $10 FROM t WHERE a = $2";
        assert_eq!(
            renumbered(sql, 5),
            "SELECT $6::text[], $7, '$x', $15 FROM t WHERE a = $7"
        );
        assert_eq!(placeholders(sql), 10);
        assert_eq!(renumbered(sql, 0), sql);
    }

    #[test]
    fn each_statement_takes_as_many_parameters_as_its_columns() {
        assert_eq!(
            placeholders(SET_BALANCES),
            balance_columns(std::iter::empty()).len()
        );
        assert_eq!(placeholders(INSERT_ORDERS), order_columns(&[]).len());
        assert_eq!(placeholders(INSERT_LEDGER), ledger_columns(&[]).len());
        assert_eq!(placeholders(INSERT_KEY_ROWS), key_columns(&[]).len());
    }

    #[test]
    fn the_one_statement_numbers_its_parts_parameters_one_after_another() {
        let all = placeholders(&WRITE_ORDERS);
        assert_eq!(all, 2 + 11 + 9 + 8);
        for n in 1..=all {
            assert!(WRITE_ORDERS.contains(&format!("${n}::")), "${n} is missing");
        }
        assert!(WRITE_ORDERS.starts_with("WITH set_balances AS (UPDATE balances"));
        assert!(WRITE_ORDERS.contains("unnest($3::text[], $4::text[]"));
        assert!(WRITE_ORDERS.contains("unnest($14::text[]"));
        assert!(WRITE_ORDERS.contains("unnest($23::text[]"));
    }
}
