//! Entry points for the fuzzers: each parser of bytes that come from outside the process, fed
//! whatever a fuzzer makes. A panic is the finding; every other outcome (an answer, a refusal)
//! is fine. `fuzz/` drives them under libFuzzer (cargo fuzz, an hour each once), and `cargo
//! test` runs each for a few thousand random and mutated inputs (the tests below). Requests
//! reach the server's own parsers through HTTP: `fuzz/fuzz_targets/http_request.rs` and
//! tests/api/fuzz.rs.

use sha2::{Digest, Sha256};

use crate::store::backup_file;
use crate::store::sled as embedded;
use crate::store::Tally;

/// A backup file as `orderly restore` reads it before it touches anything: read through and
/// checked (header, records, digest, counts, every ledger against its balance), then read a
/// second time expecting the digest the first reading found.
pub fn backup_file(data: &[u8]) {
    let mut tally = Tally::default();
    let Ok(sha256) = backup_file::check(data, |record| tally.add(record)) else {
        return;
    };
    let _ = tally.finish();
    if let Ok(reader) = backup_file::Reader::open(data) {
        let mut reader = reader.expecting(sha256);
        while let Ok(Some(_)) = reader.next_record() {}
    }
}

/// `data`'s lines as the records of a backup whose header, counts and digest are right: what
/// a fuzzer changes is then the records themselves, past the digest that would refuse almost
/// every mutation of a whole file.
pub fn backup_records(data: &[u8]) {
    backup_file(&framed(data));
}

/// A backup file around `records` (its lines, each given a newline): the header, the records,
/// and the end record with the counts of each kind the lines name and their SHA-256.
fn framed(records: &[u8]) -> Vec<u8> {
    let mut file =
        br#"{"kind":"header","format":"orderly-backup","version":1,"createdAt":"2026-01-01T00:00:00Z"}"#
            .to_vec();
    file.push(b'\n');
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for line in records.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        file.extend_from_slice(line);
        file.push(b'\n');
        let kind = serde_json::from_slice::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string));
        if let Some(kind) = kind {
            *counts.entry(kind).or_default() += 1;
        }
    }
    let digest: String = Sha256::digest(&file)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let end = serde_json::json!({"kind": "end", "counts": counts, "sha256": digest});
    file.extend_from_slice(end.to_string().as_bytes());
    file.push(b'\n');
    file
}

/// A sled store's own files (sled's `conf`, orderly's layout mark, the newest snapshot), read
/// as every command reads them before sled opens the store.
pub fn store_files(conf: &[u8], layout: &[u8], snapshot: &[u8]) {
    embedded::fuzz_store_files(conf, layout, snapshot);
}

/// One input split into the three files of `store_files`: a byte of each of the first two
/// lengths, then the bytes.
pub fn store_files_from(data: &[u8]) {
    let (conf_len, layout_len) = match data {
        [a, b, ..] => (usize::from(*a), usize::from(*b)),
        _ => return,
    };
    let rest = &data[2..];
    let conf = &rest[..conf_len.min(rest.len())];
    let rest = &rest[conf.len()..];
    let layout = &rest[..layout_len.min(rest.len())];
    store_files(conf, layout, &rest[layout.len()..]);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::ledger::{LedgerEntry, LedgerReason};
    use crate::domain::money::Cents;
    use crate::store::backup_file::Writer;
    use crate::store::Record;

    /// A real backup: an account, its ledger, a product; the seed the mutations start from.
    fn a_backup() -> Vec<u8> {
        let account = crate::domain::account::Account::for_tests(0);
        let entry = |amount: i64, after: i64| Record::Ledger {
            account: account.id,
            entry: LedgerEntry {
                id: crate::domain::ids::Id::new(crate::domain::ids::IdKind::Transaction)
                    .to_string(),
                amount: Cents(amount),
                reason: LedgerReason::Credit,
                reference: "r".into(),
                balance_after: Cents(after),
                created_at: 1,
                seq: 0,
                hash: [0; 32],
                previous_hash: [0; 32],
            },
        };
        let (mut writer, mut out) = Writer::start(0);
        for record in [
            Record::Account {
                account: account.clone(),
                balance: Cents(7),
            },
            entry(5, 5),
            entry(2, 7),
        ] {
            out.extend(writer.record(record));
        }
        out.extend(writer.finish());
        out
    }

    /// The seed with a few bytes overwritten, inserted or cut.
    fn mutated(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
        let len = seed.len();
        proptest::collection::vec((0..len.max(1), any::<u8>(), 0u8..3), 1..8).prop_map(
            move |edits| {
                let mut bytes = seed.clone();
                for (at, byte, how) in edits {
                    let at = at.min(bytes.len().saturating_sub(1));
                    match how {
                        0 if !bytes.is_empty() => bytes[at] = byte,
                        1 => bytes.insert(at, byte),
                        _ => bytes.truncate(at),
                    }
                }
                bytes
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        #[test]
        fn a_backup_file_of_any_bytes_is_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            backup_file(&bytes);
        }

        #[test]
        fn a_real_backup_mutated_is_read_or_refused(bytes in mutated(a_backup())) {
            backup_file(&bytes);
        }

        #[test]
        fn the_records_of_a_backup_mutated_past_its_digest_are_read_or_refused(bytes in mutated(a_backup())) {
            // The header's and the end's lines are framed anew around whatever is left.
            backup_records(&bytes);
        }

        #[test]
        fn a_stores_own_files_of_any_bytes_are_read_or_refused(
            conf in proptest::collection::vec(any::<u8>(), 0..64),
            layout in prop_oneof![
                Just(b"orderly layout 1\n".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..24),
            ],
            snapshot in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            store_files(&conf, &layout, &snapshot);
        }
    }

    #[test]
    fn a_ledger_past_i64s_end_is_refused_not_summed_to_the_balance() {
        // +i64::MAX and +1 would saturate to i64::MAX, the balance this backup claims.
        let account = crate::domain::account::Account::for_tests(0);
        let line = |amount: i64| {
            serde_json::json!({"kind": "ledger", "account": account.id, "entry": {
                "id": "txn_01a24ef5247f72df8443f4f91960d11d", "amount": amount, "reason": "Credit",
                "reference": "r", "balance_after": amount, "created_at": 1}})
            .to_string()
        };
        let account_line =
            serde_json::json!({"kind": "account", "account": account, "balance": i64::MAX})
                .to_string();
        let records = format!("{account_line}\n{}\n{}\n", line(i64::MAX), line(1));
        let file = framed(records.as_bytes());
        let mut tally = Tally::default();
        backup_file::check(&file[..], |record| tally.add(record)).expect("a well-formed file");
        assert!(tally.finish().is_err(), "the ledger sums past the balance");
    }
}
