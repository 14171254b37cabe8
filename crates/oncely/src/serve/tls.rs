//! HTTPS on `listen`: a rustls server config from the PEM files `tls = { cert, key }`
//! names, offering HTTP/2 and HTTP/1.1 by ALPN.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;

use crate::config::TlsFiles;

/// Loads the certificate chain and private key.
pub fn server_config(files: &TlsFiles) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs = oncely_http::client::read_certificates(&files.cert)?;
    let key = read_key(&files.key)?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(oncely_http::client::crypto_provider())
            .with_safe_default_protocol_versions()
            .context("TLS setup")?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .with_context(|| {
                format!(
                    "{} and {} do not make a usable certificate and key",
                    files.cert.display(),
                    files.key.display()
                )
            })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_key(path: &Path) -> anyhow::Result<rustls::pki_types::PrivateKeyDer<'static>> {
    let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .with_context(|| format!("{} is not a PEM private key file", path.display()))?
        .with_context(|| format!("{} holds no private key", path.display()))
}
