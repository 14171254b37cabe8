//! A throwaway PostgreSQL primary with a streaming standby that it replicates to
//! synchronously (`synchronous_standby_names = '*'`), both on 127.0.0.1, for failover
//! tests: kill the primary's postmaster, promote the standby, and (for repeated
//! failovers) make the dead node a standby of the new primary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{as_server_user, free_port, server_dir};

/// The database every node serves (created on the first primary, replicated).
const DATABASE: &str = "oncely_test";

/// A primary and a synchronous standby; both stopped and removed when dropped.
#[derive(Debug)]
pub struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    nodes: [Node; 2],
    /// Which node is the primary now.
    primary: Mutex<usize>,
}

#[derive(Debug)]
struct Node {
    data: PathBuf,
    log: PathBuf,
    port: u16,
}

impl PgCluster {
    /// Initialises and starts a primary (node 0), a standby of it (node 1) from
    /// `pg_basebackup -R`, and waits until the standby replicates synchronously.
    pub fn start() -> PgCluster {
        let bin = bin_dir();
        let dir = server_dir("oncely-pgcluster");
        let node = |name: &str| Node {
            data: dir.join(name),
            log: dir.join(format!("{name}.log")),
            port: 0,
        };
        let mut cluster = PgCluster {
            nodes: [node("a"), node("b")],
            dir,
            bin,
            primary: Mutex::new(0),
        };
        let a = &cluster.nodes[0];
        cluster.run(
            "initdb",
            &[
                "-D",
                &a.data.display().to_string(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        cluster.nodes[0].port = cluster.start_node(0);
        cluster.psql(0, &format!("CREATE DATABASE {DATABASE}"));
        cluster.nodes[1].port = cluster.start_standby(1, 0);
        cluster
    }

    /// The port of node `i` (0 or 1).
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// The primary's node now.
    pub fn primary(&self) -> usize {
        *self.primary.lock().expect("primary lock")
    }

    /// The standby's node now.
    pub fn standby(&self) -> usize {
        1 - self.primary()
    }

    /// A URL of the database on these ports, in this order, with `query` after a `?` (if
    /// not empty).
    pub fn url(&self, ports: &[u16], query: &str) -> String {
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        format!("postgres://postgres@{}/{DATABASE}{query}", hosts.join(","))
    }

    /// SIGKILL of the primary's postmaster (nothing is shut down cleanly), then waits
    /// until its port refuses connections and its backends, which exit on their own when
    /// they notice, are gone.
    pub fn kill_primary(&self) {
        let node = &self.nodes[self.primary()];
        let pid = postmaster_pid(&node.data).expect("the primary runs");
        let children: Vec<String> = Command::new("pgrep")
            .args(["-P", &pid])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let status = Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -KILL {pid} failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", node.port)).is_ok() {
            assert!(
                Instant::now() < deadline,
                "the killed primary's port {} still accepts connections",
                node.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Its backends notice within moments; one that has not after 10 s is killed.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut left: Vec<String> = children;
        while !left.is_empty() {
            left.retain(|c| Path::new(&format!("/proc/{c}")).exists());
            if Instant::now() > deadline {
                for c in &left {
                    let _ = Command::new("kill").args(["-KILL", c]).status();
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes the primary (SIGSTOP to its postmaster and every backend): its
    /// connections stay open and nothing answers on them, as on a paused VM.
    pub fn pause_primary(&self) {
        super::signal_server(&self.nodes[self.primary()].data, "-STOP");
    }

    /// Lets a [`PgCluster::pause_primary`]d primary run on (SIGCONT).
    pub fn resume_primary(&self) {
        super::signal_server(&self.nodes[self.primary()].data, "-CONT");
    }

    /// Stops the primary (`pg_ctl stop -m fast`; its data and role stay), as a restart
    /// that is not a failover begins.
    pub fn stop_primary(&self) {
        self.pg_ctl(self.primary(), &["-m", "fast", "stop"]);
    }

    /// Starts a [`PgCluster::stop_primary`]ped primary again on its port; its standby
    /// reconnects by itself.
    pub fn start_primary(&self) {
        self.pg_ctl(self.primary(), &["-t", "60", "start"]);
    }

    /// Stops the standby (`pg_ctl stop -m fast`): with no synchronous standby, every
    /// commit on the primary waits (it is written there, but not visible or answered)
    /// until [`PgCluster::resume_standby`], as on a server whose synchronous standby is
    /// away or slow.
    pub fn stop_standby(&self) {
        self.pg_ctl(self.standby(), &["-m", "fast", "stop"]);
    }

    /// Starts a [`PgCluster::stop_standby`]ped standby again without waiting for it to
    /// replicate (its primary may be down: then it has only what it received before).
    pub fn start_standby_again(&self) {
        self.pg_ctl(self.standby(), &["-t", "60", "start"]);
    }

    /// Starts a [`PgCluster::stop_standby`]ped standby again and waits until the primary
    /// replicates to it synchronously (the waiting commits are answered then).
    pub fn resume_standby(&self) {
        let primary = self.primary();
        self.start_standby_again();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.psql(
            primary,
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
        ) != "1"
        {
            assert!(
                Instant::now() < deadline,
                "the standby never replicated synchronously again"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Promotes the standby (`pg_ctl promote`, waiting until it takes writes): it is the
    /// primary from now on, with no standby of its own (so no synchronous replication).
    pub fn promote(&self) {
        let standby = self.standby();
        self.pg_ctl(standby, &["promote"]);
        *self.primary.lock().expect("primary lock") = standby;
    }

    /// Makes the node that is not the primary (stopped or dead) a new standby of the
    /// primary (a fresh `pg_basebackup` on the same port), and the primary replicate to
    /// it synchronously again.
    pub fn rebuild_standby(&self) {
        let standby = self.standby();
        let node = &self.nodes[standby];
        if postmaster_pid(&node.data).is_some() {
            let _ = self.try_pg_ctl(standby, &["-m", "immediate", "stop"]);
        }
        if node.data.exists() {
            let _ = as_server_user("rm")
                .args(["-rf", &node.data.display().to_string()])
                .status();
        }
        let port = self.start_standby(standby, self.primary());
        assert_eq!(port, node.port, "the standby kept its port");
    }

    /// Runs SQL on node `i` with psql; panics when it fails.
    pub fn psql(&self, i: usize, sql: &str) -> String {
        let out = as_server_user(&self.program("psql"))
            .args(["-X", "-q", "-At", "-h", "127.0.0.1", "-U", "postgres", "-d"])
            .arg("postgres")
            .args(["-p", &self.nodes[i].port.to_string(), "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?} on node {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Starts node `i` on a free port (its data directory is there); returns the port.
    fn start_node(&self, i: usize) -> u16 {
        let node = &self.nodes[i];
        for _ in 0..5 {
            let port = if node.port == 0 {
                free_port()
            } else {
                node.port
            };
            // Appended last, so that these win over whatever the file (copied from the
            // primary, for a standby) said before.
            let conf = format!(
                "\n# oncely-test\nport = {port}\nlisten_addresses = '127.0.0.1'\n\
                 unix_socket_directories = '{}'\nmax_connections = 300\n",
                self.dir.display()
            );
            let conf_file = node.data.join("postgresql.conf");
            let mut append = as_server_user("tee");
            append
                .args(["-a", &conf_file.display().to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::null());
            let mut child = append.spawn().expect("run tee");
            std::io::Write::write_all(
                &mut child.stdin.take().expect("tee's stdin"),
                conf.as_bytes(),
            )
            .expect("append to postgresql.conf");
            assert!(
                child.wait().expect("tee").success(),
                "append to postgresql.conf"
            );
            if self.try_pg_ctl(i, &["-t", "60", "start"]) {
                return port;
            }
        }
        panic!(
            "node {i} did not start: {}",
            std::fs::read_to_string(&node.log).unwrap_or_default()
        );
    }

    /// `pg_basebackup -R` of `primary` into node `i`, started as its standby; waits
    /// until the primary names it a synchronous standby.
    fn start_standby(&self, i: usize, primary: usize) -> u16 {
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.nodes[primary].port.to_string(),
                "-U",
                "postgres",
                "-D",
                &self.nodes[i].data.display().to_string(),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
        );
        let port = self.start_node(i);
        self.psql(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'");
        self.psql(primary, "SELECT pg_reload_conf()");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sync = self.psql(
                primary,
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
            );
            if sync == "1" {
                return port;
            }
            assert!(
                Instant::now() < deadline,
                "the standby never replicated synchronously"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn program(&self, name: &str) -> String {
        self.bin.join(name).display().to_string()
    }

    /// Runs a PostgreSQL program as the servers' user; panics with its output on failure.
    fn run(&self, name: &str, args: &[&str]) {
        let out = as_server_user(&self.program(name))
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {name}: {e}"));
        assert!(
            out.status.success(),
            "{name} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn pg_ctl(&self, i: usize, args: &[&str]) {
        assert!(
            self.try_pg_ctl(i, args),
            "pg_ctl {args:?} on node {i} failed"
        );
    }

    fn try_pg_ctl(&self, i: usize, args: &[&str]) -> bool {
        let node = &self.nodes[i];
        as_server_user(&self.program("pg_ctl"))
            .args(["-D", &node.data.display().to_string()])
            .args(["-l", &node.log.display().to_string(), "-w"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            if postmaster_pid(&self.nodes[i].data).is_some() {
                let _ = self.try_pg_ctl(i, &["-m", "immediate", "stop"]);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The postmaster's pid, while its `postmaster.pid` is there.
fn postmaster_pid(data: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    text.lines().next().map(|l| l.trim().to_owned())
}

/// Where initdb, pg_ctl and pg_basebackup are (installing PostgreSQL with apt when it is
/// missing and we are root), as `scripts/pg-env` finds them.
fn bin_dir() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pg-env");
    let out = Command::new("bash")
        .args([
            "-c",
            ". \"$1\" && _pg_install >&2 && _pg_bindir",
            "bash",
            script,
        ])
        .output()
        .expect("run scripts/pg-env");
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && !dir.is_empty(),
        "no PostgreSQL programs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(dir)
}
