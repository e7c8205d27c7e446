//! HTTPS in the binary: rustls (ring, no OpenSSL), TLS 1.2 and 1.3 only, and a certificate
//! that SIGHUP replaces for new connections (an ACME client renews the files, then signals).
//! A pair that does not load at start stops the start; one that does not load at a reload is
//! logged and the certificate in force stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::crypto::ring::{default_provider, sign::any_supported_type};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

/// Why the certificate and key of `--tls-cert` and `--tls-key` cannot serve HTTPS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate chain cannot be read.
    #[error("cannot read the certificate chain {0}: {1}")]
    Chain(PathBuf, String),
    /// The private key cannot be read.
    #[error("cannot read the private key {0}: {1}")]
    Key(PathBuf, String),
    #[error("the private key {key} does not match the certificate {cert}")]
    /// The key is not the certificate's.
    Mismatch {
        /// The certificate chain's file.
        cert: PathBuf,
        /// The private key's file.
        key: PathBuf,
    },
    /// rustls refused the configuration.
    #[error("TLS setup: {0}")]
    Setup(String),
}

/// The certificate and key files, and the pair loaded from them now.
#[derive(Debug)]
pub(crate) struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

/// Reads a PEM chain and its key and checks that they belong together.
fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| TlsError::Chain(cert.to_path_buf(), e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::Chain(
            cert.to_path_buf(),
            "no certificate in the file".into(),
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError::Key(key.to_path_buf(), e.to_string()))?;
    let signing = any_supported_type(&private)
        .map_err(|e| TlsError::Key(key.to_path_buf(), e.to_string()))?;
    let pair = CertifiedKey::new(chain, signing);
    pair.keys_match().map_err(|_| TlsError::Mismatch {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
    })?;
    Ok(pair)
}

impl ReloadingCert {
    pub(crate) fn open(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let pair = load(cert, key)?;
        Ok(ReloadingCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new(Arc::new(pair)),
        })
    }

    /// Loads the files again; on success new connections get the new pair.
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        let pair = Arc::new(load(&self.cert, &self.key)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = pair;
        Ok(())
    }

    /// The server configuration: TLS 1.2 and 1.3, HTTP/1.1, this certificate.
    pub(crate) fn server_config(self: &Arc<Self>) -> Result<ServerConfig, TlsError> {
        let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|e| e.into_inner()),
        ))
    }
}
