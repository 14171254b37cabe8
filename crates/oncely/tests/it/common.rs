//! Helpers: the real binary, real upstream servers on 127.0.0.1:0, a test CA, and small
//! HTTP clients (hyper-util, plain and rustls).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The binary under test.
pub(crate) fn oncely() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_oncely"));
    c.env_remove("ONCELY_STORE")
        .env_remove("ONCELY_ADMIN_TOKEN")
        .env_remove("ONCELY_PRINCIPAL_KEY")
        .env_remove("ONCELY_SECRET_KEY")
        .env_remove("ONCELY_EXTRA_CA_FILE");
    c
}

/// Runs the binary to completion.
pub(crate) fn run(args: &[&str]) -> Output {
    oncely().args(args).output().expect("the binary runs")
}

/// Standard error as text.
pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Standard output as text.
pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts exit 2 with exactly one line on stderr containing `needle`.
#[track_caller]
pub(crate) fn assert_usage_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line expected: {err:?}");
    assert!(err.contains(needle), "{needle:?} not in {err:?}");
}

/// A running `oncely serve`.
pub(crate) struct Gateway {
    child: Child,
    /// The gateway address.
    pub(crate) addr: SocketAddr,
    /// The admin address.
    pub(crate) admin: SocketAddr,
    /// Every stderr line so far.
    pub(crate) lines: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    /// Starts `oncely serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 ARGS` and
    /// learns its ports from the first log line.
    pub(crate) fn start(args: &[&str], envs: &[(&str, &str)]) -> Gateway {
        let mut cmd = oncely();
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(args)
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("serve starts");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(i) = line.find("listening on ") {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(line[i..].to_owned());
                        }
                    }
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let first = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let out = lines.lock().unwrap().join("\n");
                panic!("serve did not start: {out}");
            }
        };
        // "listening on http://127.0.0.1:PORT (admin http://127.0.0.1:PORT2), store ..."
        let addr_after = |prefix: &str| -> SocketAddr {
            let rest = &first[first.find(prefix).unwrap() + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
                .unwrap_or(rest.len());
            rest[..end].parse().unwrap()
        };
        let addr = if first.contains("https://") {
            addr_after("https://")
        } else {
            addr_after("listening on http://")
        };
        let admin = addr_after("(admin http://");
        Gateway {
            child,
            addr,
            admin,
            lines,
        }
    }

    /// Sends SIGTERM and waits for the exit.
    pub(crate) fn terminate(mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("serve did not stop within 15s of SIGTERM");
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The URL of a path on the gateway.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The URL of a path on the admin API.
    pub(crate) fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves an axum router on 127.0.0.1:0.
pub(crate) async fn upstream(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    addr
}

/// An answer, collected.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap())
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
    }
}

/// Sends one request with a plain HTTP client.
pub(crate) async fn send(req: Request<Full<Bytes>>) -> Answer {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let res = client.request(req).await.expect("the request is answered");
    collect(res).await
}

pub(crate) async fn collect<B>(res: http::Response<B>) -> Answer
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = res.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// `GET url` with optional headers.
pub(crate) async fn get(url: &str, headers: &[(&str, &str)]) -> Answer {
    let mut b = Request::get(url);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    send(b.body(Full::new(Bytes::new())).unwrap()).await
}

/// `POST url` with a body and headers.
pub(crate) async fn post(url: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
    let mut b = Request::post(url);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    send(b.body(Full::new(Bytes::from(body.to_owned()))).unwrap()).await
}

/// A test CA and a certificate for `localhost` / 127.0.0.1 that it signed.
pub(crate) struct TestPki {
    pub(crate) ca_pem: String,
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

impl TestPki {
    pub(crate) fn new() -> TestPki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "oncely test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
        TestPki {
            ca_pem: ca.pem(),
            cert_pem: leaf.pem(),
            key_pem: leaf_key.serialize_pem(),
        }
    }

    /// Writes `ca.pem`, `cert.pem` and `key.pem` into `dir`.
    pub(crate) fn write(&self, dir: &Path) {
        std::fs::write(dir.join("ca.pem"), &self.ca_pem).unwrap();
        std::fs::write(dir.join("cert.pem"), &self.cert_pem).unwrap();
        std::fs::write(dir.join("key.pem"), &self.key_pem).unwrap();
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// A rustls server config with the leaf certificate.
    pub(crate) fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let certs = rustls_pemfile::certs(&mut self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls_pemfile::private_key(&mut self.key_pem.as_bytes())
            .unwrap()
            .unwrap();
        let mut c = rustls::ServerConfig::builder_with_provider(Self::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(c)
    }

    /// An HTTPS client that trusts only the test CA.
    pub(crate) fn client(
        &self,
    ) -> Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>> {
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pemfile::certs(&mut self.ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let tls = rustls::ClientConfig::builder_with_provider(Self::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        Client::builder(TokioExecutor::new()).build(connector)
    }
}

/// Serves an axum router over HTTPS with the test certificate on 127.0.0.1:0.
pub(crate) async fn https_upstream(pki: &TestPki, router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let router = router.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let svc = hyper_util::service::TowerToHyperService::new(router);
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

/// An upstream handler that echoes the request's headers as a JSON object (values of
/// repeated headers joined with ", ").
pub(crate) fn echo_headers() -> axum::Router {
    axum::Router::new().fallback(|req: axum::extract::Request| async move {
        let mut map = serde_json::Map::new();
        for name in req.headers().keys() {
            let joined: Vec<_> = req
                .headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap_or("").to_owned())
                .collect();
            map.insert(name.to_string(), joined.join(", ").into());
        }
        map.insert("_path".into(), req.uri().to_string().into());
        axum::Json(serde_json::Value::Object(map))
    })
}
