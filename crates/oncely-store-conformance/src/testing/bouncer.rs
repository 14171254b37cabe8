//! A throwaway PgBouncer in front of a PostgreSQL server, in session or transaction
//! pooling mode, on a free port of 127.0.0.1; every database name is passed on to the
//! server. It runs as the servers' user (PgBouncer refuses root) and is killed when
//! dropped.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, is_root, server_dir};

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection, for the client's whole session.
    Session,
    /// A server connection per transaction: no session state, no `LISTEN`.
    Transaction,
}

impl PoolMode {
    fn name(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer.
#[derive(Debug)]
pub struct PgBouncer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

impl PgBouncer {
    /// Starts one in `mode` before the server of `server_url` (its first host and port),
    /// trusting every client (`auth_type = trust`, user `postgres`).
    pub fn start(server_url: &str, mode: PoolMode) -> PgBouncer {
        let config: tokio_postgres::Config = server_url.parse().expect("a PostgreSQL URL");
        let server_port = config.get_ports().first().copied().unwrap_or(5432);
        let program = program();
        let dir = server_dir("oncely-pgbouncer");
        let users = dir.join("users.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n").expect("write users.txt");
        for _ in 0..5 {
            let port = free_port();
            let ini = dir.join("pgbouncer.ini");
            std::fs::write(
                &ini,
                format!(
                    "[databases]\n* = host=127.0.0.1 port={server_port}\n\n[pgbouncer]\n\
                     listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                     auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n\
                     max_client_conn = 1000\ndefault_pool_size = 100\n\
                     logfile = {log}\nadmin_users = postgres\n",
                    users = users.display(),
                    mode = mode.name(),
                    log = dir.join("pgbouncer.log").display(),
                ),
            )
            .expect("write pgbouncer.ini");
            let mut cmd = Command::new(&program);
            cmd.arg(&ini).stdout(Stdio::null()).stderr(Stdio::null());
            if is_root() {
                let (uid, gid) = server_user_ids();
                cmd.uid(uid).gid(gid);
            }
            let mut child = cmd.spawn().expect("run pgbouncer");
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return PgBouncer { port, dir, child };
                }
                if child.try_wait().ok().flatten().is_some() || Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!(
            "pgbouncer did not start: {}",
            std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default()
        );
    }

    /// The URL of `database` through this PgBouncer.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The pgbouncer program: on PATH or in /usr/sbin, else installed with apt when root.
fn program() -> PathBuf {
    let find = || {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain([PathBuf::from("/usr/sbin")])
            .map(|d| d.join("pgbouncer"))
            .find(|p| p.is_file())
    };
    if let Some(p) = find() {
        return p;
    }
    // Tests run as processes side by side: while another one's apt-get holds dpkg's
    // lock, this one's fails at once, so it tries again until the program is there.
    for _ in 0..60 {
        if !is_root() {
            break;
        }
        let _ = Command::new("apt-get")
            .args(["install", "-y", "-qq", "pgbouncer"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(p) = find() {
            return p;
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    find().expect("pgbouncer is not installed (apt-get install pgbouncer)")
}

/// The uid and gid of the `postgres` user.
fn server_user_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run id");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the postgres user exists")
    };
    (id("-u"), id("-g"))
}
