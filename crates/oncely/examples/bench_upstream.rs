//! A tiny, fast upstream for `scripts/loadbench`: answers every request with the same
//! small JSON body, on 127.0.0.1, and prints its address on the first line of stdout.
//!
//! Run with: `cargo run --release -p oncely --example bench_upstream -- [PORT] [THREADS]`

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const BODY: &[u8] =
    br#"{"render_id":"rnd_001","audio_url":"http://127.0.0.1/audio/rnd_001.mp3","characters":42}"#;

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Read the request body, as a real service would.
    let _ = req.into_body().collect().await;
    Ok(Response::builder()
        .header("content-type", "application/json")
        .header("x-request-id", "req_bench")
        .body(Full::new(Bytes::from_static(BODY)))
        .expect("a valid response"))
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let threads: usize = args.next().and_then(|t| t.parse().ok()).unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        println!("{}", listener.local_addr()?);
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(answer))
                    .await;
            });
        }
    })
}
