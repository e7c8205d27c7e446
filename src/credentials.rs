//! The credentials an operator rotates: admin tokens and payment providers' secrets. Several
//! are in force at once, each with a name, so that both sides of a rotation are accepted while
//! callers and providers move from one to the other. Flags and the environment give some at
//! start; a file flag's file is read again on SIGHUP, and a reload that cannot be read or
//! parsed keeps the set in force (one error line), as a certificate's reload does.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

/// The longest name of an admin token (letters, digits, '.', '_' and '-'): what its request's
/// log line says instead of its value.
const MAX_NAME_LEN: usize = 64;

/// The name of an admin token given without one.
pub(crate) const DEFAULT_TOKEN_NAME: &str = "default";

/// One credential as written: `NAME=VALUE`, on a flag or a line of a file.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Named {
    pub(crate) name: String,
    pub(crate) value: String,
}

/// Never prints the value.
impl fmt::Debug for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=***", self.name)
    }
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Named {
    /// `NAME=TOKEN`, or a bare `TOKEN` (named `default`). A token that itself holds `=` is read
    /// as named when what precedes its first `=` is a name and something other than padding
    /// follows: `abc==` (base64) is a bare token, `ops=abc==` the token `abc==` named `ops`.
    pub(crate) fn admin_token(text: &str) -> Result<Named, String> {
        let text = text.trim();
        let named = text
            .split_once('=')
            .filter(|(name, value)| valid_name(name) && !value.bytes().all(|b| b == b'='));
        let (name, value) = named.unwrap_or((DEFAULT_TOKEN_NAME, text));
        if value.is_empty() {
            return Err("expected TOKEN or NAME=TOKEN, the token not empty".into());
        }
        Ok(Named {
            name: name.to_string(),
            value: value.to_string(),
        })
    }

    /// `NAME=SECRET`: the provider's name (the path's `{provider}`) and one of its secrets.
    pub(crate) fn provider_secret(text: &str) -> Result<Named, String> {
        match text.split_once('=') {
            Some((name, secret)) if !name.trim().is_empty() && !secret.is_empty() => Ok(Named {
                name: name.trim().to_string(),
                value: secret.to_string(),
            }),
            _ => Err("expected name=secret".into()),
        }
    }
}

/// Parses a file of credentials: one per line, blank lines and lines starting with `#`
/// skipped; an error names the line (never its content, which may be a secret).
fn read_file(path: &Path, parse: fn(&str) -> Result<Named, String>) -> Result<Vec<Named>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let named =
            parse(line).map_err(|e| format!("{} line {}: {e}", path.display(), number + 1))?;
        out.push(named);
    }
    Ok(out)
}

/// Where one kind of credential comes from: what flags and the environment gave (fixed for
/// the process's life) and a file, read again on every reload.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub(crate) given: Vec<Named>,
    pub(crate) file: Option<PathBuf>,
}

impl Source {
    fn read(&self, parse: fn(&str) -> Result<Named, String>) -> Result<Vec<Named>, String> {
        let mut all = self.given.clone();
        if let Some(file) = &self.file {
            all.extend(read_file(file, parse)?);
        }
        Ok(all)
    }
}

/// An admin token in force: its name and the SHA-256 of its value.
struct AdminToken {
    name: Arc<str>,
    hash: [u8; 32],
}

/// What is in force now.
struct InForce {
    admin: Vec<AdminToken>,
    /// Each provider's name with one of its secrets: a provider may have several.
    providers: Vec<Named>,
}

/// The name of the admin token a request presented, for its log line.
#[derive(Clone, Debug)]
pub(crate) struct AdminTokenName(pub(crate) Arc<str>);

/// Why the credentials cannot be used: a configuration error, like a bad flag (exit 2 at start).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CredentialsError(String);

/// The admin tokens and providers' secrets in force, and where they are read from.
pub(crate) struct Credentials {
    admin: Source,
    providers: Source,
    /// Whether the admin API exists: decided at start (a token or a token file given), so that
    /// a reload never turns its routes into 404s or back.
    admin_enabled: bool,
    current: RwLock<Arc<InForce>>,
}

