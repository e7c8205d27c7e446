//! The few helpers every sled transaction here uses: abort with a business refusal, unfold
//! the outcome into `Ok(Err(refusal))` versus a storage failure, and `?` on transactional
//! reads and writes.

use sled::transaction::{
    ConflictableTransactionError, TransactionError, TransactionalTree, UnabortableTransactionError,
};

use super::codec::CodecError;
use crate::store::StoreError;

/// What a transaction closure can fail with: a business refusal `R` (the transaction is
/// rolled back and `R` returned as a value), or a record that does not decode.
#[derive(Debug)]
pub(crate) enum TxFailure<R> {
    Refused(R),
    Codec(CodecError),
}

impl<R> From<CodecError> for ConflictableTransactionError<TxFailure<R>> {
    fn from(e: CodecError) -> Self {
        ConflictableTransactionError::Abort(TxFailure::Codec(e))
    }
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Failed(e.to_string())
    }
}

impl From<CodecError> for StoreError {
    fn from(e: CodecError) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

pub(super) type TxResult<T, R> = Result<T, ConflictableTransactionError<TxFailure<R>>>;

/// Aborts the running transaction with a business refusal.
pub(super) fn refuse<T, R>(reason: R) -> TxResult<T, R> {
    Err(ConflictableTransactionError::Abort(TxFailure::Refused(
        reason,
    )))
}

/// Unfolds a transaction's outcome: expected refusals become `Ok(Err(_))`, so callers match
/// them as values; storage and codec failures stay errors.
pub(super) fn settle<T, R>(
    outcome: Result<T, TransactionError<TxFailure<R>>>,
) -> Result<Result<T, R>, StoreError> {
    match outcome {
        Ok(value) => Ok(Ok(value)),
        Err(TransactionError::Abort(TxFailure::Refused(r))) => Ok(Err(r)),
        Err(TransactionError::Abort(TxFailure::Codec(e))) => Err(e.into()),
        Err(TransactionError::Storage(e)) => Err(e.into()),
    }
}

/// Lets `?` on a transactional read/write work inside closures that use `TxFailure`.
pub(super) fn tx<T, R>(r: Result<T, UnabortableTransactionError>) -> TxResult<T, R> {
    r.map_err(ConflictableTransactionError::from)
}

/// Nine trees as one transaction sees them: an order's, a cancel's or a refund's.
pub(super) type NineTrees = (
    TransactionalTree,
    TransactionalTree,
    TransactionalTree,
    TransactionalTree,
    TransactionalTree,
    TransactionalTree,
    TransactionalTree,
    TransactionalTree,
    TransactionalTree,
);
