//! TLS for both HTTP servers and for the connections between members (rustls).
//!
//! - [`ServerTls`]: the server side. Its certificate chain and key are read from PEM files
//!   and read again by [`ServerTls::reload`] (the node calls it on SIGHUP), so a renewed
//!   certificate is served to new connections without a restart; a reload that fails keeps
//!   the certificate in use. ALPN offers `h2` and `http/1.1`.
//! - [`PeerTls`]: the client side of member-to-member traffic (Raft, shard requests, joins,
//!   forwarded admin calls): the URL scheme and the roots a peer's certificate must chain to
//!   (the configured CA bundle, else the system's roots).
//!
//! A cluster is either all TLS or all plain: members address each other by `host:port` and
//! the scheme is this node's own setting.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// Where a node's certificate, key and trusted roots are (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key of the leaf (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Roots other members' certificates must chain to; None: the system's roots.
    pub ca: Option<PathBuf>,
}

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {reason}")]
    File {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS set-up: {0}")]
    Setup(String),
}

fn file_error(what: &'static str, path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The largest PEM file read: far more than any chain, key or CA bundle in use.
const MAX_PEM_BYTES: u64 = 4 * 1024 * 1024;

/// Reads a PEM file whole, refusing anything but a regular file of at most [`MAX_PEM_BYTES`]
/// (a path such as /dev/zero would otherwise be read forever).
fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|error| file_error(what, path, error))?;
    let metadata = file
        .metadata()
        .map_err(|error| file_error(what, path, error))?;
    if !metadata.is_file() {
        return Err(file_error(what, path, "not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| file_error(what, path, error))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(file_error(
            what,
            path,
            format!("larger than {MAX_PEM_BYTES} bytes"),
        ));
    }
    Ok(bytes)
}

