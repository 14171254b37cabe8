//! How exports travel, for spans and metrics alike: the protocol, the gRPC channel's TLS
//! and metadata ([`grpc_tls`], [`Metadata`]), and the HTTP client OTLP/HTTP exports go
//! through: hyper with rustls (the system's roots,
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` besides them, and a client certificate for mutual
//! TLS), as `opentelemetry-http`'s [`HttpClient`].
//!
//! The SDK's batch processor exports from a thread of its own, outside the runtime; each
//! request is therefore spawned onto the gateway's runtime (`handle`) and awaited there,
//! bounded by the export timeout. The resolved headers are set last, so that a header
//! the file sets wins over the crate's own reading of `OTEL_EXPORTER_OTLP_HEADERS`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};

use crate::config::telemetry::Export;
use crate::config::tracing::Protocol;

/// The most of a collector's answer that is read.
const MAX_ANSWER: usize = 1 << 20;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// One signal's OTLP/HTTP client.
#[derive(Clone)]
pub(super) struct ExportClient {
    client: Client<Https, Full<Bytes>>,
    handle: tokio::runtime::Handle,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
}

impl std::fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the headers: they hold vendors' keys.
        f.debug_struct("ExportClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ExportClient {
    /// The client of `export`, spawning its requests on `handle`.
    pub(super) fn new(export: &Export, handle: tokio::runtime::Handle) -> anyhow::Result<Self> {
        let tls = tls_config(export)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(export.timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        let headers = export
            .headers
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    HeaderName::from_bytes(k.as_bytes()).ok()?,
                    HeaderValue::from_str(v).ok()?,
                ))
            })
            .collect();
        Ok(ExportClient {
            client,
            handle,
            headers,
            timeout: export.timeout,
        })
    }
}

impl ExportClient {
    /// Waits `pause` on the gateway's runtime: an export runs on the batch processor's
    /// thread, which has no timer of its own.
    pub(super) async fn pause(&self, pause: Duration) {
        // The timer is made on the runtime too: making one needs its context.
        let _ = self
            .handle
            .spawn(async move { tokio::time::sleep(pause).await })
            .await;
    }
}

/// The collector's TLS: the system's roots and `certificate`, and the client identity.
pub(super) fn tls_config(export: &Export) -> anyhow::Result<rustls::ClientConfig> {
    let options = oncely_http::client::ClientOptions {
        extra_ca: export.certificate.clone(),
        env_ca: false,
        ..Default::default()
    };
    let roots = oncely_http::client::root_store(&options)
        .context("OTEL_EXPORTER_OTLP_CERTIFICATE (tracing.certificate)")?;
    let builder =
        rustls::ClientConfig::builder_with_provider(oncely_http::client::crypto_provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
    Ok(match &export.client_identity {
        None => builder.with_no_client_auth(),
        Some((key, cert)) => {
            let chain = oncely_http::client::read_certificates(cert)
                .context("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE (tracing.client_certificate)")?;
            let key =
                private_key(key).context("OTEL_EXPORTER_OTLP_CLIENT_KEY (tracing.client_key)")?;
            builder
                .with_client_auth_cert(chain, key)
                .context("OTEL_EXPORTER_OTLP_CLIENT_KEY: the key does not fit the certificate")?
        }
    })
}

fn private_key(path: &Path) -> anyhow::Result<rustls::pki_types::PrivateKeyDer<'static>> {
    let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .with_context(|| format!("{} is not PEM", path.display()))?
        .with_context(|| format!("{} holds no private key", path.display()))
}

/// A gRPC exporter's builder (spans' or metrics') configured with `export`: its endpoint,
/// timeout, metadata, compression and TLS.
pub(super) fn grpc_builder<B: WithExportConfig + WithTonicConfig>(
    builder: B,
    export: &Export,
    signal: &str,
) -> anyhow::Result<B> {
    warn_of_env_gzip(export, signal);
    let mut b = builder
        .with_endpoint(export.endpoint.clone())
        .with_timeout(export.timeout)
        .with_interceptor(Metadata::of(export)?);
    if export.gzip {
        b = b.with_compression(opentelemetry_otlp::Compression::Gzip);
    }
    if let Some(tls) = grpc_tls(export)? {
        b = b.with_tls_config(tls);
    }
    Ok(b)
}

/// An OTLP/HTTP exporter's builder (spans' or metrics') configured with `export`: its
/// URL, timeout, encoding, compression and the client ([`ExportClient`]) on `runtime`.
pub(super) fn http_builder<B: WithExportConfig + WithHttpConfig>(
    builder: B,
    export: &Export,
    signal: &str,
) -> anyhow::Result<B> {
    warn_of_env_gzip(export, signal);
    let mut b = builder
        .with_endpoint(export.endpoint.clone())
        .with_timeout(export.timeout)
        .with_protocol(otlp_protocol(export.protocol))
        .with_http_client(ExportClient::new(
            export,
            tokio::runtime::Handle::current(),
        )?);
    if export.gzip {
        b = b.with_compression(opentelemetry_otlp::Compression::Gzip);
    }
    Ok(b)
}

/// Says so when the file turned compression off (`compression = "none"`) over a variable
/// that turns it on: the crate's exporters (gRPC, HTTP/JSON, and every metrics export)
/// read `OTEL_EXPORTER_OTLP_[SIGNAL_]COMPRESSION` themselves and cannot be told "none",
/// so theirs stays gzip. (The OTLP/HTTP protobuf span exporter is oncely's and does as
/// the file says.)
fn warn_of_env_gzip(export: &Export, signal: &str) {
    if let Some(var) = &export.overridden_gzip {
        tracing::warn!(
            variable = %var,
            signal = %signal,
            "the file's compression = \"none\" cannot override {var}=gzip for this \
             exporter (the OpenTelemetry crate reads it itself): its exports stay gzip"
        );
    }
}

pub(super) fn otlp_protocol(p: Protocol) -> opentelemetry_otlp::Protocol {
    match p {
        Protocol::Grpc => opentelemetry_otlp::Protocol::Grpc,
        Protocol::HttpProtobuf => opentelemetry_otlp::Protocol::HttpBinary,
        Protocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
    }
}

/// The gRPC channel's TLS for an `https://` endpoint, or one with a CA or a client
/// identity: the system's roots (tonic's native roots), the export's CA besides them,
/// and its client identity.
pub(super) fn grpc_tls(
    export: &Export,
) -> anyhow::Result<Option<opentelemetry_otlp::tonic_types::transport::ClientTlsConfig>> {
    use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
    let https = export.endpoint.starts_with("https://");
    if !https && export.certificate.is_none() && export.client_identity.is_none() {
        return Ok(None);
    }
    let mut tls = ClientTlsConfig::new().with_enabled_roots();
    if let Some(ca) = &export.certificate {
        let pem = std::fs::read(ca).with_context(|| {
            format!(
                "OTEL_EXPORTER_OTLP_CERTIFICATE: cannot read {}",
                ca.display()
            )
        })?;
        tls = tls.ca_certificate(Certificate::from_pem(pem));
    }
    if let Some((key, cert)) = &export.client_identity {
        let key = std::fs::read(key).with_context(|| {
            format!(
                "OTEL_EXPORTER_OTLP_CLIENT_KEY: cannot read {}",
                key.display()
            )
        })?;
        let cert = std::fs::read(cert).with_context(|| {
            format!(
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: cannot read {}",
                cert.display()
            )
        })?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(Some(tls))
}

/// The resolved headers as gRPC metadata, set last on each export (over what the crate
/// read from `OTEL_EXPORTER_OTLP_HEADERS` itself), so the file's value wins.
#[derive(Clone)]
pub(super) struct Metadata(
    Vec<(
        tonic::metadata::MetadataKey<tonic::metadata::Ascii>,
        tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    )>,
);

impl Metadata {
    pub(super) fn of(export: &Export) -> anyhow::Result<Metadata> {
        let mut out = Vec::new();
        for (k, v) in &export.headers {
            let key = k.parse().with_context(|| {
                format!("OTEL_EXPORTER_OTLP_HEADERS: {k:?} is not a gRPC metadata key")
            })?;
            let value = v.parse().with_context(|| {
                format!("OTEL_EXPORTER_OTLP_HEADERS: the value of {k:?} is not valid gRPC metadata")
            })?;
            out.push((key, value));
        }
        Ok(Metadata(out))
    }
}

impl tonic::service::Interceptor for Metadata {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        for (k, v) in &self.0 {
            req.metadata_mut().insert(k.clone(), v.clone());
        }
        Ok(req)
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (mut parts, body) = request.into_parts();
        for (name, value) in &self.headers {
            parts.headers.insert(name.clone(), value.clone());
        }
        let request = Request::from_parts(parts, Full::new(body));
        let client = self.client.clone();
        let limit = self.timeout;
        let sent = self.handle.spawn(async move {
            tokio::time::timeout(limit, async move {
                let response = client.request(request).await?;
                let (parts, body) = response.into_parts();
                let body = Limited::new(body, MAX_ANSWER)
                    .collect()
                    .await
                    .map_err(|e| -> HttpError { e })?
                    .to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            })
            .await
            .map_err(|_| -> HttpError {
                format!("the collector did not answer within {limit:?}").into()
            })?
        });
        sent.await.map_err(|e| -> HttpError { Box::new(e) })?
    }
}
