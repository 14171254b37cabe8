//! PostgreSQL over TLS through the real binary, as libpq's `sslmode` says: each test
//! starts a PostgreSQL server of its own that accepts TLS only (`hostssl` lines, and
//! `hostnossl ... reject`), with a certificate from a throwaway CA made here, and runs
//! `oncely migrate --store URL` and `oncely serve --store URL` against it.
//!
//! - `require` and `prefer` connect (no certificate check); `disable` is refused by the
//!   server; `require` with `sslrootcert` checks the chain (libpq's rule).
//! - `verify-ca` trusts the CA `sslrootcert` names (not the host name); another CA, or
//!   the system's roots, is refused with a line that names the certificate problem.
//! - `verify-full` checks the host name or IP as well.
//! - `sslcert`/`sslkey` are presented to a server that authenticates by certificate.
//! - SCRAM over TLS binds the channel (`channel_binding=require` works).
//!
//! The server is configured after it started: `ALTER SYSTEM` turns `ssl` on and the
//! `pg_hba.conf` written here allows TLS only; a reload applies both. The test itself
//! keeps talking to the server over its Unix socket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use axum::routing::post;
use oncely_store_conformance::testing::PgServer;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

use crate::common::{oncely, post as http_post, stderr, stdout, upstream, Gateway};

/// A CA made for one test, and the certificates it signs.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A certificate (PEM) and its key (PEM) for `names`, with `common_name`.
    fn issue(&self, common_name: &str, names: &[&str]) -> (String, String) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }
}

/// A PostgreSQL server that accepts TLS connections only, and the client-side files.
struct TlsServer {
    /// Stopped and removed when dropped.
    _pg: PgServer,
    port: u16,
    socket_dir: String,
    /// The client's files: `ca.pem` (the server's CA), `other-ca.pem`, `client.pem` and
    /// `client.key` (a client certificate for user `postgres`, signed by the CA), and
    /// `stranger.pem` and `stranger.key` (one for `postgres` signed by the other CA).
    files: tempfile::TempDir,
}

/// The user that authenticates with a SCRAM password (over TLS).
const PW_USER: &str = "oncely_pw";
const PW_PASSWORD: &str = "pw-secret-7";