impl Credentials {
    /// Reads every source once. An admin token file given at start must hold a token.
    pub(crate) fn load(admin: Source, providers: Source) -> Result<Self, CredentialsError> {
        let admin_enabled = !admin.given.is_empty() || admin.file.is_some();
        let current = read_all(&admin, &providers).map_err(CredentialsError)?;
        Ok(Credentials {
            admin,
            providers,
            admin_enabled,
            current: RwLock::new(Arc::new(current)),
        })
    }

    /// Whether a file is read again on SIGHUP.
    pub(crate) fn reloads(&self) -> bool {
        self.admin.file.is_some() || self.providers.file.is_some()
    }

    /// Reads the files again; on success the new set is in force for every request that
    /// starts after it. Returns what is in force now, by name (never a value).
    pub(crate) fn reload(&self) -> Result<String, String> {
        let next = read_all(&self.admin, &self.providers)?;
        let said = describe(&next);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
        Ok(said)
    }

    /// What is in force now, by name.
    pub(crate) fn describe(&self) -> String {
        describe(&self.in_force())
    }

    pub(crate) fn admin_enabled(&self) -> bool {
        self.admin_enabled
    }

    fn in_force(&self) -> Arc<InForce> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The name of the admin token `presented` is, if any. Every token is compared, each in
    /// constant time over SHA-256 digests: the time taken says nothing of which one nearly
    /// matched (hashing also hides the lengths).
    pub(crate) fn admin_token(&self, presented: &str) -> Option<AdminTokenName> {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let in_force = self.in_force();
        let mut found = None;
        for token in &in_force.admin {
            if digest_eq(&presented, &token.hash) && found.is_none() {
                found = Some(AdminTokenName(Arc::clone(&token.name)));
            }
        }
        found
    }

    /// Whether `provider` has a secret in force (else its notifications are 404).
    pub(crate) fn knows_provider(&self, provider: &str) -> bool {
        self.in_force().providers.iter().any(|p| p.name == provider)
    }

    /// `None` for a provider with no secret; else whether `accepts` holds for any of its
    /// secrets (a provider rolling its secret signs with either for a while).
    pub(crate) fn provider_accepts(
        &self,
        provider: &str,
        accepts: impl Fn(&[u8]) -> bool,
    ) -> Option<bool> {
        let in_force = self.in_force();
        let mut secrets = in_force
            .providers
            .iter()
            .filter(|p| p.name == provider)
            .peekable();
        secrets.peek()?;
        Some(secrets.any(|p| accepts(p.value.as_bytes())))
    }

    /// A token of its own for the demo when none was given (named `default`).
    pub(crate) fn with_demo_token(admin: &mut Source) -> Option<String> {
        if !admin.given.is_empty() || admin.file.is_some() {
            return None;
        }
        let token = format!("adm_{}", crate::domain::ids::random_hex());
        admin.given.push(Named {
            name: DEFAULT_TOKEN_NAME.into(),
            value: token.clone(),
        });
        Some(token)
    }
}

/// Compares SHA-256 digests in constant time.
pub(crate) fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn read_all(admin: &Source, providers: &Source) -> Result<InForce, String> {
    let tokens = admin.read(Named::admin_token)?;
    if tokens.is_empty() && admin.file.is_some() {
        return Err("no admin token: the admin token file holds none".into());
    }
    let mut names: Vec<&str> = tokens.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!(
            "two admin tokens are named {}: each needs a name of its own (NAME=TOKEN)",
            twice[0]
        ));
    }
    Ok(InForce {
        admin: tokens
            .iter()
            .map(|t| AdminToken {
                name: Arc::from(t.name.as_str()),
                hash: Sha256::digest(t.value.as_bytes()).into(),
            })
            .collect(),
        providers: providers.read(Named::provider_secret)?,
    })
}

