//! The gateway's upstream client: `oncely_http::client` (system roots, `upstream_ca`,
//! `ONCELY_EXTRA_CA_FILE`) with its failures told apart as the guard needs them. The
//! proxy, its retries, reconciliation, the trace exporter and the CLI send through it.

use std::path::Path;

use http::{Request, Response};
use oncely_http::client::{error_chain, ClientOptions};
use oncely_tower::{BoxBody, UpstreamError};

/// The pooled HTTP/HTTPS client every upstream call goes through (`oncely_http::client`).
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    client: oncely_http::client::UpstreamClient<BoxBody>,
}

impl UpstreamClient {
    /// A client trusting the system's roots, plus `extra_ca` and `$ONCELY_EXTRA_CA_FILE`.
    pub fn new(extra_ca: Option<&Path>) -> anyhow::Result<UpstreamClient> {
        let options = ClientOptions::with_extra_ca(extra_ca);
        let client = oncely_http::client::upstream_client(&options)?;
        Ok(UpstreamClient { client })
    }

    /// Sends one request; connect failures are [`UpstreamError::BeforeSend`].
    pub async fn send(
        &self,
        req: Request<BoxBody>,
    ) -> Result<Response<hyper::body::Incoming>, UpstreamError> {
        self.client.request(req).await.map_err(|e| {
            let text = error_chain(&e);
            if e.is_connect() {
                UpstreamError::BeforeSend(text)
            } else {
                UpstreamError::AfterSend(text)
            }
        })
    }
}
