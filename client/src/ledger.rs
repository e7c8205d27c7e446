//! The partner's side of the verifiable ledger: every entry the client has verified is kept
//! (its `seq`, `hash` and `balanceAfter`) in a file beside the intents journal, one per account.
//! Each check fetches only what is new (`afterSeq`), verifies every new entry (its `seq` the
//! next, its `previousHash` the hash kept before it, its `hash` recomputed from its fields,
//! its `balanceAfter` the sum), and that the server's `ledgerHead` is on the chain kept. When
//! the server's history no longer contains what was kept (an entry rewritten, or lost by a
//! rewind of the database) the check is a `Divergence` naming the first `seq` that differs,
//! found by comparing the server's ledger with the kept one, and nothing is kept from it.
//!
//! The hash is orderly's encoding v1 (docs/api.md "Verifying your ledger"), recomputed here
//! with nothing of the server's code.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::client::{answer_of, Client};
use crate::files::open_appendable;

/// Entries asked for per request.
const PAGE: usize = 100;

/// The head of a verified ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    pub account: String,
    /// The newest verified entry's `seq` (0: no entry yet).
    pub seq: u64,
    /// Its hash (the genesis hash for an empty ledger).
    pub hash: String,
    /// The balance the server answered, which the verified entries sum to.
    pub available: i64,
    /// Entries verified by this check.
    pub new_entries: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The server's history no longer contains what this client verified before, or an entry
    /// it serves does not verify: `first_seq` is the first entry that differs.
    #[error("ledger divergence on account {account} at seq {first_seq}: {what}")]
    Divergence {
        account: String,
        first_seq: u64,
        what: String,
    },
    /// The server could not be asked (a transport error, or an answer other than 200).
    #[error("ledger: {0}")]
    Unavailable(String),
    /// The file of verified entries cannot be read or written.
    #[error("ledger file {0}: {1}")]
    File(String, std::io::Error),
}

/// One verified entry, as kept.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Kept {
    seq: u64,
    hash: String,
    balance_after: i64,
}