/// "admin tokens: a, b; provider secrets: p (2)": names and counts, never a value.
fn describe(in_force: &InForce) -> String {
    let tokens: Vec<&str> = in_force.admin.iter().map(|t| &*t.name).collect();
    let mut providers: Vec<(&str, usize)> = Vec::new();
    for p in &in_force.providers {
        match providers.iter_mut().find(|(name, _)| *name == p.name) {
            Some((_, n)) => *n += 1,
            None => providers.push((&p.name, 1)),
        }
    }
    let providers: Vec<String> = providers
        .iter()
        .map(|(name, n)| format!("{name} ({n})"))
        .collect();
    format!(
        "admin tokens: {}; provider secrets: {}",
        if tokens.is_empty() {
            "none".into()
        } else {
            tokens.join(", ")
        },
        if providers.is_empty() {
            "none".into()
        } else {
            providers.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(given: &[&str]) -> Source {
        Source {
            given: given
                .iter()
                .map(|t| Named::admin_token(t).unwrap())
                .collect(),
            file: None,
        }
    }

    fn none() -> Source {
        Source {
            given: vec![],
            file: None,
        }
    }

    #[test]
    fn a_bare_token_is_named_default_and_padding_is_part_of_it() {
        let t = Named::admin_token("s3cret").unwrap();
        assert_eq!((t.name.as_str(), t.value.as_str()), ("default", "s3cret"));
        let t = Named::admin_token("YWJj==").unwrap();
        assert_eq!((t.name.as_str(), t.value.as_str()), ("default", "YWJj=="));
        let t = Named::admin_token("ops=YWJj==").unwrap();
        assert_eq!((t.name.as_str(), t.value.as_str()), ("ops", "YWJj=="));
        // What precedes the first '=' is no name: the whole is the token.
        let t = Named::admin_token("a b=c").unwrap();
        assert_eq!((t.name.as_str(), t.value.as_str()), ("default", "a b=c"));
        assert!(Named::admin_token("").is_err());
    }

    #[test]
    fn any_token_in_force_is_accepted_and_named_and_no_other() {
        let c = Credentials::load(source(&["old=aaa", "new=bbb"]), none()).unwrap();
        assert_eq!(&*c.admin_token("aaa").unwrap().0, "old");
        assert_eq!(&*c.admin_token("bbb").unwrap().0, "new");
        assert!(c.admin_token("ccc").is_none());
        assert!(c.admin_token("").is_none());
        assert!(c.admin_enabled());
        assert!(!Credentials::load(none(), none()).unwrap().admin_enabled());
    }

    #[test]
    fn two_tokens_with_one_name_are_refused() {
        let e = Credentials::load(source(&["x=aaa", "x=bbb"]), none());
        assert!(e
            .err()
            .unwrap()
            .to_string()
            .contains("two admin tokens are named x"));
        assert!(Credentials::load(source(&["aaa", "bbb"]), none()).is_err());
    }

    #[test]
    fn a_provider_with_two_secrets_accepts_either() {
        let providers = Source {
            given: ["p=one", "p=two", "q=three"]
                .iter()
                .map(|t| Named::provider_secret(t).unwrap())
                .collect(),
            file: None,
        };
        let c = Credentials::load(none(), providers).unwrap();
        assert_eq!(c.provider_accepts("p", |s| s == b"one"), Some(true));
        assert_eq!(c.provider_accepts("p", |s| s == b"two"), Some(true));
        assert_eq!(c.provider_accepts("p", |s| s == b"three"), Some(false));
        assert_eq!(c.provider_accepts("r", |_| true), None);
    }

    #[test]
    fn a_file_is_read_again_and_a_bad_one_keeps_the_set_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "# comment\n\nold=aaa\n").unwrap();
        let admin = Source {
            given: vec![],
            file: Some(file.clone()),
        };
        let c = Credentials::load(admin, none()).unwrap();
        assert!(c.admin_token("aaa").is_some());
        std::fs::write(&file, "old=aaa\nnew=bbb\n").unwrap();
        assert_eq!(
            c.reload().unwrap(),
            "admin tokens: old, new; provider secrets: none"
        );
        assert!(c.admin_token("bbb").is_some());
        std::fs::write(&file, "new=bbb\nnew=ccc\n").unwrap();
        let e = c.reload().unwrap_err();
        assert!(!e.contains("ccc") && !e.contains("bbb"), "{e}");
        assert!(c.admin_token("aaa").is_some(), "the set in force stays");
        std::fs::write(&file, "\n").unwrap();
        assert!(c.reload().is_err(), "a file with no token keeps the set");
        std::fs::remove_file(&file).unwrap();
        assert!(c.reload().is_err());
        assert!(c.admin_token("bbb").is_some());
    }

    #[test]
    fn an_error_names_the_line_never_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secrets");
        std::fs::write(&file, "p=ok\nnot-a-pair-s3cr3t\n").unwrap();
        let providers = Source {
            given: vec![],
            file: Some(file),
        };
        let e = Credentials::load(none(), providers)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
    }
}
