//! The only place that knows how records are encoded: a version byte, then bincode 2.
//!
//! bincode 2.0.1 is pinned and flagged unmaintained, so it stays behind these two functions;
//! the leading byte lets a later format be read beside this one.

use serde::{de::DeserializeOwned, Serialize};

const FORMAT_V1: u8 = 1;

#[derive(Debug, thiserror::Error)]
pub(crate) enum CodecError {
    #[error("record has unknown format version {0}")]
    UnknownVersion(u8),
    #[error("record is empty")]
    Empty,
    #[error("record does not decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("record does not encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    /// An account's newest ledger entry without its chain, once the store serves (every one
    /// is chained at open).
    #[error("an account's newest ledger entry has no chain")]
    Unchained,
}

pub(super) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_V1];
    out.extend(bincode::serde::encode_to_vec(
        value,
        bincode::config::standard(),
    )?);
    Ok(out)
}

pub(super) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        None => Err(CodecError::Empty),
        Some((&FORMAT_V1, rest)) => {
            let (value, _) = bincode::serde::decode_from_slice(rest, bincode::config::standard())?;
            Ok(value)
        }
        Some((&other, _)) => Err(CodecError::UnknownVersion(other)),
    }
}

/// `value`, then `extension` when it is not its default: a field added to a record after
/// stores held it. A build that knows only the record decodes it and ignores the bytes after
/// (bincode reads what the type needs), and a record written before the extension existed
/// decodes with the extension's default (`decode_extended`).
pub(super) fn encode_extended<T: Serialize, E: Serialize + Default + PartialEq>(
    value: &T,
    extension: &E,
) -> Result<Vec<u8>, CodecError> {
    let mut out = encode(value)?;
    if *extension != E::default() {
        out.extend(bincode::serde::encode_to_vec(
            extension,
            bincode::config::standard(),
        )?);
    }
    Ok(out)
}

/// What `encode_extended` wrote: the record, and its extension or the default when the
/// record ends where the record's type does.
pub(super) fn decode_extended<T: DeserializeOwned, E: DeserializeOwned + Default>(
    bytes: &[u8],
) -> Result<(T, E), CodecError> {
    match bytes.split_first() {
        None => Err(CodecError::Empty),
        Some((&FORMAT_V1, rest)) => {
            let config = bincode::config::standard();
            let (value, used) = bincode::serde::decode_from_slice(rest, config)?;
            let extension = match &rest[used..] {
                [] => E::default(),
                after => bincode::serde::decode_from_slice(after, config)?.0,
            };
            Ok((value, extension))
        }
        Some((&other, _)) => Err(CodecError::UnknownVersion(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_with_its_version_byte() {
        let bytes = encode(&(42i64, "x".to_string())).unwrap();
        assert_eq!(bytes[0], FORMAT_V1);
        assert_eq!(
            decode::<(i64, String)>(&bytes).unwrap(),
            (42, "x".to_string())
        );
    }

    #[test]
    fn an_unknown_version_is_refused() {
        assert!(matches!(
            decode::<i64>(&[9, 0]),
            Err(CodecError::UnknownVersion(9))
        ));
    }

    #[test]
    fn an_extension_is_read_back_and_a_record_without_one_reads_with_its_default() {
        let record = (42i64, "x".to_string());
        let with = encode_extended(&record, &Some(7u64)).unwrap();
        assert_eq!(
            decode_extended::<(i64, String), Option<u64>>(&with).unwrap(),
            (record.clone(), Some(7))
        );
        // A build that knows only the record reads it from the extended bytes.
        assert_eq!(decode::<(i64, String)>(&with).unwrap(), record);
        // A record written before the extension existed, and one whose extension is the
        // default, are the record's bytes alone.
        let without = encode(&record).unwrap();
        assert_eq!(encode_extended(&record, &None::<u64>).unwrap(), without);
        assert_eq!(
            decode_extended::<(i64, String), Option<u64>>(&without).unwrap(),
            (record, None)
        );
    }

    #[test]
    fn a_damaged_extension_is_an_error_not_a_default() {
        let mut bytes = encode(&(42i64, "x".to_string())).unwrap();
        bytes.push(9); // an Option's tag is 0 or 1
        assert!(decode_extended::<(i64, String), Option<u64>>(&bytes).is_err());
    }
}
