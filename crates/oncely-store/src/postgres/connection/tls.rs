//! TLS for the store's connections (the pool's and the listener's), as libpq's `sslmode`
//! says: rustls with the ring provider, named explicitly, as for `https://` upstreams.
//!
//! tokio-postgres negotiates (`disable`, `prefer`: TLS when the server offers it, else
//! plain; `require` and stronger: TLS or nothing); [`MakeRustls`] does the handshake and
//! checks what the mode asks for ([`Check`]): nothing, the chain to `sslrootcert` (or the
//! system's roots), or the chain and the host name or IP. It presents `sslcert`/`sslkey`
//! when given, sends SNI unless `sslsni=0`, offers ALPN `postgresql` (as libpq 17 does),
//! and hands SCRAM the channel binding ([`binding`](super::binding)).
//!
//! A handshake that fails says why in words: which certificate problem, against which
//! roots, for which host ([`TlsError`]). Files are read once, when the store opens.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{AlertDescription, CertificateError, ClientConfig, DigitallySignedStruct};
use rustls::{RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use super::binding;
use super::params::{Check, RootCert, SslMode, TlsParams};
use crate::StoreError;

/// Makes the TLS connector of each connection (tokio-postgres calls it per host).
#[derive(Clone)]
pub(super) struct MakeRustls {
    /// `None` under `sslmode=disable`: tokio-postgres then never asks for TLS.
    tls: Option<Arc<Tls>>,
}

/// What every handshake of a store shares.
struct Tls {
    config: Arc<ClientConfig>,
    /// Which CAs a trusted certificate is signed by, for messages ("no CA in ...").
    roots: String,
    /// `sslcert=FILE`, for messages.
    client_cert: Option<String>,
}

impl MakeRustls {
    /// The connector `params` ask for; reads the files they name.
    pub(super) fn new(params: &TlsParams) -> Result<MakeRustls, StoreError> {
        if params.mode == SslMode::Disable {
            return Ok(MakeRustls { tls: None });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        let verifier: Arc<dyn ServerCertVerifier> = match params.check() {
            Check::Nothing => Arc::new(NoName {
                roots: None,
                algorithms,
            }),
            Check::Chain => Arc::new(NoName {
                roots: Some(Arc::new(root_store(params.roots())?)),
                algorithms,
            }),
            Check::ChainAndHost => WebPkiServerVerifier::builder_with_provider(
                Arc::new(root_store(params.roots())?),
                provider.clone(),
            )
            .build()
            .map_err(|e| config_error(format!("TLS setup: {e}")))?,
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| config_error(format!("TLS setup: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &params.client_cert {
            Some((cert, key)) => builder
                .with_client_auth_cert(read_certificates(cert, "sslcert")?, read_key(key)?)
                .map_err(|e| {
                    config_error(format!(
                        "sslcert {} and sslkey {}: {e}",
                        cert.display(),
                        key.display()
                    ))
                })?,
            None => builder.with_no_client_auth(),
        };
        config.enable_sni = params.sni;
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(MakeRustls {
            tls: Some(Arc::new(Tls {
                config: Arc::new(config),
                roots: match params.roots() {
                    RootCert::File(path) => format!("sslrootcert={} signed it", path.display()),
                    RootCert::System => "the system's root certificates signed it (name the \
                                         CA that did with sslrootcert=FILE)"
                        .into(),
                },
                client_cert: params
                    .client_cert
                    .as_ref()
                    .map(|(cert, _)| cert.display().to_string()),
            })),
        })
    }
}

fn config_error(message: String) -> StoreError {
    StoreError::Config(format!("PostgreSQL TLS: {message}"))
}

/// The CA certificates `roots` names.
fn root_store(roots: &RootCert) -> Result<RootCertStore, StoreError> {
    let mut store = RootCertStore::empty();
    match roots {
        RootCert::File(path) => {
            for cert in read_certificates(path, "sslrootcert")? {
                store.add(cert).map_err(|e| {
                    config_error(format!(
                        "sslrootcert {}: unusable CA certificate: {e}",
                        path.display()
                    ))
                })?;
            }
        }
        RootCert::System => {
            // As for https:// upstreams: a partly unreadable system store is not fatal.
            store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if store.is_empty() {
                return Err(config_error(
                    "the system has no root certificates to check the server's certificate \
                     against: name its CA with sslrootcert=FILE"
                        .into(),
                ));
            }
        }
    }
    Ok(store)
}

/// The certificates of the PEM file `path` (at least one); `what` is its parameter.
fn read_certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let pem = std::fs::read(path)
        .map_err(|e| config_error(format!("{what} {}: cannot read: {e}", path.display())))?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| config_error(format!("{what} {}: not PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(config_error(format!(
            "{what} {} holds no certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// The private key of the PEM file `path` (`sslkey`).
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, StoreError> {
    let pem = std::fs::read(path)
        .map_err(|e| config_error(format!("sslkey {}: cannot read: {e}", path.display())))?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| config_error(format!("sslkey {}: not PEM: {e}", path.display())))?
        .ok_or_else(|| {
            config_error(format!(
                "sslkey {} holds no unencrypted private key (PKCS #8, PKCS #1 or SEC1 PEM)",
                path.display()
            ))
        })
}

/// A verifier that never checks the name: with `roots`, the chain to a trusted CA
/// (`verify-ca`, and `require` with a root certificate file); without, any certificate
/// (`prefer` and `require` without one: libpq's behaviour). The handshake's signatures
/// are checked either way.
#[derive(Debug)]
struct NoName {
    roots: Option<Arc<RootCertStore>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NoName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A handshake (or a session) that failed, in words.
#[derive(Debug)]
pub(super) struct TlsError(String);

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

impl Tls {
    /// Why the TLS session with `host` failed: `e` is what tokio-rustls reported.
    fn describe(&self, host: &str, e: &io::Error) -> String {
        match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::InvalidCertificate(problem)) => {
                format!("{host}: {}", self.certificate_problem(host, problem))
            }
            Some(rustls::Error::AlertReceived(alert)) => {
                format!("{host}: {}", self.alert(*alert))
            }
            Some(other) => format!("{host}: TLS handshake failed: {other}"),
            None => format!("{host}: TLS handshake failed: {e}"),
        }
    }

    fn certificate_problem(&self, host: &str, problem: &CertificateError) -> String {
        let cause = match problem {
            CertificateError::UnknownIssuer => {
                return format!(
                    "the server's certificate is not trusted (UnknownIssuer): no CA in {}",
                    self.roots
                )
            }
            CertificateError::NotValidForName => {
                return format!(
                    "the server's certificate does not name {host} (NotValidForName; \
                     sslmode=verify-full checks the host name)"
                )
            }
            CertificateError::NotValidForNameContext { presented, .. } => {
                let names: Vec<&str> = presented.iter().map(|n| presented_name(n)).collect();
                return format!(
                    "the server's certificate does not name {host}, only {} \
                     (NotValidForName; sslmode=verify-full checks the host name)",
                    if names.is_empty() {
                        "no name".to_string()
                    } else {
                        names.join(", ")
                    }
                );
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => "has expired",
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "is not valid yet"
            }
            CertificateError::Revoked => "has been revoked",
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
                "is not for a server"
            }
            CertificateError::BadSignature => "has a bad signature",
            _ => "is not valid",
        };
        format!("the server's certificate {cause} ({problem})")
    }

    fn alert(&self, alert: AlertDescription) -> String {
        use AlertDescription as A;
        let refused_certificate = matches!(
            alert,
            A::BadCertificate
                | A::UnknownCA
                | A::CertificateRequired
                | A::AccessDenied
                | A::UnsupportedCertificate
                | A::CertificateExpired
                | A::CertificateRevoked
                | A::CertificateUnknown
                | A::DecryptError
        );
        match (&self.client_cert, alert) {
            (None, A::CertificateRequired) => {
                "the server requires a client certificate (CertificateRequired): give sslcert \
                 and sslkey"
                    .into()
            }
            (Some(cert), _) if refused_certificate => {
                format!("the server refused the client certificate sslcert={cert} ({alert:?})")
            }
            _ => format!("the server ended the TLS session ({alert:?})"),
        }
    }
}

/// `localhost` for webpki's `DnsName("localhost")`, `127.0.0.1` for `IpAddress(127.0.0.1)`.
fn presented_name(name: &str) -> &str {
    name.strip_prefix("DnsName(\"")
        .and_then(|n| n.strip_suffix("\")"))
        .or_else(|| {
            name.strip_prefix("IpAddress(")
                .and_then(|n| n.strip_suffix(')'))
        })
        .unwrap_or(name)
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = TlsError;

    /// Infallible: tokio-postgres asks for one even for a Unix socket (no host name),
    /// where it never uses it; a host name TLS cannot check fails the handshake.
    fn make_tls_connect(&mut self, host: &str) -> Result<RustlsConnect, TlsError> {
        Ok(RustlsConnect {
            tls: self.tls.clone(),
            host: host.to_owned(),
        })
    }
}

/// The TLS connector of one connection.
pub(super) struct RustlsConnect {
    tls: Option<Arc<Tls>>,
    host: String,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = TlsError;
    type Future = Pin<Box<dyn Future<Output = Result<RustlsStream<S>, TlsError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let host = self.host;
            let Some(tls) = self.tls else {
                return Err(TlsError(format!("{host}: TLS is off (sslmode=disable)")));
            };
            let name = ServerName::try_from(host.clone()).map_err(|_| {
                TlsError(format!(
                    "{host:?} is not a host name or IP address TLS can check"
                ))
            })?;
            let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
            match connector.connect(name, stream).await {
                Ok(stream) => Ok(RustlsStream { stream, tls, host }),
                Err(e) => Err(TlsError(tls.describe(&host, &e))),
            }
        })
    }
}

