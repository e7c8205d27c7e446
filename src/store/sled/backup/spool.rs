//! A backup's walk: every record-holding tree copied, key and value as stored, into a spool
//! file beside the data directory while writes go on, and read back row by row. The file is
//! unlinked as soon as it is created, so that a crash leaves nothing behind.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, Write};
use std::path::Path;

use super::spool_out::SpoolOut;
use crate::store::sled::spooled::{Spooled, SpooledRow, SPOOLED};
use crate::store::sled::trees::Trees;
use crate::store::StoreError;

/// A walk on disk: `tree ‖ len(key) ‖ key ‖ len(value) ‖ value` per row, lengths as u32 LE.
pub(in crate::store::sled) struct Spool {
    file: BufReader<File>,
    /// The next row, read to know which tree comes next.
    peeked: Option<SpooledRow>,
}

/// Spool trouble is the backup's, not the database's: refused, and the store goes on.
pub(in crate::store::sled) fn spool_error(e: io::Error) -> StoreError {
    StoreError::Unavailable(format!("spooling the backup: {e}"))
}

/// A file for spooling, created in `beside` and unlinked at once: a crash leaves nothing.
pub(in crate::store::sled) fn unlinked_spool(beside: &Path) -> Result<File, StoreError> {
    let name = format!(".orderly-backup-{}.spool", crate::domain::ids::random_hex());
    let path = beside.join(name);
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(spool_error)?;
    std::fs::remove_file(&path).map_err(spool_error)?;
    Ok(file)
}

impl Trees {
    pub(in crate::store::sled) fn spooled_tree(&self, tree: Spooled) -> &sled::Tree {
        match tree {
            Spooled::Balance => &self.balances,
            Spooled::Account => &self.accounts,
            Spooled::ApiKey => &self.api_keys,
            Spooled::Product => &self.products,
            Spooled::Order => &self.orders,
            Spooled::Ledger => &self.ledger,
            Spooled::Refund => &self.refunds,
            Spooled::Event => &self.events,
            Spooled::Outbox => &self.outbox,
            Spooled::ProviderPayment => &self.provider_payments,
            Spooled::IdempotencyKey => &self.idem_keys,
            Spooled::DeliveryLog => &self.delivery_logs,
            Spooled::PreviousSecret => &self.previous_secrets,
        }
    }

    /// Copies every record-holding tree into a spool file in `beside`, while writes go on:
    /// a key may be read before or after a write to it, which the backup's notes then settle
    /// (`cut`).
    pub(in crate::store::sled) fn spool_walk(&self, beside: &Path) -> Result<Spool, StoreError> {
        let mut out = SpoolOut::new(unlinked_spool(beside)?);
        for tree in SPOOLED {
            for row in self.spooled_tree(tree).iter() {
                let (key, value) = row?;
                write_row(&mut out, tree, &key, &value).map_err(spool_error)?;
            }
        }
        let mut file = out.into_file().map_err(spool_error)?;
        file.rewind().map_err(spool_error)?;
        Ok(Spool {
            file: BufReader::with_capacity(1 << 20, file),
            peeked: None,
        })
    }
}

fn write_row(out: &mut impl Write, tree: Spooled, key: &[u8], value: &[u8]) -> io::Result<()> {
    let length = |bytes: &[u8]| {
        u32::try_from(bytes.len())
            .map(u32::to_le_bytes)
            .map_err(|_| io::Error::other("a value over 4 GiB"))
    };
    out.write_all(&[tree as u8])?;
    out.write_all(&length(key)?)?;
    out.write_all(key)?;
    out.write_all(&length(value)?)?;
    out.write_all(value)
}

impl Spool {
    /// The tree of the next row, `None` at the end of the spool.
    pub(in crate::store::sled) fn next_tree(&mut self) -> Result<Option<Spooled>, StoreError> {
        if self.peeked.is_none() {
            self.peeked = self.read_row()?;
        }
        Ok(self.peeked.as_ref().map(|(tree, _, _)| *tree))
    }

    /// The next row, `None` at the end of the spool.
    pub(in crate::store::sled) fn next_row(&mut self) -> Result<Option<SpooledRow>, StoreError> {
        match self.peeked.take() {
            Some(row) => Ok(Some(row)),
            None => self.read_row(),
        }
    }

    fn read_row(&mut self) -> Result<Option<SpooledRow>, StoreError> {
        let mut tag = [0u8; 1];
        match self.file.read_exact(&mut tag) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(spool_error(e)),
        }
        let tree = *SPOOLED
            .get(tag[0] as usize)
            .ok_or_else(|| StoreError::Corrupt("the backup spool is damaged".into()))?;
        let mut bytes = || -> Result<Vec<u8>, StoreError> {
            let mut length = [0u8; 4];
            self.file.read_exact(&mut length).map_err(spool_error)?;
            let mut bytes = vec![0u8; u32::from_le_bytes(length) as usize];
            self.file.read_exact(&mut bytes).map_err(spool_error)?;
            Ok(bytes)
        };
        let key = bytes()?;
        let value = bytes()?;
        Ok(Some((tree, key, value)))
    }
}