fn field(hasher: &mut Sha256, text: &str) {
    hasher.update((text.len() as u32).to_be_bytes());
    hasher.update(text.as_bytes());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first entry's `previousHash` of `account`.
pub fn genesis_hash(account: &str) -> String {
    let mut hasher = Sha256::new();
    for text in ["orderly-ledger-v1", "genesis", account] {
        field(&mut hasher, text);
    }
    hex(&hasher.finalize())
}

/// The hash `entry` (one of `GET /b2b/transactions`) has by its fields, or `None` when a
/// field is missing.
pub fn entry_hash(account: &str, entry: &Value) -> Option<String> {
    let text = |name: &str| entry.get(name).and_then(Value::as_str);
    let number = |name: &str| {
        entry
            .get(name)
            .and_then(Value::as_i64)
            .map(|n| n.to_string())
    };
    let mut hasher = Sha256::new();
    for text in [
        "orderly-ledger-v1",
        account,
        text("id")?,
        &entry.get("seq").and_then(Value::as_u64)?.to_string(),
        &number("amount")?,
        text("reason")?,
        text("reference")?,
        &number("balanceAfter")?,
        text("createdAt")?,
        text("previousHash")?,
    ] {
        field(&mut hasher, text);
    }
    Some(hex(&hasher.finalize()))
}

/// The entries verified for one account, in a file of JSON lines appended as they are.
struct Book {
    path: PathBuf,
    account: String,
    kept: Vec<Kept>,
}

impl Book {
    fn open(path: PathBuf, account: &str) -> Result<Book, LedgerError> {
        let mut kept = Vec::new();
        match File::open(&path) {
            Ok(file) => {
                for line in BufReader::new(file).lines() {
                    let line = line.map_err(|e| file_error(&path, e))?;
                    // A last line cut by a crash was never fsynced, so never claimed.
                    match serde_json::from_str::<Kept>(&line) {
                        Ok(entry) => kept.push(entry),
                        Err(_) => break,
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(file_error(&path, e)),
        }
        Ok(Book {
            path,
            account: account.to_string(),
            kept,
        })
    }

    fn head(&self) -> Kept {
        self.kept.last().cloned().unwrap_or_else(|| Kept {
            seq: 0,
            hash: genesis_hash(&self.account),
            balance_after: 0,
        })
    }

    /// The hash kept for `seq` (the genesis for 0).
    fn hash_at(&self, seq: u64) -> Option<&str> {
        match seq {
            0 => None,
            n => self
                .kept
                .get(usize::try_from(n - 1).ok()?)
                .map(|k| k.hash.as_str()),
        }
    }

    /// Appends `entries` and makes them durable before they count.
    fn keep(&mut self, entries: Vec<Kept>) -> Result<(), LedgerError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut file = open_appendable(&self.path).map_err(|e| file_error(&self.path, e))?;
        let mut bytes = Vec::new();
        for entry in &entries {
            serde_json::to_writer(&mut bytes, entry).expect("kept entries serialize");
            bytes.push(b'\n');
        }
        file.write_all(&bytes)
            .and_then(|()| file.sync_data())
            .map_err(|e| file_error(&self.path, e))?;
        self.kept.extend(entries);
        Ok(())
    }
}

fn file_error(path: &Path, e: std::io::Error) -> LedgerError {
    LedgerError::File(path.display().to_string(), e)
}

/// Where `journal`'s client keeps the verified entries of `account`.
pub fn book_path(journal: &Path, account: &str) -> PathBuf {
    let mut name = journal.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".ledger.{account}"));
    journal.with_file_name(name)
}

impl Client {
    /// Verifies what is new in `account`'s ledger (its id as the operator gave it, `acc_…`)
    /// onto what this client verified before, and keeps it. With `from_start`, every entry is
    /// fetched and verified again, and each one kept before must still have the hash kept
    /// (what finds an old entry rewritten in place). A `Divergence` keeps nothing.
    pub fn verify_ledger(&self, account: &str, from_start: bool) -> Result<Verified, LedgerError> {
        let mut book = Book::open(book_path(self.journal().path(), account), account)?;
        let before = book.head();
        let balance = self.get_json("/b2b/balance", &[])?;
        let server_head = (
            balance["ledgerHead"]["seq"].as_u64(),
            balance["ledgerHead"]["hash"].as_str().map(str::to_string),
        );
        let (Some(server_seq), Some(server_hash)) = server_head else {
            return Err(LedgerError::Unavailable(
                "the balance has no ledgerHead (a server before chained ledgers)".into(),
            ));
        };
        let available = balance["balance"]["available"].as_i64().unwrap_or(0);
        let diverged = |first_seq: u64, what: String| LedgerError::Divergence {
            account: account.to_string(),
            first_seq,
            what,
        };
        let mut head = if from_start {
            Kept {
                seq: 0,
                hash: genesis_hash(account),
                balance_after: 0,
            }
        } else {
            before.clone()
        };
        let mut fresh = Vec::new();
        loop {
            let page = self.entries_after(head.seq)?;
            let count = page.len();
            for entry in page {
                let seq = entry["seq"].as_u64().unwrap_or(0);
                if seq != head.seq + 1 {
                    return Err(self.first_difference(
                        &book,
                        head.seq + 1,
                        format!("the entry after seq {} is seq {seq}", head.seq),
                    ));
                }
                if entry["previousHash"].as_str() != Some(head.hash.as_str()) {
                    let what = format!(
                        "seq {seq} no longer follows the entry kept at seq {}",
                        head.seq
                    );
                    return Err(self.first_difference(&book, seq, what));
                }
                if entry_hash(account, &entry).as_deref() != entry["hash"].as_str() {
                    return Err(diverged(seq, "its hash is not what its fields give".into()));
                }
                if seq <= before.seq && book.hash_at(seq) != entry["hash"].as_str() {
                    return Err(diverged(seq, "its hash is not the one kept".into()));
                }
                let amount = entry["amount"].as_i64().unwrap_or(0);
                let after = entry["balanceAfter"].as_i64();
                if head.balance_after.checked_add(amount) != after {
                    return Err(diverged(seq, "its balanceAfter is not the sum".into()));
                }
                head = Kept {
                    seq,
                    hash: entry["hash"].as_str().unwrap_or_default().to_string(),
                    balance_after: after.unwrap_or(0),
                };
                if seq > before.seq {
                    fresh.push(head.clone());
                }
            }
            if count < PAGE {
                break;
            }
        }
        // The server's head read first: on the chain, at or before what was just verified.
        let on_chain = match server_seq {
            s if s > head.seq => false,
            s if s > before.seq => fresh
                .get((s - before.seq - 1) as usize)
                .is_some_and(|k| k.hash == server_hash),
            0 => server_hash == genesis_hash(account),
            s => book.hash_at(s) == Some(server_hash.as_str()),
        };
        if !on_chain || server_seq < before.seq {
            let what = format!(
                "the server's ledger ends at seq {server_seq}; this client verified up to seq {}",
                before.seq
            );
            return Err(self.first_difference(&book, server_seq.min(before.seq) + 1, what));
        }
        let new_entries = fresh.len() as u64;
        book.keep(fresh)?;
        Ok(Verified {
            account: account.to_string(),
            seq: head.seq,
            hash: head.hash,
            available,
            new_entries,
        })
    }

    /// The entries with a `seq` above `after`, oldest first, one page.
    fn entries_after(&self, after: u64) -> Result<Vec<Value>, LedgerError> {
        let page = self.get_json(
            "/b2b/transactions",
            &[
                ("afterSeq", &after.to_string()),
                ("limit", &PAGE.to_string()),
            ],
        )?;
        Ok(page["transactions"].as_array().cloned().unwrap_or_default())
    }

    /// The divergence, at the first seq where the server's ledger differs from the one kept
    /// (walked from the start), or at `at_most` when none differs before it.
    fn first_difference(&self, book: &Book, at_most: u64, what: String) -> LedgerError {
        let kept = book.kept.len() as u64;
        let mut seq = 0u64;
        let first_seq = loop {
            let page = match self.entries_after(seq) {
                Ok(page) => page,
                Err(e) => return e,
            };
            let count = page.len();
            let mut found = None;
            for entry in &page {
                seq += 1;
                if seq >= at_most || entry["seq"].as_u64() != Some(seq) {
                    found = Some(seq.min(at_most));
                    break;
                }
                let hash = entry["hash"].as_str();
                let rewritten = entry_hash(&book.account, entry).as_deref() != hash;
                if rewritten || (seq <= kept && book.hash_at(seq) != hash) {
                    found = Some(seq);
                    break;
                }
            }
            if let Some(found) = found {
                break found;
            }
            if count < PAGE {
                // The server has no entry at `seq + 1`, which was kept.
                break (seq + 1).min(at_most);
            }
        };
        LedgerError::Divergence {
            account: book.account.clone(),
            first_seq,
            what,
        }
    }

    fn get_json(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, LedgerError> {
        let mut request = self
            .agent()
            .get(format!("{}{path}", self.config().url.trim_end_matches('/')))
            .header("X-Api-Key", &self.config().api_key)
            .header("Accept", "application/json");
        for (name, value) in query {
            request = request.query(*name, *value);
        }
        let answer = answer_of(request.call())
            .map_err(|e| LedgerError::Unavailable(format!("{path}: {e}")))?;
        let (status, body) = (answer.status, answer.body);
        if status != 200 {
            return Err(LedgerError::Unavailable(format!(
                "{path}: status {status}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        serde_json::from_slice(&body).map_err(|e| LedgerError::Unavailable(format!("{path}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_genesis_is_the_documented_encoding() {
        let mut hasher = Sha256::new();
        for text in ["orderly-ledger-v1", "genesis", "acc_one"] {
            hasher.update((text.len() as u32).to_be_bytes());
            hasher.update(text.as_bytes());
        }
        assert_eq!(genesis_hash("acc_one"), hex(&hasher.finalize()));
    }

    #[test]
    fn an_entry_missing_a_field_has_no_hash() {
        let entry = serde_json::json!({"id": "txn_1", "seq": 1});
        assert_eq!(entry_hash("acc", &entry), None);
    }

    #[test]
    fn the_book_sits_beside_the_journal() {
        assert_eq!(
            book_path(Path::new("/x/orderly-client.journal"), "acc_1"),
            PathBuf::from("/x/orderly-client.journal.ledger.acc_1")
        );
    }
}
