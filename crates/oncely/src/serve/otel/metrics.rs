//! Metrics over OTLP: the SDK's meter provider with a periodic reader and the OTLP metric
//! exporter of the configured protocol.

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;

use crate::config::telemetry::{Export, Telemetry};
use crate::config::tracing::Protocol;

/// The running metrics export.
pub struct MetricsExport {
    provider: SdkMeterProvider,
}

impl MetricsExport {
    /// Starts exporting every `metrics_interval`.
    pub(super) fn start(
        telemetry: &Telemetry,
        export: &Export,
        resource: &Resource,
    ) -> anyhow::Result<MetricsExport> {
        let builder = opentelemetry_otlp::MetricExporter::builder();
        let exporter = match export.protocol {
            Protocol::Grpc => {
                let mut b = builder
                    .with_tonic()
                    .with_endpoint(export.endpoint.clone())
                    .with_timeout(export.timeout)
                    .with_interceptor(super::transport::Metadata::of(export)?);
                if export.gzip {
                    b = b.with_compression(opentelemetry_otlp::Compression::Gzip);
                }
                if let Some(tls) = super::transport::grpc_tls(export)? {
                    b = b.with_tls_config(tls);
                }
                b.build()
            }
            Protocol::HttpProtobuf | Protocol::HttpJson => {
                let mut b = builder
                    .with_http()
                    .with_endpoint(export.endpoint.clone())
                    .with_timeout(export.timeout)
                    .with_protocol(super::transport::otlp_protocol(export.protocol))
                    .with_http_client(super::transport::ExportClient::new(
                        export,
                        tokio::runtime::Handle::current(),
                    )?);
                if export.gzip {
                    b = b.with_compression(opentelemetry_otlp::Compression::Gzip);
                }
                b.build()
            }
        }
        .context("the OTLP metric exporter")?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(telemetry.metrics_interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(reader)
            .build();
        Ok(MetricsExport { provider })
    }

    /// The meter oncely's instruments are made with.
    pub fn meter(&self) -> opentelemetry::metrics::Meter {
        use opentelemetry::metrics::MeterProvider as _;
        self.provider.meter("oncely")
    }

    /// Exports once more and stops (blocking: called off the runtime).
    pub(super) fn stop(self, limit: Duration) {
        let _ = self.provider.shutdown_with_timeout(limit);
    }
}
