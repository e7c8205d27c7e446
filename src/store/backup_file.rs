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

pub(crate) const FORMAT: &str = "orderly-backup";
pub(crate) const VERSION: u32 = 1;

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
        /// The key's end, when it has one: beside the record, which keeps the fields earlier
        /// builds read (a backup they restore gives the key no end).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<Millis>,
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
        /// The entry's place in its account's chain and its hash (hex), beside the entry,
        /// which keeps the fields earlier builds read; absent in a backup of a build before
        /// chained ledgers, whose entries are chained when the restored store first opens.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hash: Option<String>,
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
pub(crate) enum BackupError {
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
    /// Read a second time, the file's digest is not the one checked the first time: it was
    /// rewritten or replaced in between.
    #[error("the backup changed after it was checked (another file, or rewritten in place)")]
    Changed,
    #[error("cannot read the backup: {0}")]
    Io(std::io::Error),
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
            expires_at: record.expires_at,
            record,
        },
        Record::Product(product) => Line::Product { product },
        Record::Order(order) => Line::Order { order },
        Record::Ledger { account, entry } => Line::Ledger {
            account,
            seq: (entry.seq != 0).then_some(entry.seq),
            hash: (entry.seq != 0).then(|| hex(&entry.hash)),
            entry,
        },
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
        Line::ApiKey {
            hash,
            record,
            expires_at,
        } => Record::ApiKey {
            hash: unhex(&hash).ok_or_else(|| damaged("an api key hash is not 32 hex bytes"))?,
            record: ApiKeyRecord {
                expires_at,
                ..record
            },
        },
        Line::Product { product } => Record::Product(product),
        Line::Order { order } => Record::Order(order),
        Line::Ledger {
            account,
            mut entry,
            seq,
            hash,
        } => {
            if let Some(seq) = seq.filter(|s| *s != 0) {
                entry.seq = seq;
                entry.hash = hash
                    .as_deref()
                    .and_then(unhex)
                    .ok_or_else(|| damaged("a ledger entry's hash is not 32 hex bytes"))?;
            }
            Record::Ledger { account, entry }
        }
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
pub(crate) struct Writer {
    digest: Sha256,
    counts: BTreeMap<String, u64>,
}

impl Writer {
    /// The writer and the header line.
    pub(crate) fn start(now: Millis) -> (Self, Vec<u8>) {
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

    pub(crate) fn record(&mut self, record: Record) -> Vec<u8> {
        *self.counts.entry(record.kind().to_string()).or_insert(0) += 1;
        let bytes = json_line(&line_of(record));
        self.digest.update(&bytes);
        bytes
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        json_line(&Line::End {
            counts: self.counts,
            sha256: hex(&self.digest.finalize()),
        })
    }
}

/// Reads a backup line by line, never holding more than one record: the header first, then
/// each record as it comes, and at the end record the digest of every byte before it and the
/// counts of each kind. A record is given back before the end is checked, so whoever must not
/// act on a damaged backup reads it through once first (`check`), then again to act.
pub(crate) struct Reader<R> {
    input: R,
    digest: Sha256,
    seen: BTreeMap<String, u64>,
    line: Vec<u8>,
    ended: bool,
    /// The digest a first reading found (`expecting`), which this one's must equal.
    expected: Option<String>,
    /// The digest of the end record, once it was read and found right.
    verified: Option<String>,
}

impl<R: std::io::BufRead> Reader<R> {
    /// Reads and checks the header.
    pub(crate) fn open(input: R) -> Result<Self, BackupError> {
        let mut reader = Reader {
            input,
            digest: Sha256::new(),
            seen: BTreeMap::new(),
            line: Vec::new(),
            ended: false,
            expected: None,
            verified: None,
        };
        if !reader.next_line()? {
            return Err(BackupError::Format("no header".into()));
        }
        reader.digest.update(&reader.line);
        match serde_json::from_slice::<Line>(&reader.line) {
            Ok(Line::Header {
                format, version, ..
            }) => {
                if format != FORMAT {
                    return Err(BackupError::Format(format!("format {format:?}")));
                }
                if version != VERSION {
                    return Err(BackupError::Version(version));
                }
            }
            _ => return Err(BackupError::Format("no header".into())),
        }
        Ok(reader)
    }

