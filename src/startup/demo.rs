//! `--demo`: seeds `data/demo.json` (relative to the working directory) into an empty
//! database and prints the partner keys. The demo keys are public: never use `--demo` for
//! real money.

use crate::bounds::{Deadline, REQUEST_DEADLINE};
use std::path::Path;

use serde::Deserialize;

use crate::domain::account::{hash_api_key, new_webhook_secret, Account, ApiKeyRecord, Scope};
use crate::domain::ids::AccountId;
use crate::domain::ledger::LedgerReason;
use crate::domain::money::Cents;
use crate::domain::product::Product;
use crate::domain::time::now_millis;
use crate::store::{NewCredit, Store};

pub(crate) const DEMO_FILE: &str = "data/demo.json";

#[derive(Deserialize)]
struct DemoData {
    accounts: Vec<DemoAccount>,
    products: Vec<DemoProduct>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DemoAccount {
    id: String,
    name: String,
    wholesale: bool,
    credit_limit: i64,
    region: Option<String>,
    balance: i64,
    api_keys: Vec<DemoKey>,
}

#[derive(Deserialize)]
struct DemoKey {
    id: String,
    key: String,
    scopes: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DemoProduct {
    id: String,
    name: String,
    price: i64,
    regions: Vec<String>,
    delivery_fields: Vec<String>,
    active: bool,
}

/// Why the demo data could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The demo file could not be read.
    #[error("cannot read {DEMO_FILE}: {0} (run from the repository root)")]
    Read(#[from] std::io::Error),
    /// The demo file is not the JSON expected.
    #[error("{DEMO_FILE} is not valid: {0}")]
    Parse(#[from] serde_json::Error),
    /// The demo file holds a value orderly refuses.
    #[error("{DEMO_FILE}: {0}")]
    Invalid(String),
    /// Writing the demo data to the store failed.
    #[error("seeding the demo data failed: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// Seeds the demo data when the database is empty, then prints the partner keys that work.
pub(crate) async fn seed_and_announce(
    store: &dyn Store,
    currency: &str,
    path: &Path,
) -> Result<(), DemoError> {
    let data: DemoData = serde_json::from_slice(&std::fs::read(path)?)?;
    // The seed is a handful of writes, each bounded like a request.
    let deadline = Deadline::after(REQUEST_DEADLINE);
    if store.is_empty(deadline).await? {
        seed(store, deadline, currency, &data).await?;
        println!(
            "demo: seeded {} account(s) and {} product(s) from {}",
            data.accounts.len(),
            data.products.len(),
            path.display()
        );
    } else {
        println!("demo: the database is not empty; nothing seeded");
    }
    for account in &data.accounts {
        for key in &account.api_keys {
            if store
                .authenticate(deadline, hash_api_key(&key.key))
                .await?
                .is_some()
            {
                let kind = if account.wholesale {
                    "wholesale"
                } else {
                    "retail, 403 on /b2b"
                };
                println!(
                    "demo: partner key for {} ({}, {kind}): {}",
                    account.name, account.id, key.key
                );
            }
        }
    }
    Ok(())
}

async fn seed(
    store: &dyn Store,
    deadline: Deadline,
    currency: &str,
    data: &DemoData,
) -> Result<(), DemoError> {
    let now = now_millis();
    for p in &data.products {
        store
            .put_product(
                deadline,
                Product {
                    id: p.id.clone(),
                    name: p.name.clone(),
                    price: Cents(p.price),
                    regions: p.regions.clone(),
                    delivery_fields: p.delivery_fields.clone(),
                    active: p.active,
                    updated_at: now,
                },
            )
            .await?;
    }
    for a in &data.accounts {
        let id = AccountId::parse(&a.id)
            .ok_or_else(|| DemoError::Invalid(format!("bad account id {:?}", a.id)))?;
        let account = Account {
            id,
            name: a.name.clone(),
            wholesale: a.wholesale,
            credit_limit: Cents(a.credit_limit),
            region: a.region.clone(),
            webhook_secret: new_webhook_secret(),
            created_at: now,
        };
        store.create_account(deadline, account.clone()).await?;
        for k in &a.api_keys {
            let scopes = k
                .scopes
                .iter()
                .map(|s| {
                    Scope::parse(s)
                        .ok_or_else(|| DemoError::Invalid(format!("unknown scope {s:?}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let record = ApiKeyRecord {
                id: k.id.clone(),
                account_id: id,
                scopes,
                revoked: false,
                created_at: now,
                expires_at: None,
            };
            store
                .create_api_key(deadline, hash_api_key(&k.key), record)
                .await?;
        }
        if a.balance > 0 {
            let credit = NewCredit {
                account,
                amount: Cents(a.balance),
                reason: LedgerReason::Credit,
                reference: "demo seed".into(),
                currency: currency.to_string(),
                claim: None,
                render: |_| Vec::new(),
            };
            store
                .credit(deadline, credit)
                .await?
                .map_err(|e| DemoError::Invalid(format!("seed credit refused: {e:?}")))?;
        }
    }
    Ok(())
}