/// Reads a chain and its key and checks that they belong together.
fn load_certified_key(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(&read_pem("certificate", &files.cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error("certificate", &files.cert, error))?;
    if chain.is_empty() {
        return Err(file_error(
            "certificate",
            &files.cert,
            "no PEM certificate in the file",
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&read_pem("private key", &files.key)?)
        .map_err(|error| file_error("private key", &files.key, error))?;
    let signing_key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|error| file_error("private key", &files.key, error))?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified.keys_match().map_err(|error| {
        file_error(
            "private key",
            &files.key,
            format!("does not match the certificate: {error}"),
        )
    })?;
    Ok(certified)
}

/// The certificate in use; swapped whole by a reload.
#[derive(Debug)]
struct CurrentCert(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// The server side of TLS: an acceptor whose certificate can be reloaded. Cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    files: TlsFiles,
    current: Arc<CurrentCert>,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish()
    }
}

impl ServerTls {
    /// Reads the certificate and key; an unreadable or mismatched pair is an error.
    pub fn load(files: &TlsFiles) -> Result<ServerTls, TlsError> {
        let current = Arc::new(CurrentCert(RwLock::new(Arc::new(load_certified_key(
            files,
        )?))));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Setup(error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            files: files.clone(),
            current,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Reads the files again; new connections get the new certificate. On an error the
    /// certificate in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        match load_certified_key(&self.files) {
            Ok(certified) => {
                *self.current.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(certified);
                metrics::counter!("sift_tls_reloads_total", "outcome" => "ok").increment(1);
                info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                Ok(())
            }
            Err(error) => {
                metrics::counter!("sift_tls_reloads_total", "outcome" => "failed").increment(1);
                warn!(%error, "TLS certificate not reloaded: the previous one stays in use");
                Err(error)
            }
        }
    }

    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

/// How this node connects to other members: plain HTTP, or HTTPS trusting given roots.
#[derive(Clone, Debug, Default)]
pub struct PeerTls {
    /// None: plain HTTP. Some(roots): HTTPS; empty roots mean the system's.
    roots: Option<Vec<reqwest::Certificate>>,
}

impl PeerTls {
    /// Plain HTTP between members.
    pub fn plain() -> PeerTls {
        PeerTls { roots: None }
    }

    /// HTTPS between members, trusting `files.ca` (or the system's roots without one).
    pub fn from_files(files: &TlsFiles) -> Result<PeerTls, TlsError> {
        let roots = match &files.ca {
            Some(path) => read_roots(path)?,
            None => Vec::new(),
        };
        Ok(PeerTls { roots: Some(roots) })
    }

    pub fn enabled(&self) -> bool {
        self.roots.is_some()
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.enabled() { "https" } else { "http" }
    }

    /// The URL of `path` on the member at `address` (`host:port`).
    pub fn url(&self, address: &str, path: &str) -> String {
        format!("{}://{address}{path}", self.scheme())
    }

    /// A client builder that trusts the configured roots (only them, when a CA is given).
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        let builder = reqwest::Client::builder();
        match &self.roots {
            Some(roots) if !roots.is_empty() => builder.tls_certs_only(roots.iter().cloned()),
            _ => builder,
        }
    }
}

/// Reads a PEM bundle of root certificates for clients (the CLI's `--tls-ca` too).
pub fn read_roots(path: &Path) -> Result<Vec<reqwest::Certificate>, TlsError> {
    let bytes = read_pem("CA bundle", path)?;
    let roots = reqwest::Certificate::from_pem_bundle(&bytes)
        .map_err(|error| file_error("CA bundle", path, error))?;
    if roots.is_empty() {
        return Err(file_error(
            "CA bundle",
            path,
            "no PEM certificate in the file",
        ));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/tls")
            .join(name)
    }

    fn files(cert: &str, key: &str) -> TlsFiles {
        TlsFiles {
            cert: fixture(cert),
            key: fixture(key),
            ca: Some(fixture("ca.crt")),
        }
    }

    #[test]
    fn a_matching_pair_loads_and_a_mismatched_or_missing_one_is_refused() {
        ServerTls::load(&files("node-a.crt", "node-a.key")).unwrap();
        let mismatched = ServerTls::load(&files("node-a.crt", "node-b.key")).unwrap_err();
        assert!(
            mismatched.to_string().contains("does not match"),
            "{mismatched}"
        );
        let missing = ServerTls::load(&files("absent.crt", "node-a.key")).unwrap_err();
        assert!(missing.to_string().contains("absent.crt"), "{missing}");
        let not_a_cert = ServerTls::load(&files("node-a.key", "node-a.key")).unwrap_err();
        assert!(
            not_a_cert.to_string().contains("no PEM certificate"),
            "{not_a_cert}"
        );
        assert!(PeerTls::from_files(&files("node-a.crt", "node-a.key")).is_ok());
        let bad_ca = TlsFiles {
            ca: Some(fixture("node-a.key")),
            ..files("node-a.crt", "node-a.key")
        };
        assert!(PeerTls::from_files(&bad_ca).is_err());
        // A device or a directory is refused at once, not read forever.
        let endless = TlsFiles {
            cert: PathBuf::from("/dev/zero"),
            ..files("node-a.crt", "node-a.key")
        };
        let error = ServerTls::load(&endless).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        let directory = TlsFiles {
            ca: Some(fixture("")),
            ..files("node-a.crt", "node-a.key")
        };
        assert!(PeerTls::from_files(&directory).is_err());
    }

    #[test]
    fn a_failed_reload_keeps_the_certificate_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("node.crt");
        let key = dir.path().join("node.key");
        std::fs::copy(fixture("node-a.crt"), &cert).unwrap();
        std::fs::copy(fixture("node-a.key"), &key).unwrap();
        let tls = ServerTls::load(&TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            ca: None,
        })
        .unwrap();
        let before = tls.current.0.read().unwrap().cert.clone();
        std::fs::write(&key, "not a key").unwrap();
        assert!(tls.reload().is_err());
        assert_eq!(tls.current.0.read().unwrap().cert, before);
        std::fs::copy(fixture("node-b.crt"), &cert).unwrap();
        std::fs::copy(fixture("node-b.key"), &key).unwrap();
        tls.reload().unwrap();
        assert_ne!(tls.current.0.read().unwrap().cert, before);
    }
}