/// A TLS session with the server.
pub(super) struct RustlsStream<S> {
    stream: tokio_rustls::client::TlsStream<S>,
    tls: Arc<Tls>,
    host: String,
}

impl<S> RustlsStream<S> {
    /// An alert the server sends after the handshake (TLS 1.3 refuses a client
    /// certificate so) says why in words too.
    fn explain(&self, e: io::Error) -> io::Error {
        match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::AlertReceived(_)) => {
                io::Error::new(e.kind(), TlsError(self.tls.describe(&self.host, &e)))
            }
            _ => e,
        }
    }
}

impl<S> TlsStream for RustlsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.stream.get_ref();
        session
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| binding::tls_server_end_point(cert))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

impl<S> AsyncRead for RustlsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(self.explain(e))),
            other => other,
        }
    }
}

impl<S> AsyncWrite for RustlsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn params(mode: SslMode, root_cert: Option<RootCert>) -> TlsParams {
        TlsParams {
            mode,
            root_cert,
            client_cert: None,
            sni: true,
        }
    }

    fn refusal(params: &TlsParams) -> String {
        match MakeRustls::new(params) {
            Err(StoreError::Config(m)) => m,
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("taken: {params:?}"),
        }
    }

    /// A CA certificate, and a certificate with its key that it signed, as PEM files.
    fn files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["oncely".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        let paths = (
            dir.join("ca.pem"),
            dir.join("cert.pem"),
            dir.join("key.pem"),
        );
        std::fs::write(&paths.0, ca.pem()).unwrap();
        std::fs::write(&paths.1, leaf.pem()).unwrap();
        std::fs::write(&paths.2, key.serialize_pem()).unwrap();
        paths
    }

    #[test]
    fn the_files_the_parameters_name_are_read_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = files(dir.path());
        for mode in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
            let mut p = params(mode, Some(RootCert::File(ca.clone())));
            p.client_cert = Some((cert.clone(), key.clone()));
            assert!(MakeRustls::new(&p).is_ok(), "{mode:?}");
        }
        // Under disable nothing is read.
        let p = params(
            SslMode::Disable,
            Some(RootCert::File(dir.path().join("none"))),
        );
        assert!(MakeRustls::new(&p).unwrap().tls.is_none());
    }

    #[test]
    fn a_file_that_cannot_be_used_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_, cert, key) = files(dir.path());
        let missing = dir.path().join("missing.pem");
        let m = refusal(&params(
            SslMode::VerifyCa,
            Some(RootCert::File(missing.clone())),
        ));
        assert!(
            m.contains("sslrootcert") && m.contains("cannot read"),
            "{m}"
        );
        assert!(m.contains(&missing.display().to_string()), "{m}");
        // A key is no certificate, and a certificate no key.
        let m = refusal(&params(
            SslMode::VerifyFull,
            Some(RootCert::File(key.clone())),
        ));
        assert!(m.contains("holds no certificate"), "{m}");
        let mut p = params(SslMode::Require, None);
        p.client_cert = Some((cert.clone(), cert.clone()));
        let m = refusal(&p);
        assert!(
            m.contains("sslkey") && m.contains("no unencrypted private key"),
            "{m}"
        );
        // A key that is not the certificate's.
        let (_, _, other_key) = files(&{
            let d = dir.path().join("other");
            std::fs::create_dir(&d).unwrap();
            d
        });
        p.client_cert = Some((cert, other_key));
        let m = refusal(&p);
        assert!(m.contains("sslcert") && m.contains("sslkey"), "{m}");
    }

    #[test]
    fn presented_names_are_shown_as_written() {
        assert_eq!(presented_name("DnsName(\"db.example\")"), "db.example");
        assert_eq!(presented_name("IpAddress(127.0.0.1)"), "127.0.0.1");
        assert_eq!(presented_name("DirectoryName"), "DirectoryName");
    }
}