impl TlsServer {
    /// Starts one whose certificate, signed by a CA of its own, names `server_names`.
    async fn start(server_names: &[&str]) -> TlsServer {
        let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
        let port: u16 = pg
            .url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {}", pg.url));
        let (plain, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
            .await
            .expect("connect before TLS is required");
        tokio::spawn(connection);
        let show = |name: &'static str| {
            let client = &plain;
            async move {
                let row = client.query_one(&format!("SHOW {name}"), &[]).await;
                row.unwrap().get::<_, String>(0)
            }
        };
        let data = PathBuf::from(show("data_directory").await);
        let socket_dir = show("unix_socket_directories").await;

        let ca = Ca::new("oncely test CA");
        let other = Ca::new("some other CA");
        let (server_cert, server_key) = ca.issue("oncely test server", server_names);
        let (client_cert, client_key) = ca.issue("postgres", &[]);
        let (stranger_cert, stranger_key) = other.issue("postgres", &[]);
        // The server's files go into its data directory, owned by the server's user
        // (PostgreSQL refuses a key that others can read).
        let owner = std::fs::metadata(&data).unwrap();
        for (name, text) in [
            ("server.crt", &server_cert),
            ("server.key", &server_key),
            ("client-ca.crt", &ca.pem()),
        ] {
            let path = data.join(name);
            std::fs::write(&path, text).unwrap();
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid())).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let files = tempfile::tempdir().unwrap();
        std::fs::write(files.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(files.path().join("other-ca.pem"), other.pem()).unwrap();
        std::fs::write(files.path().join("client.pem"), &client_cert).unwrap();
        std::fs::write(files.path().join("client.key"), &client_key).unwrap();
        std::fs::write(files.path().join("stranger.pem"), &stranger_cert).unwrap();
        std::fs::write(files.path().join("stranger.key"), &stranger_key).unwrap();

        let d = data.display();
        for sql in [
            "ALTER SYSTEM SET ssl = on".to_string(),
            format!("ALTER SYSTEM SET ssl_cert_file = '{d}/server.crt'"),
            format!("ALTER SYSTEM SET ssl_key_file = '{d}/server.key'"),
            format!("ALTER SYSTEM SET ssl_ca_file = '{d}/client-ca.crt'"),
            "CREATE DATABASE oncely_cert".to_string(),
            format!("CREATE ROLE {PW_USER} LOGIN PASSWORD '{PW_PASSWORD}'"),
            format!("CREATE DATABASE {PW_USER} OWNER {PW_USER}"),
        ] {
            plain.batch_execute(&sql).await.unwrap();
        }
        // TLS only: `cert` authentication for database oncely_cert, SCRAM for the
        // password user, trust for the rest; nothing without TLS but the socket.
        std::fs::write(
            data.join("pg_hba.conf"),
            format!(
                "local all all trust\n\
                 hostnossl all all 0.0.0.0/0 reject\n\
                 hostssl oncely_cert all 127.0.0.1/32 cert\n\
                 hostssl all {PW_USER} 127.0.0.1/32 scram-sha-256\n\
                 hostssl all all 127.0.0.1/32 trust\n"
            ),
        )
        .unwrap();
        plain
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .unwrap();
        drop(plain);

        let server = TlsServer {
            _pg: pg,
            port,
            socket_dir,
            files,
        };
        // The reload is applied once a plain TCP connection is refused.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match tokio_postgres::connect(&server.url("127.0.0.1", ""), tokio_postgres::NoTls).await
            {
                Err(e)
                    if e.as_db_error()
                        .is_some_and(|db| db.message().contains("no encryption")) =>
                {
                    break
                }
                other if Instant::now() > deadline => {
                    panic!("the server still accepts plain TCP: {:?}", other.err())
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let ssl = server.query_one("SHOW ssl").await;
        assert_eq!(ssl, "on", "the server did not turn TLS on");
        server
    }

    /// `postgres://postgres@HOST:PORT/oncely_test?PARAMS`.
    fn url(&self, host: &str, params: &str) -> String {
        self.url_for("postgres", host, "oncely_test", params)
    }

    /// `postgres://USERINFO@HOST:PORT/DB?PARAMS`.
    fn url_for(&self, userinfo: &str, host: &str, db: &str, params: &str) -> String {
        let sep = if params.is_empty() { "" } else { "?" };
        format!(
            "postgres://{userinfo}@{host}:{}/{db}{sep}{params}",
            self.port
        )
    }

    /// A client file's path.
    fn file(&self, name: &str) -> String {
        self.files.path().join(name).display().to_string()
    }

    /// A connection over the Unix socket (no TLS needed there).
    async fn socket(&self) -> tokio_postgres::Client {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(&self.socket_dir)
            .port(self.port)
            .user("postgres")
            .dbname("oncely_test");
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    async fn query_one(&self, sql: &str) -> String {
        let client = self.socket().await;
        client.query_one(sql, &[]).await.unwrap().get(0)
    }
}

/// Runs the binary with `args`, killed after 60 s.
fn run_bounded(args: &[&str]) -> Output {
    let child = oncely()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("oncely {args:?} did not finish within 60s");
        }
    }
}

async fn migrate(url: &str) -> Output {
    let args = ["migrate", "--store", url].map(str::to_owned);
    tokio::task::spawn_blocking(move || run_bounded(&args.each_ref().map(String::as_str)))
        .await
        .unwrap()
}

/// `oncely migrate --store URL` succeeds.
#[track_caller]
fn assert_migrated(o: &Output, url: &str) {
    assert_eq!(o.status.code(), Some(0), "{url}: {}", stderr(o));
    assert!(stdout(o).contains("up to date"), "{}", stdout(o));
}

/// Exit 2 with one line on stderr that contains every one of `needles`.
#[track_caller]
fn assert_refused(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    eprintln!("refused: {err}");
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err:?}"
    );
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in {err:?}");
    }
}

/// `oncely serve --store URL` that cannot open its store: exit 2, one line.
async fn serve_refused(url: &str) -> Output {
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        "http://127.0.0.1:9",
        "--store",
        url,
    ]
    .map(str::to_owned);
    tokio::task::spawn_blocking(move || run_bounded(&args.each_ref().map(String::as_str)))
        .await
        .unwrap()
}

/// An upstream that answers `POST /v1/render` with a count of its executions.
async fn render_upstream() -> SocketAddr {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    upstream(axum::Router::new().route(
        "/v1/render",
        post(move |body: String| {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move { format!("render #{n}: {body}") }
        }),
    ))
    .await
}

