//! The client a guarded exchange is sent with (feature `client`): `oncely_http::client`
//! (the system's roots, `upstream_ca`, `ONCELY_EXTRA_CA_FILE`), its failures told apart
//! as the guard needs them. This is the only place a failed send is classified: a
//! connection that was never made (refused, DNS, TLS handshake) is
//! [`UpstreamError::BeforeSend`], anything later [`UpstreamError::AfterSend`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::{BoxFuture, FutureExt};
use http::{Request, Response};
use http_body_util::BodyExt;
use oncely_http::client::{error_chain, ClientError, ClientOptions, PooledClient};

use crate::guard::UpstreamError;
use crate::{BoxBody, BoxError};

/// The pooled HTTP/HTTPS client every upstream call goes through. Cheap to clone.
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    client: PooledClient<BoxBody>,
}

impl UpstreamClient {
    /// A client for `options`; a CA file that cannot be used is an error.
    pub fn new(options: &ClientOptions) -> Result<UpstreamClient, ClientError> {
        Ok(UpstreamClient {
            client: oncely_http::client::upstream_client(options)?,
        })
    }

    /// A client for `options`, without the CA files (and a warning) when they cannot be
    /// used.
    pub fn or_warn(options: &ClientOptions) -> UpstreamClient {
        UpstreamClient {
            client: oncely_http::client::upstream_client_or_warn(options),
        }
    }

    /// Sends one request to its URI, as it is. A boxed future (not an `async fn`), so
    /// that callers' futures stay `Send` for every lifetime of the boxed error type
    /// (rust-lang/rust#64552).
    pub fn send(
        &self,
        req: Request<BoxBody>,
    ) -> BoxFuture<'static, Result<Response<BoxBody>, UpstreamError>> {
        Box::pin(self.client.request(req).map(|result| match result {
            Ok(res) => Ok(res.map(|b| b.map_err(BoxError::from).boxed())),
            Err(e) => {
                let text = error_chain(&e);
                Err(if e.is_connect() {
                    UpstreamError::BeforeSend(text)
                } else {
                    UpstreamError::AfterSend(text)
                })
            }
        }))
    }

    /// This client as a service that sends each request to its own URI, with the
    /// headers a proxy forwards both ways (no hop-by-hop header, no `Host`), for a
    /// service that has no proxy of its own in front of its upstream. Its errors are
    /// [`UpstreamError`]s.
    pub fn direct(&self) -> Direct {
        Direct(self.clone())
    }
}

/// [`UpstreamClient::direct`].
#[derive(Clone, Debug)]
pub struct Direct(UpstreamClient);

impl tower::Service<Request<BoxBody>> for Direct {
    type Response = Response<BoxBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<BoxBody>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<BoxBody>) -> Self::Future {
        let client = self.0.clone();
        crate::headers::forwardable_request(req.headers_mut());
        Box::pin(async move {
            let mut res = client.send(req).await?;
            crate::headers::strip_hop_by_hop(res.headers_mut());
            Ok(res)
        })
    }
}
