//! The serving certificate of the metrics listener: the files named by
//! `--tls-cert-file` / `--tls-private-key-file`, re-read when they change
//! on disk (a renewal by cert-manager, an updated Secret volume), or a
//! self-signed certificate made at start.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, ensure};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// How often a handshake may look at the files' modification times.
const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(10);

/// The certificate and key files a serving certificate is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    /// PEM files, watched for changes.
    Files(CertFiles),
    /// Made at start for these DNS names (the clients skip verification or
    /// pin it; nothing is written to disk).
    SelfSigned(Vec<String>),
}

/// The TLS configuration of a listener serving `source`'s certificate.
pub fn server_config(source: CertSource) -> anyhow::Result<Arc<ServerConfig>> {
    let resolver = ServingCert::new(source)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Hands every handshake the current certificate.
struct ServingCert {
    source: CertSource,
    current: Mutex<Current>,
}

struct Current {
    key: Arc<CertifiedKey>,
    /// Modification times of (cert, key) when last read.
    stamps: Option<(SystemTime, SystemTime)>,
    checked: Instant,
}

impl fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServingCert")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl ServingCert {
    fn new(source: CertSource) -> anyhow::Result<Self> {
        let (key, stamps) = match &source {
            CertSource::Files(files) => (read_files(files)?, modified(files)),
            CertSource::SelfSigned(names) => (self_signed(names.clone())?, None),
        };
        Ok(ServingCert {
            source,
            current: Mutex::new(Current {
                key: Arc::new(key),
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The certificate to serve, re-read first if the files changed since
    /// they were last read (looked at once per [`RELOAD_CHECK_EVERY`]). A
    /// file that does not parse (half written, say) keeps the previous
    /// certificate in service.
    fn current(&self) -> Arc<CertifiedKey> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let CertSource::Files(files) = &self.source
            && current.checked.elapsed() >= RELOAD_CHECK_EVERY
        {
            current.checked = Instant::now();
            let stamps = modified(files);
            if stamps.is_some() && stamps != current.stamps {
                match read_files(files) {
                    Ok(key) => {
                        current.key = Arc::new(key);
                        current.stamps = stamps;
                        info!(cert = %files.cert.display(), "serving certificate reloaded");
                    }
                    Err(err) => {
                        warn!(
                            error = format!("{err:#}"),
                            "serving certificate changed but cannot be read; keeping the previous one"
                        )
                    }
                }
            }
        }
        current.key.clone()
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn modified(files: &CertFiles) -> Option<(SystemTime, SystemTime)> {
    let stamp = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((stamp(&files.cert)?, stamp(&files.key)?))
}

fn read_files(files: &CertFiles) -> anyhow::Result<CertifiedKey> {
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("--tls-cert-file {}", files.cert.display()))?;
    ensure!(
        !certs.is_empty(),
        "--tls-cert-file {}: no PEM certificate in it",
        files.cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("--tls-private-key-file {}", files.key.display()))?;
    certified(certs, key).with_context(|| format!("--tls-private-key-file {}", files.key.display()))
}

fn certified(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> anyhow::Result<CertifiedKey> {
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .context("unsupported private key type")?;
    Ok(CertifiedKey::new(certs, signing))
}

/// A new key pair and a certificate for `names`, signed by itself.
fn self_signed(names: Vec<String>) -> anyhow::Result<CertifiedKey> {
    let made =
        rcgen::generate_simple_self_signed(names).context("making a self-signed certificate")?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
    certified(vec![made.cert.der().clone()], key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> CertFiles {
        let made = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let files = CertFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&files.cert, made.cert.pem()).unwrap();
        std::fs::write(&files.key, made.signing_key.serialize_pem()).unwrap();
        files
    }

    #[test]
    fn files_are_read_and_reloaded_when_they_change() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_pair(dir.path(), "first.example");
        let serving = ServingCert::new(CertSource::Files(files.clone())).unwrap();
        let first = serving.current();

        // A half-written file keeps the previous certificate in service.
        std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\ntrunc").unwrap();
        serving.current.lock().unwrap().checked -= RELOAD_CHECK_EVERY;
        serving.current.lock().unwrap().stamps = None;
        assert_eq!(serving.current().cert, first.cert);

        write_pair(dir.path(), "second.example");
        serving.current.lock().unwrap().checked -= RELOAD_CHECK_EVERY;
        serving.current.lock().unwrap().stamps = None;
        assert_ne!(
            serving.current().cert,
            first.cert,
            "renewed certificate served"
        );
    }

    #[test]
    fn unreadable_files_name_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let files = CertFiles {
            cert: dir.path().join("missing.crt"),
            key: dir.path().join("missing.key"),
        };
        let err = ServingCert::new(CertSource::Files(files)).unwrap_err();
        assert!(format!("{err:#}").contains("--tls-cert-file"), "{err:#}");
        let files = write_pair(dir.path(), "x");
        std::fs::write(&files.key, "not a key").unwrap();
        let err = ServingCert::new(CertSource::Files(files)).unwrap_err();
        assert!(
            format!("{err:#}").contains("--tls-private-key-file"),
            "{err:#}"
        );
    }

    #[test]
    fn self_signed_config_builds() {
        let config = server_config(CertSource::SelfSigned(vec!["localhost".into()])).unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
    }
}
