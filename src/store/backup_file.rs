//! The backup format, engine-neutral and versioned: JSON lines.
//!
//! - The first line is the header: `{"kind":"header","format":"orderly-backup","version":1,
//!   "createdAt":"…"}`.
//! - Then one line per record, `{"kind":"account"|"apiKey"|"product"|"order"|"ledger"|
//!   "refund"|"event"|"delivery"|"providerPayment"|"idempotencyKey"|"deliveryLog"|
//!   "previousWebhookSecret", …}`.
//! - The last line is `{"kind":"end","counts":{kind: n, …},"sha256":"<hex>"}`: the counts of
//!   each kind and the SHA-256 of every byte before this line. A file without it, or whose
//!   digest or counts differ, is refused whole: a truncated or damaged backup never restores.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::event::{Delivery, DeliveryLog, Event};
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::ids::AccountId;
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::domain::order::{Order, Refund};
use crate::domain::product::Product;
use crate::domain::time::{rfc3339, Millis};
use crate::domain::webhook_secret::PreviousSecret;
use crate::store::{KeyRecord, ProviderPaymentRecord, Record, StoredResponse};

pub const FORMAT: &str = "orderly-backup";
pub const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
enum Line {
    Header {
        format: String,
        version: u32,
        created_at: String,
    },
    Account {
        account: Account,
        balance: Cents,
    },
    ApiKey {
        /// SHA-256 of the key, hex: the plaintext is never stored.
        hash: String,
        record: ApiKeyRecord,
    },
    Product {
        product: Product,
    },
    Order {
        order: Order,
    },
    Ledger {
        account: AccountId,
        entry: LedgerEntry,
    },
    Refund {
        refund: Refund,
    },
    Event {
        event: Event,
    },
    Delivery {
        due_at: Millis,
        delivery: Delivery,
    },
    ProviderPayment {
        payment: ProviderPaymentRecord,
    },
    IdempotencyKey {
        account: AccountId,
        key: String,
        operation: Operation,
        /// Hex.
        fingerprint: String,
        expires_at: Millis,
        status: u16,
        content_type: String,
        /// The stored answer, base64: replayed byte for byte after a restore.
        body: String,
    },
    DeliveryLog {
        event_id: String,
        log: DeliveryLog,
    },
    PreviousWebhookSecret {
        account: AccountId,
        previous: PreviousSecret,
    },
    End {
        counts: BTreeMap<String, u64>,
        sha256: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("not an orderly backup: {0}")]
    Format(String),
    #[error("the backup is version {0}; this binary reads version {VERSION}")]
    Version(u32),
    #[error("the backup is truncated: it has no end record")]
    Truncated,
    #[error("the backup is damaged: its digest does not match its contents")]
    Digest,
    #[error("the backup is damaged: {0}")]
    Damaged(String),
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn line_of(record: Record) -> Line {
    let b64 = base64::engine::general_purpose::STANDARD;
    match record {
        Record::Account { account, balance } => Line::Account { account, balance },
        Record::ApiKey { hash, record } => Line::ApiKey {
            hash: hex(&hash),
            record,
        },
        Record::Product(product) => Line::Product { product },
        Record::Order(order) => Line::Order { order },
        Record::Ledger { account, entry } => Line::Ledger { account, entry },
        Record::Refund(refund) => Line::Refund { refund },
        Record::Event(event) => Line::Event { event },
        Record::Delivery { due_at, delivery } => Line::Delivery { due_at, delivery },
        Record::ProviderPayment(payment) => Line::ProviderPayment { payment },
        Record::IdempotencyKey {
            account,
            key,
            record,
        } => Line::IdempotencyKey {
            account,
            key,
            operation: record.operation,
            fingerprint: hex(&record.fingerprint.0),
            expires_at: record.expires_at,
            status: record.response.status,
            content_type: record.response.content_type,
            body: b64.encode(&record.response.body),
        },
        Record::DeliveryLog { event_id, log } => Line::DeliveryLog { event_id, log },
        Record::PreviousWebhookSecret { account, previous } => {
            Line::PreviousWebhookSecret { account, previous }
        }
    }
}

fn record_of(line: Line) -> Result<Record, BackupError> {
    let damaged = |what: &str| BackupError::Damaged(what.to_string());
    Ok(match line {
        Line::Account { account, balance } => Record::Account { account, balance },
        Line::ApiKey { hash, record } => Record::ApiKey {
            hash: unhex(&hash).ok_or_else(|| damaged("an api key hash is not 32 hex bytes"))?,
            record,
        },
        Line::Product { product } => Record::Product(product),
        Line::Order { order } => Record::Order(order),
        Line::Ledger { account, entry } => Record::Ledger { account, entry },
        Line::Refund { refund } => Record::Refund(refund),
        Line::Event { event } => Record::Event(event),
        Line::Delivery { due_at, delivery } => Record::Delivery { due_at, delivery },
        Line::ProviderPayment { payment } => Record::ProviderPayment(payment),
        Line::IdempotencyKey {
            account,
            key,
            operation,
            fingerprint,
            expires_at,
            status,
            content_type,
            body,
        } => Record::IdempotencyKey {
            account,
            key,
            record: KeyRecord {
                operation,
                fingerprint: Fingerprint(
                    unhex(&fingerprint).ok_or_else(|| damaged("a fingerprint is not 32 bytes"))?,
                ),
                expires_at,
                response: StoredResponse {
                    status,
                    content_type,
                    body: base64::engine::general_purpose::STANDARD
                        .decode(body)
                        .map_err(|_| damaged("a stored answer is not base64"))?,
                },
            },
        },
        Line::DeliveryLog { event_id, log } => Record::DeliveryLog { event_id, log },
        Line::PreviousWebhookSecret { account, previous } => {
            Record::PreviousWebhookSecret { account, previous }
        }
        Line::Header { .. } | Line::End { .. } => {
            return Err(damaged("a header or end record in the middle"))
        }
    })
}

fn json_line(line: &Line) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(line).expect("backup lines serialize");
    bytes.push(b'\n');
    bytes
}

