//! The partner's idempotency key, parsed once from `X-Idempotency-Key` or `Idempotency-Key`.

/// 1 to 255 visible ASCII characters (0x21 to 0x7E).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

use super::limits::MAX_KEY_LEN;

/// Why a request carries no usable idempotency key.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyError {
    /// No header, or only blank ones: the partner forgot the key.
    Missing,
    /// A key was sent but cannot be one; the text says why.
    Invalid(&'static str),
}

impl IdempotencyKey {
    /// Reads both header spellings. Each argument is every value sent under that name, as
    /// bytes, because a key with non-ASCII bytes must be refused rather than mangled.
    pub(crate) fn from_headers(
        x_idempotency_key: &[&[u8]],
        idempotency_key: &[&[u8]],
    ) -> Result<Self, KeyError> {
        let literal = x_idempotency_key
            .iter()
            .map(|v| Ok(v.trim_ascii().to_vec()));
        let structured = idempotency_key.iter().map(|v| sf_string(v.trim_ascii()));
        let sent: Vec<Vec<u8>> = literal
            .chain(structured)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|v| !v.is_empty())
            .collect();
        let first = sent.first().ok_or(KeyError::Missing)?;
        if sent.iter().any(|v| v != first) {
            return Err(KeyError::Invalid(
                "X-Idempotency-Key and Idempotency-Key carry different values",
            ));
        }
        Self::parse(first)
    }

    /// Checks one key's bytes: 1 to 255 visible ASCII characters.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        if raw.is_empty() {
            return Err(KeyError::Missing);
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(KeyError::Invalid("longer than 255 characters"));
        }
        if !raw.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::Invalid(
                "only visible ASCII characters (0x21 to 0x7E) are allowed",
            ));
        }
        // Every byte is ASCII, so this cannot fail.
        Ok(IdempotencyKey(String::from_utf8_lossy(raw).into_owned()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// The IETF header's value: an RFC 8941 sf-string (`"abc"`, with `\"` and `\\` escapes and any
/// parameters after it ignored) is the text inside the quotes; a value that starts with a
/// quote but does not parse is invalid; a bare value is taken as it is.
fn sf_string(value: &[u8]) -> Result<Vec<u8>, KeyError> {
    let malformed = KeyError::Invalid("Idempotency-Key is not a valid structured-field string");
    let Some(rest) = value.strip_prefix(b"\"") else {
        return Ok(value.to_vec());
    };
    let mut out = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => out.push(escaped),
                _ => return Err(malformed),
            },
            b'"' => {
                // Only parameters (`;name=value`) may follow the string.
                let tail = bytes.as_slice().trim_ascii_start();
                return if tail.is_empty() || tail.starts_with(b";") {
                    Ok(out)
                } else {
                    Err(malformed)
                };
            }
            0x20..=0x7e => out.push(b),
            _ => return Err(malformed),
        }
    }
    Err(malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn no_header_is_missing() {
        assert_eq!(
            IdempotencyKey::from_headers(&[], &[]),
            Err(KeyError::Missing)
        );
    }

    #[test]
    fn a_blank_header_is_missing() {
        assert_eq!(
            IdempotencyKey::from_headers(&[b"   "], &[]),
            Err(KeyError::Missing)
        );
    }

    #[test]
    fn the_ietf_header_is_accepted_alone() {
        let key = IdempotencyKey::from_headers(&[], &[b"abc-1"]).unwrap();
        assert_eq!(key.as_str(), "abc-1");
    }

    #[test]
    fn a_quoted_ietf_key_is_the_text_inside_the_quotes() {
        let key = IdempotencyKey::from_headers(&[], &[br#""abc-1""#]).unwrap();
        assert_eq!(key.as_str(), "abc-1");
        let with_params = IdempotencyKey::from_headers(&[], &[br#""abc-1";v=2"#]).unwrap();
        assert_eq!(with_params.as_str(), "abc-1");
        let escaped = IdempotencyKey::from_headers(&[], &[br#""a\"b\\c""#]).unwrap();
        assert_eq!(escaped.as_str(), r#"a"b\c"#);
    }

    #[test]
    fn a_quoted_ietf_key_and_the_literal_header_are_compared_after_parsing() {
        assert!(IdempotencyKey::from_headers(&[b"abc"], &[br#""abc""#]).is_ok());
        assert!(matches!(
            IdempotencyKey::from_headers(&[br#""abc""#], &[br#""abc""#]),
            Err(KeyError::Invalid(_))
        ));
    }

    #[test]
    fn a_malformed_quoted_ietf_key_is_invalid() {
        for raw in [&br#""abc"#[..], br#""ab"c"#, br#""a\x""#, b"\"a\tb\""] {
            assert!(
                matches!(
                    IdempotencyKey::from_headers(&[], &[raw]),
                    Err(KeyError::Invalid(_))
                ),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn a_quoted_key_with_a_space_is_refused_like_any_key_with_a_space() {
        assert!(matches!(
            IdempotencyKey::from_headers(&[], &[br#""a b""#]),
            Err(KeyError::Invalid(_))
        ));
    }

    #[test]
    fn both_headers_with_one_value_agree() {
        assert!(IdempotencyKey::from_headers(&[b"k1"], &[b"k1"]).is_ok());
    }

    #[test]
    fn both_headers_with_different_values_are_invalid() {
        assert!(matches!(
            IdempotencyKey::from_headers(&[b"k1"], &[b"k2"]),
            Err(KeyError::Invalid(_))
        ));
    }

    #[test]
    fn a_space_inside_the_key_is_invalid() {
        assert!(matches!(
            IdempotencyKey::parse(b"a b"),
            Err(KeyError::Invalid(_))
        ));
    }

    #[test]
    fn a_key_of_255_characters_is_valid_and_256_is_not() {
        assert!(IdempotencyKey::parse(&[b'k'; 255]).is_ok());
        assert!(matches!(
            IdempotencyKey::parse(&[b'k'; 256]),
            Err(KeyError::Invalid(_))
        ));
    }

    proptest! {
        #[test]
        fn every_visible_ascii_key_up_to_255_parses_to_itself(key in "[!-~]{1,255}") {
            let parsed = IdempotencyKey::parse(key.as_bytes()).unwrap();
            prop_assert_eq!(parsed.as_str(), key.as_str());
        }

        #[test]
        fn any_byte_outside_visible_ascii_is_refused(
            prefix in "[!-~]{0,10}",
            bad in prop::sample::select((0u8..=0x20).chain(0x7f..=0xff).collect::<Vec<_>>()),
            suffix in "[!-~]{1,10}",
        ) {
            let mut raw = prefix.into_bytes();
            raw.push(bad);
            raw.extend(suffix.into_bytes());
            prop_assert!(matches!(IdempotencyKey::parse(&raw), Err(KeyError::Invalid(_))));
        }
    }
}
