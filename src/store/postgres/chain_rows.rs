//! The ledger's chain on PostgreSQL (`domain::chain`). An account's head is its newest entry,
//! read under its balance row's lock beside the newest id (`rows::lock_balance`, a batch's
//! view): nothing more is stored for it, and nothing more is written per entry than the
//! entry's own `seq` and `hash`.
//!
//! Entries without a chain (`seq` NULL) are those an instance of the version before chained
//! ledgers wrote during a rolling upgrade, or a restore of a backup from before them. They are
//! always the newest of their account (every writer holds the balance row's lock and writes
//! after the newest entry; this version chains them before it writes the next one), so
//! chaining them extends the chain: here, by the next write to the account (`catch_up`) and
//! at every start (`chain_unchained`).

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_postgres::Row;

use super::codec::{self, LEDGER};
use super::tx::{execute, query, query_opt, Fault, Session};
use super::OpenError;
use crate::domain::chain::{link, LedgerHead};
use crate::domain::ids::AccountId;
use crate::store::StoreError;

/// An account's newest entry: its id (what the next entry's id follows), `seq` and `hash`.
pub(super) const NEWEST_ENTRY_SQL: &str =
    "SELECT id, seq, hash FROM ledger WHERE account_id = $1 ORDER BY id DESC LIMIT 1";

/// The head `newest` (the account's newest entry, as `NEWEST_ENTRY_SQL` reads it) gives: the
/// genesis when the account has none, `None` when it is not chained yet.
pub(super) fn head_of(
    account: &AccountId,
    newest: Option<&Row>,
) -> Result<Option<LedgerHead>, StoreError> {
    let Some(row) = newest else {
        return Ok(Some(LedgerHead::genesis(&account.to_string())));
    };
    let seq: Option<i64> = row.get("seq");
    let hash: Option<&[u8]> = row.get("hash");
    match (seq, hash) {
        (Some(seq), Some(hash)) => Ok(Some(LedgerHead {
            seq: u64::try_from(seq).map_err(|_| corrupt(account))?,
            hash: hash.try_into().map_err(|_| corrupt(account))?,
        })),
        _ => Ok(None),
    }
}

fn corrupt(account: &AccountId) -> StoreError {
    StoreError::Corrupt(format!(
        "account {account}'s newest ledger entry has a malformed chain"
    ))
}

/// Entries chained per statement: an account of a million entries is never read whole.
const CHUNK: i64 = 5_000;

/// Chains `account`'s entries that have no chain yet, in their order, onto the newest one that
/// has; the caller holds the account's balance row lock. The head they lead to.
pub(super) async fn catch_up<C: Session>(c: &C, account: &AccountId) -> Result<LedgerHead, Fault> {
    let id = account.to_string();
    let newest_chained = query_opt(
        c,
        "SELECT id, seq, hash FROM ledger WHERE account_id = $1 AND seq IS NOT NULL
         ORDER BY seq DESC LIMIT 1",
        &[&id],
    )
    .await?;
    let mut head =
        head_of(account, newest_chained.as_ref())?.ok_or_else(|| Fault::from(corrupt(account)))?;
    let select = format!(
        "SELECT {LEDGER} FROM ledger WHERE account_id = $1 AND seq IS NULL ORDER BY id LIMIT $2"
    );
    loop {
        let rows = query(c, &select, &[&id, &CHUNK]).await?;
        if rows.is_empty() {
            return Ok(head);
        }
        let (mut ids, mut seqs, mut chained) = (Vec::new(), Vec::new(), Vec::new());
        for row in &rows {
            let mut entry = codec::ledger(row)?;
            link(&id, &head, &mut entry);
            head = LedgerHead::after(&entry);
            seqs.push(i64::try_from(entry.seq).map_err(|_| Fault::from(corrupt(account)))?);
            ids.push(entry.id.clone());
            chained.push(entry);
        }
        let hashes: Vec<&[u8]> = chained.iter().map(|e| &e.hash[..]).collect();
        execute(
            c,
            "UPDATE ledger SET seq = u.seq, hash = u.hash
             FROM unnest($1::text[], $2::bigint[], $3::bytea[]) AS u(id, seq, hash)
             WHERE ledger.id = u.id",
            &[&ids, &seqs, &hashes],
        )
        .await?;
    }
}

/// How often the start's chaining says how far it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// At start: chains every account that has entries without a chain, each in a transaction of
/// its own under its balance row's lock (instances of the version before may be writing).
pub(super) async fn chain_unchained(pool: &Pool) -> Result<(), OpenError> {
    let failed =
        |e: Fault| OpenError::Database(format!("chaining the ledger: {}", StoreError::from(e)));
    let mut client = pool
        .get()
        .await
        .map_err(|e| OpenError::Database(format!("chaining the ledger: {e}")))?;
    let accounts: Vec<String> = query(
        &client,
        "SELECT DISTINCT account_id FROM ledger WHERE seq IS NULL",
        &[],
    )
    .await
    .map_err(failed)?
    .iter()
    .map(|row| row.get(0))
    .collect();
    if accounts.is_empty() {
        return Ok(());
    }
    log::info!(
        "chaining the ledger entries of {} account(s) written before chained ledgers",
        accounts.len()
    );
    let (started, mut shown) = (Instant::now(), Instant::now());
    for (done, account) in accounts.iter().enumerate() {
        let account = AccountId::parse(account)
            .ok_or_else(|| OpenError::Database(format!("a ledger entry of account {account:?}")))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| failed(Fault::from(e)))?;
        query_opt(
            &tx,
            "SELECT 1 FROM balances WHERE account_id = $1 FOR UPDATE",
            &[&account.to_string()],
        )
        .await
        .map_err(failed)?;
        catch_up(&tx, &account).await.map_err(failed)?;
        tx.commit().await.map_err(|e| failed(Fault::from(e)))?;
        if shown.elapsed() >= PROGRESS_EVERY {
            shown = Instant::now();
            log::info!("chaining: {} of {} account(s)", done + 1, accounts.len());
        }
    }
    log::info!(
        "chained the ledgers of {} account(s) in {:.1} s",
        accounts.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
