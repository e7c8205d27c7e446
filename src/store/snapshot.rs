//! A snapshot as a bounded stream: the engine produces records as it reads them, at most
//! `AHEAD` records ahead of the reader, so a backup holds a few hundred records in memory
//! whatever the database's size. The producer says when it is done: a producer that stops
//! early (an error, a panic) is an error at the reader, never a short backup.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Record, StoreError};
use crate::bounds::BACKUP_READER_PATIENCE;

/// Records read ahead of the reader.
const AHEAD: usize = 256;

// A record is large next to an error or the end marker; boxing it would cost an allocation
// per record of every backup for a channel whose slots are few.
#[allow(clippy::large_enum_variant)]
enum Piece {
    Record(Record),
    Failed(StoreError),
    Done,
}

/// The engine's end: sends each record, then `finish`.
pub(crate) struct Producer {
    pieces: mpsc::Sender<Piece>,
}

/// The reader's end.
pub struct Snapshot {
    pieces: mpsc::Receiver<Piece>,
    ended: bool,
}

impl Snapshot {
    pub(crate) fn channel() -> (Producer, Snapshot) {
        let (pieces, received) = mpsc::channel(AHEAD);
        (
            Producer { pieces },
            Snapshot {
                pieces: received,
                ended: false,
            },
        )
    }

    /// The next record; `None` once the producer finished.
    pub(crate) async fn next(&mut self) -> Option<Result<Record, StoreError>> {
        let piece = self.pieces.recv().await;
        self.read(piece)
    }

    /// `next`, for a reader on a blocking thread.
    pub(crate) fn blocking_next(&mut self) -> Option<Result<Record, StoreError>> {
        let piece = self.pieces.blocking_recv();
        self.read(piece)
    }

    /// Every record, in memory (a copy between engines restores them in one transaction).
    pub async fn collect(mut self) -> Result<Vec<Record>, StoreError> {
        let mut records = Vec::new();
        while let Some(record) = self.next().await {
            records.push(record?);
        }
        Ok(records)
    }

    fn read(&mut self, piece: Option<Piece>) -> Option<Result<Record, StoreError>> {
        if self.ended {
            return None;
        }
        match piece {
            Some(Piece::Record(record)) => Some(Ok(record)),
            Some(Piece::Failed(e)) => {
                self.ended = true;
                Some(Err(e))
            }
            Some(Piece::Done) => {
                self.ended = true;
                None
            }
            None => {
                self.ended = true;
                Some(Err(StoreError::Failed(
                    "the snapshot stopped before its end".into(),
                )))
            }
        }
    }
}

impl Producer {
    /// Sends one record or the error that ends the snapshot. False once the reader has gone
    /// away, or has taken nothing for `BACKUP_READER_PATIENCE`: stop reading.
    pub(crate) async fn send(&self, record: Result<Record, StoreError>) -> bool {
        let sending = self.pieces.send(piece(record));
        matches!(
            tokio::time::timeout(BACKUP_READER_PATIENCE, sending).await,
            Ok(Ok(()))
        )
    }

    /// `send`, from a blocking thread (no timer there: it looks again every millisecond
    /// while the reader's queue is full).
    pub(crate) fn blocking_send(&self, record: Result<Record, StoreError>) -> bool {
        let until = Instant::now() + BACKUP_READER_PATIENCE;
        let mut piece = piece(record);
        loop {
            match self.pieces.try_send(piece) {
                Ok(()) => return true,
                Err(mpsc::error::TrySendError::Closed(_)) => return false,
                Err(mpsc::error::TrySendError::Full(back)) if Instant::now() < until => {
                    piece = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(mpsc::error::TrySendError::Full(_)) => return false,
            }
        }
    }

    pub(crate) async fn finish(self) {
        let _ = self.pieces.send(Piece::Done).await;
    }

    pub(crate) fn blocking_finish(self) {
        let _ = self.pieces.blocking_send(Piece::Done);
    }
}

fn piece(record: Result<Record, StoreError>) -> Piece {
    match record {
        Ok(record) => Piece::Record(record),
        Err(e) => Piece::Failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::money::Cents;
    use crate::domain::product::Product;

    fn product(id: &str) -> Record {
        Record::Product(Product {
            id: id.into(),
            name: id.into(),
            price: Cents(100),
            regions: vec![],
            delivery_fields: vec![],
            active: true,
            updated_at: 0,
        })
    }

    #[tokio::test]
    async fn a_finished_snapshot_gives_every_record_then_ends() {
        let (producer, snapshot) = Snapshot::channel();
        tokio::spawn(async move {
            for id in ["a", "b", "c"] {
                assert!(producer.send(Ok(product(id))).await);
            }
            producer.finish().await;
        });
        assert_eq!(snapshot.collect().await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_producer_that_stops_without_finishing_is_an_error_not_a_short_snapshot() {
        let (producer, mut snapshot) = Snapshot::channel();
        tokio::spawn(async move {
            producer.send(Ok(product("a"))).await;
            drop(producer); // a panic, or a forgotten finish
        });
        assert!(snapshot.next().await.unwrap().is_ok());
        assert!(matches!(
            snapshot.next().await,
            Some(Err(StoreError::Failed(_)))
        ));
        assert!(snapshot.next().await.is_none());
    }

    #[tokio::test]
    async fn the_producer_learns_that_the_reader_went_away() {
        let (producer, snapshot) = Snapshot::channel();
        drop(snapshot);
        assert!(!producer.send(Ok(product("a"))).await);
    }
}
