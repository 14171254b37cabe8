//! Logging: tracing-subscriber on standard error, text by default, or one JSON object a
//! line with the event's fields at the top level (`record`, `route`, `principal`,
//! `status`, `attempt`, `workflow_id`, `upstream_status`, `provider_request_id`,
//! `duration_ms`). `RUST_LOG` filters as usual (default `info`).

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global subscriber; a second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}