/// Writes a backup as it is read: the header first, the end record last.
pub struct Writer {
    digest: Sha256,
    counts: BTreeMap<String, u64>,
}

impl Writer {
    /// The writer and the header line.
    pub fn start(now: Millis) -> (Self, Vec<u8>) {
        let mut writer = Writer {
            digest: Sha256::new(),
            counts: BTreeMap::new(),
        };
        let header = json_line(&Line::Header {
            format: FORMAT.into(),
            version: VERSION,
            created_at: rfc3339(now),
        });
        writer.digest.update(&header);
        (writer, header)
    }

    pub fn record(&mut self, record: Record) -> Vec<u8> {
        *self.counts.entry(record.kind().to_string()).or_insert(0) += 1;
        let bytes = json_line(&line_of(record));
        self.digest.update(&bytes);
        bytes
    }

    pub fn finish(self) -> Vec<u8> {
        json_line(&Line::End {
            counts: self.counts,
            sha256: hex(&self.digest.finalize()),
        })
    }
}

/// Reads a whole backup: header, version, digest and counts checked before any record is
/// given back.
pub fn read(bytes: &[u8]) -> Result<Vec<Record>, BackupError> {
    let body_end = bytes
        .strip_suffix(b"\n")
        .and_then(|b| b.iter().rposition(|&c| c == b'\n'))
        .map(|i| i + 1)
        .ok_or(BackupError::Truncated)?;
    let (body, last) = bytes.split_at(body_end);
    let Ok(Line::End { counts, sha256 }) = serde_json::from_slice::<Line>(last) else {
        return Err(BackupError::Truncated);
    };
    if hex(&Sha256::digest(body)) != sha256 {
        return Err(BackupError::Digest);
    }
    let mut lines = body.split(|&c| c == b'\n').filter(|l| !l.is_empty());
    match lines.next().map(serde_json::from_slice::<Line>) {
        Some(Ok(Line::Header {
            format, version, ..
        })) => {
            if format != FORMAT {
                return Err(BackupError::Format(format!("format {format:?}")));
            }
            if version != VERSION {
                return Err(BackupError::Version(version));
            }
        }
        _ => return Err(BackupError::Format("no header".into())),
    }
    let mut records = Vec::new();
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for line in lines {
        let line: Line = serde_json::from_slice(line)
            .map_err(|e| BackupError::Damaged(format!("a record does not parse: {e}")))?;
        let record = record_of(line)?;
        *seen.entry(record.kind().to_string()).or_insert(0) += 1;
        records.push(record);
    }
    if seen != counts {
        return Err(BackupError::Damaged(
            "the records do not match the end record's counts".into(),
        ));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::product::Product;

    fn product(id: &str) -> Record {
        Record::Product(Product {
            id: id.into(),
            name: "n".into(),
            price: Cents(5),
            regions: vec![],
            delivery_fields: vec![],
            active: true,
            updated_at: 1,
        })
    }

    fn backup(records: Vec<Record>) -> Vec<u8> {
        let (mut writer, mut out) = Writer::start(0);
        for r in records {
            out.extend(writer.record(r));
        }
        out.extend(writer.finish());
        out
    }

    #[test]
    fn a_backup_reads_back_its_records() {
        let file = backup(vec![product("a"), product("b")]);
        let records = read(&file).unwrap();
        assert_eq!(records.len(), 2);
        assert!(matches!(&records[1], Record::Product(p) if p.id == "b"));
    }

    #[test]
    fn a_truncated_backup_is_refused() {
        let file = backup(vec![product("a"), product("b")]);
        for cut in [file.len() - 1, file.len() - 10, file.len() / 2, 1] {
            assert!(read(&file[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_backup_with_any_byte_changed_is_refused() {
        let file = backup(vec![product("a"), product("b")]);
        for i in (0..file.len()).step_by(7) {
            let mut damaged = file.clone();
            damaged[i] ^= 0x01;
            assert!(read(&damaged).is_err(), "byte {i} changed");
        }
    }
}
