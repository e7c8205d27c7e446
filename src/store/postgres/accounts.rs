//! Accounts, their keys and products (the operator's writes), and the two ways money comes
//! in: an admin credit (with its key's row when it has one) and a provider's notification,
//! unique by `(provider, external_id)`.

use tokio_postgres::error::SqlState;

use super::db::Conn;
use super::locks::key_taken;
use super::rows::{
    insert_account, insert_api_key, insert_key_rows, insert_provider_payment, lock_balance,
    move_money, upsert_product,
};
use super::tx::{both, query_opt, Fault};
use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::ids::{Id, IdKind};
use crate::domain::money::Cents;
use crate::domain::product::Product;
use crate::domain::time::now_millis;
use crate::store::{
    CreditRefusal, NewCredit, ProviderCredit, ProviderRefusal, Recorded, StoreError,
};

/// A new account with a balance of 0.
pub(super) async fn create_account(client: &mut Conn, account: &Account) -> Result<(), Fault> {
    let (tx, gate) = client.begin().await?;
    both(
        gate.limit_waits(&tx),
        insert_account(&tx, account, Cents::ZERO),
    )
    .await?;
    gate.commit(tx).await
}

/// A new API key, and the change every instance must learn of before it is answered: the
/// table's trigger (migration 0007) bumps `auth_cache_version` and records the change in the
/// key's row, from which the instances catch up (`known_keys.rs`).
pub(super) async fn create_api_key(
    client: &mut Conn,
    hash: &[u8; 32],
    record: &ApiKeyRecord,
) -> Result<i64, Fault> {
    let (tx, gate) = client.begin().await?;
    let ((), ()) = both(gate.limit_waits(&tx), insert_api_key(&tx, hash, record, 0)).await?;
    let version = query_opt(
        &tx,
        "SELECT changed_in FROM api_keys WHERE hash = $1",
        &[&&hash[..]],
    )
    .await?
    .ok_or_else(|| StoreError::Corrupt("an API key just inserted is not there".into()))?
    .get(0);
    gate.commit(tx).await?;
    Ok(version)
}

/// A product created or replaced.
pub(super) async fn put_product(client: &mut Conn, product: &Product) -> Result<(), Fault> {
    let (tx, gate) = client.begin().await?;
    both(gate.limit_waits(&tx), upsert_product(&tx, product)).await?;
    gate.commit(tx).await
}

pub(super) async fn credit(
    client: &mut Conn,
    credit: &NewCredit,
) -> Result<Result<Vec<u8>, CreditRefusal>, Fault> {
    let (tx, gate) = client.begin().await?;
    let account = credit.account.id;
    if let Some(claim) = &credit.claim {
        if let Some(row) = key_taken(&tx, &gate, &account, claim).await? {
            return Ok(Err(CreditRefusal::KeyTaken(row)));
        }
    }
    // The balance row's wait is bounded by what the key's wait left of the claim's bound
    // (sent first when there was no key to wait for).
    let locked = both(gate.limit_waits(&tx), lock_balance(&tx, &account))
        .await
        .map(|((), locked)| locked);
    let locked = match locked {
        Err(fault) if fault.is(&SqlState::LOCK_NOT_AVAILABLE) => {
            return Ok(Err(CreditRefusal::KeyTaken(None)))
        }
        other => other?,
    };
    let txn = Id::after(IdKind::Transaction, locked.newest_txn);
    let decided = match credit.decide(locked.funds, &txn, now_millis()) {
        Ok(decided) => decided,
        Err(refused) => return Ok(Err(refused)),
    };
    let key = async {
        match (&credit.claim, &decided.key) {
            (Some(claim), Some(row)) => {
                insert_key_rows(&tx, &[(&account, claim.key.as_str(), row)]).await
            }
            _ => Ok(()),
        }
    };
    both(move_money(&tx, &account, &decided.rows), key).await?;
    gate.commit(tx).await?;
    Ok(Ok(decided.body))
}

pub(super) async fn record_provider_payment(
    client: &mut Conn,
    payment: &ProviderCredit,
) -> Result<Result<Recorded, ProviderRefusal>, Fault> {
    let (tx, gate) = client.begin().await?;
    let ((), seen) = both(
        gate.limit_waits(&tx),
        query_opt(
            &tx,
            "SELECT 1 FROM provider_payments WHERE provider = $1 AND external_id = $2",
            &[&payment.provider, &payment.external_id],
        ),
    )
    .await?;
    if seen.is_some() {
        return Ok(Ok(Recorded::Duplicate));
    }
    let locked = lock_balance(&tx, &payment.account).await?;
    let txn = Id::after(IdKind::Transaction, locked.newest_txn);
    let (entry, record) = match payment.decide(locked.funds, &txn, now_millis()) {
        Ok(decided) => decided,
        Err(refused) => return Ok(Err(refused)),
    };
    // The primary key, not the check above, is what makes a concurrent repeat credit once:
    // the second insert waits for the first transaction and then fails.
    match insert_provider_payment(&tx, &record).await {
        Ok(()) => {}
        Err(fault) if fault.is(&SqlState::UNIQUE_VIOLATION) => return Ok(Ok(Recorded::Duplicate)),
        Err(fault) => return Err(fault),
    }
    move_money(&tx, &payment.account, &entry).await?;
    gate.commit(tx).await?;
    Ok(Ok(Recorded::Credited))
}

/// Marks the key revoked; the change every instance's copies must acknowledge is the one the
/// table's trigger made (migration 0007); `None` when there is no such key.
pub(super) async fn revoke_api_key(client: &mut Conn, key_id: &Id) -> Result<Option<i64>, Fault> {
    let (tx, gate) = client.begin().await?;
    // The table's trigger bumps `auth_cache_version` and records the change in the key's row
    // (migration 0007): that change is what every instance acknowledges.
    let ((), changed) = both(
        gate.limit_waits(&tx),
        query_opt(
            &tx,
            "UPDATE api_keys SET revoked = true WHERE id = $1 RETURNING changed_in",
            &[&key_id.to_string()],
        ),
    )
    .await?;
    let Some(row) = changed else {
        return Ok(None);
    };
    gate.commit(tx).await?;
    Ok(Some(row.get(0)))
}
