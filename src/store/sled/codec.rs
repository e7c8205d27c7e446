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
}