    /// A second reading of a file already checked: its end must carry the very digest the
    /// check found (`check`'s answer), so that what is acted on is the file that was checked.
    pub(crate) fn expecting(mut self, sha256: String) -> Self {
        self.expected = Some(sha256);
        self
    }

    /// The next whole line into `self.line`; false at the end of the input. A last line
    /// without its newline is a file cut short.
    fn next_line(&mut self) -> Result<bool, BackupError> {
        self.line.clear();
        let read = self
            .input
            .read_until(b'\n', &mut self.line)
            .map_err(BackupError::Io)?;
        match (read, self.line.last()) {
            (0, _) => Ok(false),
            (_, Some(b'\n')) => Ok(true),
            _ => Err(BackupError::Truncated),
        }
    }

    /// The next record; `None` once the end record is read and found right.
    pub(crate) fn next_record(&mut self) -> Result<Option<Record>, BackupError> {
        while !self.ended {
            if !self.next_line()? {
                return Err(BackupError::Truncated);
            }
            if self.line == b"\n" {
                self.digest.update(&self.line);
                continue;
            }
            let line: Line = serde_json::from_slice(&self.line)
                .map_err(|e| BackupError::Damaged(format!("a record does not parse: {e}")))?;
            if let Line::End { counts, sha256 } = line {
                return self.end(counts, &sha256).map(|()| None);
            }
            self.digest.update(&self.line);
            let record = record_of(line)?;
            *self.seen.entry(record.kind().to_string()).or_insert(0) += 1;
            return Ok(Some(record));
        }
        Ok(None)
    }

    fn end(&mut self, counts: BTreeMap<String, u64>, sha256: &str) -> Result<(), BackupError> {
        if hex(&self.digest.clone().finalize()) != sha256 {
            return Err(BackupError::Digest);
        }
        if self.next_line()? {
            return Err(BackupError::Damaged("bytes after the end record".into()));
        }
        if self.seen != counts {
            return Err(BackupError::Damaged(
                "the records do not match the end record's counts".into(),
            ));
        }
        if self
            .expected
            .as_deref()
            .is_some_and(|expected| expected != sha256)
        {
            return Err(BackupError::Changed);
        }
        self.ended = true;
        self.verified = Some(sha256.to_string());
        Ok(())
    }

    /// After `complaint` about a record, what the rest of the file says first: a backup cut
    /// short or altered is refused as such, not for the record the damage happened to hit.
    fn settle(mut self, complaint: BackupError) -> BackupError {
        loop {
            match self.next_line() {
                Ok(true) => {}
                Ok(false) => return BackupError::Truncated,
                Err(e) => return e,
            }
            if let Ok(Line::End { sha256, .. }) = serde_json::from_slice::<Line>(&self.line) {
                if hex(&self.digest.clone().finalize()) != sha256 {
                    return BackupError::Digest;
                }
                return complaint;
            }
            self.digest.update(&self.line);
        }
    }
}

/// Reads a backup through, giving each record to `each` and keeping none: its digest once
/// the whole file is found right (header, every record, digest, counts), for a second reading
/// to expect (`Reader::expecting`).
pub(crate) fn check<R: std::io::BufRead>(
    input: R,
    mut each: impl FnMut(&Record),
) -> Result<String, BackupError> {
    let mut reader = Reader::open(input)?;
    loop {
        match reader.next_record() {
            Ok(Some(record)) => each(&record),
            Ok(None) => return Ok(reader.verified.take().expect("the end was verified")),
            Err(BackupError::Io(e)) => return Err(BackupError::Io(e)),
            Err(complaint) => return Err(reader.settle(complaint)),
        }
    }
}

/// Reads a whole backup into memory, checked first: the round trips of the tests below.
#[cfg(test)]
fn read(bytes: &[u8]) -> Result<Vec<Record>, BackupError> {
    check(bytes, |_| {})?;
    let mut reader = Reader::open(bytes)?;
    let mut records = Vec::new();
    while let Some(record) = reader.next_record()? {
        records.push(record);
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
