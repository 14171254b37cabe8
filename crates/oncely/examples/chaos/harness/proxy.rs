//! The fault proxy between the gateway and the upstream (TCP on 127.0.0.1). Faults are
//! armed by the injector and each one hits the next request that starts on any
//! connection: a delay before the request is passed on, a reset before it is passed on
//! (the upstream never sees it), a reset after it was passed on (the upstream runs it, the
//! gateway never hears the answer), a slow answer (the first 64 KiB trickle), or a stalled
//! answer (held longer than the route's timeout). Each fault is journalled with the
//! downstream key of the request it hit.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::journal::Journal;
use super::Fault;

/// One armed fault.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ProxyFault {
    Delay(Duration),
    ResetBefore,
    /// Passes the request on, waits this long, then resets the gateway's connection.
    ResetAfter(Duration),
    /// Passes the first 64 KiB of the answer 1 KiB at a time with this pause.
    Slow(Duration),
    /// Holds the answer this long.
    Stall(Duration),
}

impl ProxyFault {
    pub(crate) fn kind(self) -> Fault {
        match self {
            ProxyFault::Delay(_) => Fault::ProxyDelay,
            ProxyFault::ResetBefore => Fault::ProxyResetBefore,
            ProxyFault::ResetAfter(_) => Fault::ProxyResetAfter,
            ProxyFault::Slow(_) => Fault::ProxySlow,
            ProxyFault::Stall(_) => Fault::ProxyStall,
        }
    }
}

/// The running proxy.
#[derive(Debug, Clone)]
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    armed: Arc<Mutex<VecDeque<ProxyFault>>>,
}

impl Proxy {
    /// Listens on 127.0.0.1:0 and forwards to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr, journal: Arc<Journal>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let proxy = Proxy {
            addr: listener.local_addr().expect("proxy address"),
            armed: Arc::default(),
        };
        let armed = proxy.armed.clone();
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let armed = armed.clone();
                let journal = journal.clone();
                tokio::spawn(async move {
                    let _ = relay(conn, upstream, armed, journal).await;
                });
            }
        });
        proxy
    }

    /// The next request to start gets this fault.
    pub(crate) fn arm(&self, fault: ProxyFault) {
        let mut armed = self.armed.lock().expect("proxy lock");
        // Faults nobody used yet do not pile up while the gateway is idle.
        if armed.len() < 4 {
            armed.push_back(fault);
        }
    }

    /// Drops the faults not used yet.
    pub(crate) fn disarm(&self) {
        self.armed.lock().expect("proxy lock").clear();
    }
}

fn is_request_start(chunk: &[u8]) -> bool {
    [&b"POST "[..], b"GET ", b"PUT ", b"PATCH ", b"DELETE "]
        .iter()
        .any(|m| chunk.starts_with(m))
}

/// The `Idempotency-Key` of a request head, if the chunk holds it.
fn key_of(chunk: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(chunk);
    let lower = text.to_ascii_lowercase();
    let at = lower.find("\r\nidempotency-key:")? + "\r\nidempotency-key:".len();
    let end = lower[at..].find("\r\n").map_or(lower.len(), |e| at + e);
    Some(text[at..end].trim().to_owned())
}

enum Answering {
    Normal,
    Slow { pause: Duration, left: usize },
    Stall(Duration),
}

async fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    armed: Arc<Mutex<VecDeque<ProxyFault>>>,
    journal: Arc<Journal>,
) -> std::io::Result<()> {
    // Dropping the gateway's side is a reset, not a clean close.
    client.set_zero_linger()?;
    let mut up = TcpStream::connect(upstream).await?;
    let mut from_client = vec![0u8; 64 * 1024];
    let mut from_up = vec![0u8; 64 * 1024];
    let mut answering = Answering::Normal;
    loop {
        tokio::select! {
            r = client.read(&mut from_client) => {
                let n = r?;
                if n == 0 {
                    return Ok(());
                }
                let chunk = &from_client[..n];
                if is_request_start(chunk) {
                    answering = Answering::Normal;
                    let fault = armed.lock().expect("proxy lock").pop_front();
                    if let Some(fault) = fault {
                        journal.fault(fault.kind(), key_of(chunk), format!("{fault:?}"));
                        match fault {
                            ProxyFault::Delay(d) => tokio::time::sleep(d).await,
                            ProxyFault::ResetBefore => return Ok(()),
                            ProxyFault::ResetAfter(d) => {
                                up.write_all(chunk).await?;
                                tokio::time::sleep(d).await;
                                return Ok(());
                            }
                            ProxyFault::Slow(pause) => {
                                answering = Answering::Slow { pause, left: 64 * 1024 };
                            }
                            ProxyFault::Stall(d) => answering = Answering::Stall(d),
                        }
                    }
                }
                up.write_all(chunk).await?;
            }
            r = up.read(&mut from_up) => {
                let n = r?;
                if n == 0 {
                    return Ok(());
                }
                let mut chunk = &from_up[..n];
                match &mut answering {
                    Answering::Normal => {}
                    Answering::Stall(d) => {
                        tokio::time::sleep(*d).await;
                        answering = Answering::Normal;
                    }
                    Answering::Slow { pause, left } => {
                        while *left > 0 && !chunk.is_empty() {
                            let piece = chunk.len().min(1024).min(*left);
                            client.write_all(&chunk[..piece]).await?;
                            chunk = &chunk[piece..];
                            *left -= piece;
                            tokio::time::sleep(*pause).await;
                        }
                    }
                }
                client.write_all(chunk).await?;
            }
        }
    }
}
