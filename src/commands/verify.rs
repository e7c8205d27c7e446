//! `orderly verify`: every account's ledger walked as a chain (`store::ledger_check`), from a
//! stopped server's sled store, a PostgreSQL database while instances run (one snapshot, as
//! a backup reads it), or a backup file. Stdout says what was checked, then each break on a
//! line of its own; the exit status is 1 when there is one.

use std::fs::File;
use std::io::BufReader;

use super::progress::Progress;
use super::{block_on, Failure};
use crate::bounds::{Deadline, COMMAND_DEADLINE, MAX_PENDING_WRITES};
use crate::config::VerifyArgs;
use crate::store;
use crate::store::backup_file;
use crate::store::ledger_check::{LedgerCheck, LedgerReport};

/// Why the ledgers were not found whole: breaks (exit 1), or what could not be read (exit 2
/// for a store this binary must not open, else 1).
#[derive(Debug, thiserror::Error)]
pub(crate) enum VerifyFailure {
    #[error("verify: {0} break(s) in the ledgers")]
    Breaks(u64),
    #[error("verify: {0}")]
    Unread(String, bool),
}

impl Failure for VerifyFailure {
    fn exit_code(&self) -> u8 {
        match self {
            VerifyFailure::Unread(_, true) => 2,
            _ => 1,
        }
    }
}

pub(crate) fn run(args: &VerifyArgs) -> Result<(), VerifyFailure> {
    let mut check = LedgerCheck::default();
    let mut progress = Progress::new("verifying", None);
    match &args.backup {
        Some(path) => {
            let file = File::open(path).map_err(|e| {
                VerifyFailure::Unread(format!("cannot read {}: {e}", path.display()), false)
            })?;
            backup_file::check(BufReader::with_capacity(1 << 20, file), |record| {
                check.add(record);
                progress.add(1);
            })
            .map_err(|e| VerifyFailure::Unread(e.to_string(), false))?;
        }
        None => block_on(walk_store(args, &mut check, &mut progress))?,
    }
    progress.finish();
    report(&check.finish())
}

/// The store's records, as one snapshot, through the check.
async fn walk_store(
    args: &VerifyArgs,
    check: &mut LedgerCheck,
    progress: &mut Progress,
) -> Result<(), VerifyFailure> {
    let engine = super::walked_engine(&args.data_dir, args.database_url.as_deref());
    let deadline = Deadline::after(COMMAND_DEADLINE);
    let store = store::open(engine, Default::default(), MAX_PENDING_WRITES as usize)
        .await
        .map_err(|e| VerifyFailure::Unread(e.to_string(), e.is_usage()))?;
    let walked = async {
        let mut records = store.snapshot(deadline).await?;
        while let Some(record) = records.next().await {
            check.add(&record?);
            progress.add(1);
        }
        Ok::<(), store::StoreError>(())
    }
    .await;
    store.stop(deadline).await;
    walked.map_err(|e| VerifyFailure::Unread(e.to_string(), false))
}

fn report(report: &LedgerReport) -> Result<(), VerifyFailure> {
    let unchained = match report.unchained {
        0 => String::new(),
        n => format!(
            " ({n} entries from before chained ledgers: their sums checked, chained when the \
             store next opens)"
        ),
    };
    println!(
        "verified {} account(s), {} ledger entries{unchained}",
        report.accounts, report.entries
    );
    for broken in &report.breaks {
        println!("{broken}");
    }
    if report.more_breaks > 0 {
        println!("... and {} more", report.more_breaks);
    }
    if !report.holds() {
        return Err(VerifyFailure::Breaks(
            report.breaks.len() as u64 + report.more_breaks,
        ));
    }
    println!("every chain and balance holds");
    Ok(())
}
