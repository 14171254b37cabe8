//! The upstream client every outgoing call goes through: the reverse proxy and its
//! reconciler, the MCP endpoints, the webhook deliveries and the trace exporter.
//!
//! One pooled hyper-util client over hyper-rustls, for `http://` and `https://`, with one
//! trust store: the system's root certificates (a missing or partly unreadable system
//! store is not fatal: plain `http://` upstreams and an explicit CA file still work), plus
//! the PEM certificates of the config's `upstream_ca` and of the file the environment
//! variable [`EXTRA_CA_ENV`] names (an extension, for private CAs and tests). TLS is
//! rustls with the ring provider, named explicitly so that no other crate's choice can
//! make the process-wide default ambiguous.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

/// The environment variable naming extra CA certificates (PEM) for `https://` upstreams.
pub const EXTRA_CA_ENV: &str = "ONCELY_EXTRA_CA_FILE";

/// The pooled HTTP/HTTPS client, sending bodies of type `B`.
pub type PooledClient<B> = Client<HttpsConnector<HttpConnector>, B>;

/// Why a client could not be built: a CA file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The file cannot be read.
    #[error("cannot read {}: {cause}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (shown in the message, so not a `source` too: the cause once).
        cause: std::io::Error,
    },
    /// The file is not PEM.
    #[error("{} is not a PEM certificate file: {cause}", path.display())]
    NotPem {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// The file holds no certificate.
    #[error("{} holds no certificate", .0.display())]
    Empty(PathBuf),
    /// A certificate rustls does not accept as a root.
    #[error("{}: unusable CA certificate: {cause}", path.display())]
    Unusable {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: rustls::Error,
    },
    /// The TLS configuration failed.
    #[error("TLS setup: {0}")]
    Tls(rustls::Error),
}

/// What a caller chooses about its client.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// A PEM file of CA certificates trusted besides the system's (`upstream_ca`).
    pub extra_ca: Option<PathBuf>,
    /// Whether the file [`EXTRA_CA_ENV`] names is trusted too (default yes).
    pub env_ca: bool,
    /// How long a connect may take (default: no limit but the caller's own).
    pub connect_timeout: Option<Duration>,
    /// How long an idle pooled connection is kept (default: hyper-util's, 90 s).
    pub pool_idle_timeout: Option<Duration>,
    /// Whether HTTP/2 is offered over TLS (ALPN) besides HTTP/1.1 (default no).
    pub http2: bool,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            extra_ca: None,
            env_ca: true,
            connect_timeout: None,
            pool_idle_timeout: None,
            http2: false,
        }
    }
}

impl ClientOptions {
    /// The defaults, trusting `extra_ca` too.
    pub fn with_extra_ca(extra_ca: Option<&Path>) -> ClientOptions {
        ClientOptions {
            extra_ca: extra_ca.map(Path::to_path_buf),
            ..ClientOptions::default()
        }
    }
}

/// The rustls provider oncely uses, for its client and its server alike.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file (at least one).
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let pem = std::fs::read(path).map_err(|cause| ClientError::Read {
        path: path.to_path_buf(),
        cause,
    })?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|cause| ClientError::NotPem {
            path: path.to_path_buf(),
            cause,
        })?;
    if certs.is_empty() {
        return Err(ClientError::Empty(path.to_path_buf()));
    }
    Ok(certs)
}

/// The trust store of `options`: the system's roots, plus its CA files.
pub fn root_store(options: &ClientOptions) -> Result<RootCertStore, ClientError> {
    let mut roots = RootCertStore::empty();
    // A missing or partly unreadable system store is not fatal.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let env_ca = options
        .env_ca
        .then(|| std::env::var_os(EXTRA_CA_ENV).map(PathBuf::from))
        .flatten();
    for path in options.extra_ca.iter().cloned().chain(env_ca) {
        for cert in read_certificates(&path)? {
            roots.add(cert).map_err(|cause| ClientError::Unusable {
                path: path.clone(),
                cause,
            })?;
        }
    }
    Ok(roots)
}

/// The upstream client for `options`.
pub fn upstream_client<B>(options: &ClientOptions) -> Result<PooledClient<B>, ClientError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    let roots = root_store(options)?;
    let tls = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(ClientError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(options.connect_timeout);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1();
    let connector = if options.http2 {
        builder.enable_http2().wrap_connector(http)
    } else {
        builder.wrap_connector(http)
    };
    let mut client = Client::builder(TokioExecutor::new());
    if let Some(idle) = options.pool_idle_timeout {
        client.pool_idle_timeout(idle);
    }
    Ok(client.build(connector))
}

/// The upstream client for `options`, or, when a CA file of them cannot be used, one
/// without the CA files (logged as a warning): for callers that have no way to refuse to
/// start.
pub fn upstream_client_or_warn<B>(options: &ClientOptions) -> PooledClient<B>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    upstream_client(options).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "extra CA file ignored");
        let without = ClientOptions {
            extra_ca: None,
            env_ca: false,
            ..options.clone()
        };
        upstream_client(&without).expect("a client without CA files always builds")
    })
}

/// An error with its sources, `a: b: c` (the core's, named here for the client's callers).
pub use oncely_core::error_chain;

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;

    #[test]
    fn an_extra_ca_is_trusted_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, ca.cert.pem()).unwrap();
        let plain = ClientOptions {
            env_ca: false,
            ..ClientOptions::default()
        };
        let with_ca = ClientOptions {
            extra_ca: Some(good.clone()),
            ..plain.clone()
        };
        assert_eq!(
            root_store(&with_ca).unwrap().len(),
            root_store(&plain).unwrap().len() + 1
        );
        let _client: PooledClient<Full<Bytes>> = upstream_client(&with_ca).unwrap();

        let missing = dir.path().join("missing.pem");
        let err = upstream_client::<Full<Bytes>>(&ClientOptions {
            extra_ca: Some(missing.clone()),
            ..plain.clone()
        })
        .unwrap_err();
        assert!(matches!(err, ClientError::Read { .. }), "{err}");
        // The chain names the cause too.
        assert!(error_chain(&err).contains("missing.pem"), "{err}");
        assert!(err.to_string().contains("missing.pem"), "{err}");

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let err = upstream_client::<Full<Bytes>>(&ClientOptions {
            extra_ca: Some(empty),
            ..plain
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} holds no certificate",
                dir.path().join("empty.pem").display()
            )
        );
    }
}