/// `oncely serve --store URL` records a guarded request in the ledger (a repeat is
/// replayed), and every connection it holds is encrypted and named `oncely`.
async fn assert_serves(server: &TlsServer, url: &str) {
    let up = render_upstream().await;
    let up = format!("http://{up}");
    let url_owned = url.to_owned();
    let gw = tokio::task::spawn_blocking(move || {
        Gateway::start(&["--upstream", &up, "--store", &url_owned], &[])
    })
    .await
    .unwrap();
    let auth = [("authorization", "Bearer sk_tls")];
    let first = http_post(&gw.url("/v1/render"), "chapter 1", &auth).await;
    assert_eq!(first.status, 200, "{url}: {}", first.text());
    assert_eq!(first.header("oncely-status"), "fresh");
    let again = http_post(&gw.url("/v1/render"), "chapter 1", &auth).await;
    assert_eq!(again.header("oncely-status"), "replayed", "{url}");
    assert_eq!(again.body, first.body);
    let record = first.header("oncely-record").to_owned();
    let client = server.socket().await;
    let db = url
        .split('/')
        .nth(3)
        .and_then(|rest| rest.split('?').next())
        .unwrap()
        .to_owned();
    // The record is in the ledger of the database the URL names.
    let mut config = tokio_postgres::Config::new();
    config
        .host_path(&server.socket_dir)
        .port(server.port)
        .user("postgres")
        .dbname(&db);
    let (ledger, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let stored: i64 = ledger
        .query_one(
            "SELECT count(*) FROM records WHERE id = $1 AND state = 'completed'",
            &[&record],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1, "{url}: the record is in the ledger");
    let rows = client
        .query(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s \
             USING (pid) WHERE a.datname = $1 AND a.client_addr IS NOT NULL",
            &[&db],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty(), "{url}: no connection of the gateway");
    for row in rows {
        let (name, ssl): (String, bool) = (row.get(0), row.get(1));
        assert_eq!(name, "oncely", "{url}");
        assert!(ssl, "{url}: a plain connection");
    }
    let status = gw.terminate();
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_and_prefer_encrypt_and_disable_is_refused_by_a_tls_only_server() {
    let server = TlsServer::start(&["localhost", "127.0.0.1"]).await;
    for mode in ["require", "prefer"] {
        let url = server.url("127.0.0.1", &format!("sslmode={mode}"));
        assert_migrated(&migrate(&url).await, &url);
    }
    // prefer is the default.
    let url = server.url("127.0.0.1", "");
    assert_migrated(&migrate(&url).await, &url);
    // Neither checks the certificate: a CA the client does not know is fine.
    assert_serves(&server, &server.url("127.0.0.1", "sslmode=require")).await;

    let url = server.url("127.0.0.1", "sslmode=disable");
    let o = migrate(&url).await;
    assert_refused(&o, &["no encryption", "cannot open store"]);
    assert_refused(&serve_refused(&url).await, &["no encryption"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_trusts_the_named_ca_and_refuses_any_other() {
    let server = TlsServer::start(&["localhost", "127.0.0.1"]).await;
    let ca = server.file("ca.pem");
    let url = server.url("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca}"));
    assert_migrated(&migrate(&url).await, &url);
    assert_serves(&server, &url).await;
    // verify-ca does not check the host name: reached as db.example, it still connects.
    let url = server.url_for(
        "postgres",
        "db.example",
        "oncely_test",
        &format!("hostaddr=127.0.0.1&sslmode=verify-ca&sslrootcert={ca}"),
    );
    assert_migrated(&migrate(&url).await, &url);

    // Another CA: refused by migrate and by serve, naming the problem.
    let other = server.file("other-ca.pem");
    for url in [
        server.url(
            "127.0.0.1",
            &format!("sslmode=verify-ca&sslrootcert={other}"),
        ),
        // libpq's rule: require with a root certificate file checks the chain too.
        server.url("127.0.0.1", &format!("sslmode=require&sslrootcert={other}")),
    ] {
        let o = migrate(&url).await;
        assert_refused(&o, &["certificate is not trusted", "UnknownIssuer", &other]);
        let o = serve_refused(&url).await;
        assert_refused(&o, &["certificate is not trusted", "UnknownIssuer"]);
    }
    // Without sslrootcert the system's roots are used, and they do not hold the test CA.
    let url = server.url("127.0.0.1", "sslmode=verify-ca");
    let o = migrate(&url).await;
    assert_refused(&o, &["certificate is not trusted", "system"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_checks_the_host_name_or_ip_as_well() {
    let server = TlsServer::start(&["localhost", "127.0.0.1"]).await;
    let ca = server.file("ca.pem");
    let params = format!("sslmode=verify-full&sslrootcert={ca}");
    for host in ["127.0.0.1", "localhost"] {
        let url = server.url(host, &params);
        assert_migrated(&migrate(&url).await, &url);
    }
    assert_serves(&server, &server.url("127.0.0.1", &params)).await;

    // Reached as db.example (at 127.0.0.1), a name the certificate does not hold.
    let url = server.url_for(
        "postgres",
        "db.example",
        "oncely_test",
        &format!("hostaddr=127.0.0.1&{params}"),
    );
    let o = migrate(&url).await;
    assert_refused(&o, &["certificate does not name", "db.example"]);
    let o = serve_refused(&url).await;
    assert_refused(&o, &["certificate does not name", "db.example"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_an_ip_the_certificate_does_not_hold() {
    // A certificate only for db.example, reached at 127.0.0.1.
    let server = TlsServer::start(&["db.example"]).await;
    let ca = server.file("ca.pem");
    let url = server.url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let o = migrate(&url).await;
    assert_refused(&o, &["certificate does not name", "127.0.0.1"]);
    // By the name it holds, it connects.
    let url = server.url_for(
        "postgres",
        "db.example",
        "oncely_test",
        &format!("hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={ca}"),
    );
    assert_migrated(&migrate(&url).await, &url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_to_a_server_that_authenticates_by_certificate() {
    let server = TlsServer::start(&["localhost", "127.0.0.1"]).await;
    let (ca, cert, key) = (
        server.file("ca.pem"),
        server.file("client.pem"),
        server.file("client.key"),
    );
    let url = server.url_for(
        "postgres",
        "127.0.0.1",
        "oncely_cert",
        &format!("sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}"),
    );
    assert_migrated(&migrate(&url).await, &url);
    assert_serves(&server, &url).await;
    // Without one, the server refuses.
    let url = server.url_for(
        "postgres",
        "127.0.0.1",
        "oncely_cert",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let o = migrate(&url).await;
    assert_refused(&o, &["requires a valid client certificate"]);
    // One the server's CA did not sign is refused in the handshake.
    let (stranger, stranger_key) = (server.file("stranger.pem"), server.file("stranger.key"));
    let url = server.url_for(
        "postgres",
        "127.0.0.1",
        "oncely_cert",
        &format!("sslmode=verify-full&sslrootcert={ca}&sslcert={stranger}&sslkey={stranger_key}"),
    );
    let o = migrate(&url).await;
    assert_refused(
        &o,
        &["the server refused the client certificate", &stranger],
    );
    // A certificate without its key is a bad URL.
    let url = server.url_for(
        "postgres",
        "127.0.0.1",
        "oncely_cert",
        &format!("sslmode=require&sslcert={cert}"),
    );
    assert_refused(&migrate(&url).await, &["sslkey"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_over_tls_binds_the_channel_and_is_never_shown() {
    let server = TlsServer::start(&["localhost", "127.0.0.1"]).await;
    let url = server.url_for(
        &format!("{PW_USER}:{PW_PASSWORD}"),
        "127.0.0.1",
        PW_USER,
        "sslmode=require&channel_binding=require",
    );
    let o = migrate(&url).await;
    assert_migrated(&o, &url);
    assert!(!stdout(&o).contains(PW_PASSWORD), "{}", stdout(&o));
    assert_serves(&server, &url).await;
    // A wrong password is refused without showing either password.
    let url = server.url_for(
        &format!("{PW_USER}:not-the-password"),
        "127.0.0.1",
        PW_USER,
        "sslmode=require",
    );
    let o = migrate(&url).await;
    assert_refused(&o, &["password authentication failed"]);
    assert!(!stderr(&o).contains("not-the-password"), "{}", stderr(&o));
    // The password in the URL's parameters is hidden as well.
    let url = server.url_for(
        PW_USER,
        "127.0.0.1",
        PW_USER,
        "sslmode=require&password=not-the-password",
    );
    let o = migrate(&url).await;
    assert_refused(&o, &["password authentication failed"]);
    assert!(!stderr(&o).contains("not-the-password"), "{}", stderr(&o));
}
