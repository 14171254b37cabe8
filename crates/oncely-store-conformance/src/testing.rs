//! Test support shared by every crate's integration tests: a real
//! PostgreSQL server for the tests, and a fresh schema (or database) per test on it; a
//! primary with a synchronous streaming standby, for failovers ([`PgCluster`]); and
//! PgBouncer in front of a server ([`PgBouncer`]).
//!
//! The shared server is `ONCELY_TEST_PG_URL` (set by `scripts/test`, which starts a
//! throwaway one). Without it, on CI (`CI` set) asking for it fails the test; elsewhere
//! the test process starts its own server with `scripts/pg-env serve` and stops it when
//! it exits.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

mod bouncer;
mod cluster;

pub use bouncer::{PgBouncer, PoolMode};
pub use cluster::PgCluster;

/// A throwaway PostgreSQL server started by `scripts/pg-env serve`; stopped and removed
/// when dropped (the script stops it when its standard input closes).
#[derive(Debug)]
pub struct PgServer {
    /// `postgres://...` of its database.
    pub url: String,
    data: String,
    bin: String,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl PgServer {
    /// Starts one (installing PostgreSQL with apt when it is missing, as the script does).
    pub fn start() -> PgServer {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pg-env");
        let mut child = Command::new("bash")
            .arg(script)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Not inherited: the server outlives the test's own output streams.
            .stderr(Stdio::piped())
            .spawn()
            .expect("run scripts/pg-env serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the server's URL");
        let mut parts = line.split_whitespace().map(str::to_string);
        let (Some(url), Some(data), Some(bin)) = (parts.next(), parts.next(), parts.next()) else {
            let mut why = String::new();
            if let Some(mut err) = child.stderr.take() {
                let _ = err.read_to_string(&mut why);
            }
            panic!("scripts/pg-env serve did not start PostgreSQL: {why}");
        };
        let stdin = child.stdin.take();
        PgServer {
            url,
            data,
            bin,
            child,
            stdin,
        }
    }

    /// Stops the server (its data stays), as an outage would.
    pub fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "stop"]);
    }

    /// Starts it again on the same data and port.
    pub fn start_again(&self) {
        self.pg_ctl(&["start"]);
    }

    /// Freezes the server (SIGSTOP to the postmaster and every backend), as a paused VM
    /// or a stalled host would: its connections stay open, and nothing answers on them.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a [`PgServer::pause`]d server run on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        signal_server(std::path::Path::new(&self.data), sig);
    }

    /// Runs `pg_ctl ARGS` on this server's data directory as the server's user.
    fn pg_ctl(&self, args: &[&str]) {
        let mut cmd = as_server_user(&format!("{}/pg_ctl", self.bin));
        let log = format!("{}/../server.log", self.data);
        let status = cmd
            .args(["-D", &self.data, "-l", &log, "-w"])
            .args(args)
            .stdout(Stdio::null())
            .status()
            .expect("run pg_ctl");
        assert!(status.success(), "pg_ctl {args:?} failed");
    }
}

/// Sends `sig` to every process of the server whose data directory is `data`: the
/// backends first (their parent still runs), then the postmaster.
fn signal_server(data: &std::path::Path, sig: &str) {
    let pid_file = data.join("postmaster.pid");
    let text = std::fs::read_to_string(&pid_file).expect("postmaster.pid");
    let postmaster = text.lines().next().expect("its pid").trim().to_string();
    let _ = Command::new("pkill")
        .args([sig, "-P", &postmaster])
        .status();
    let status = Command::new("kill")
        .args([sig, &postmaster])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {postmaster} failed");
}

impl Drop for PgServer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `program` run as the servers' user: `postgres` when the tests run as root (initdb,
/// the server and PgBouncer refuse root), else the current user.
fn as_server_user(program: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", program]);
        c
    } else {
        Command::new(program)
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// A new directory for a server's files, which the servers' user owns.
fn server_dir(prefix: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).expect("create a server directory");
    if is_root() {
        let status = Command::new("chown")
            .args(["postgres:", &dir.display().to_string()])
            .status()
            .expect("run chown");
        assert!(status.success(), "chown postgres: {}", dir.display());
    }
    dir
}

/// The shared test server's URL (see the module docs).
pub fn shared_pg_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    static SERVER: OnceLock<Mutex<Option<PgServer>>> = OnceLock::new();
    URL.get_or_init(|| {
        if let Some(url) = std::env::var("ONCELY_TEST_PG_URL")
            .ok()
            .filter(|u| !u.is_empty())
        {
            return url;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "ONCELY_TEST_PG_URL is unset on CI: run the tests with scripts/test, which starts \
             PostgreSQL and sets it"
        );
        let server = PgServer::start();
        let url = server.url.clone();
        // Kept for the life of the process: its stdin closes when the process exits.
        SERVER
            .get_or_init(|| Mutex::new(None))
            .lock()
            .expect("server lock")
            .replace(server);
        url
    })
    .clone()
}

/// The name of a new, empty database on the server at `base` (for poolers, which do not
/// pass a URL's `options` on, so that [`fresh_pg_schema`] cannot serve them: see
/// [`PgBouncer::url`]).
pub async fn fresh_pg_database(base: &str) -> String {
    let (client, connection) = tokio_postgres::connect(base, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {base}: {e}"));
    tokio::spawn(connection);
    let name = format!("t_{}", uuid::Uuid::now_v7().simple());
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a test database");
    name
}

/// A URL on a new, empty schema of the server at `base` (`search_path` in the URL), so
/// tests run in parallel on one database without seeing each other's rows.
pub async fn fresh_pg_schema(base: &str) -> String {
    let (client, connection) = tokio_postgres::connect(base, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {base}: {e}"));
    tokio::spawn(connection);
    let schema = format!("t_{}", uuid::Uuid::now_v7().simple());
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("create a test schema");
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-csearch_path%3D{schema}")
}
