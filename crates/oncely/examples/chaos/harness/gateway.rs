//! The gateway instances: real `oncely serve` processes on 127.0.0.1 port 0, their config,
//! their logs (one file per start, in the phase's directory), SIGKILL and restart.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

/// How to start an instance.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub(crate) oncely: PathBuf,
    pub(crate) config: PathBuf,
    pub(crate) envs: Vec<(String, String)>,
    pub(crate) logs: PathBuf,
}

/// One running `oncely serve`.
#[derive(Debug)]
struct Running {
    child: Child,
}

/// The instances of one phase: their processes and current addresses.
#[derive(Debug)]
pub(crate) struct Instances {
    launch: Launch,
    running: Vec<Mutex<Option<Running>>>,
    addrs: RwLock<Vec<Option<SocketAddr>>>,
    starts: Mutex<usize>,
}

impl Instances {
    /// Starts `n` instances.
    pub(crate) fn start(launch: Launch, n: usize) -> Result<Instances, String> {
        let instances = Instances {
            launch,
            running: (0..n).map(|_| Mutex::new(None)).collect(),
            addrs: RwLock::new(vec![None; n]),
            starts: Mutex::new(0),
        };
        for i in 0..n {
            instances.restart(i)?;
        }
        Ok(instances)
    }

    pub(crate) fn len(&self) -> usize {
        self.running.len()
    }

    /// The address of instance `i`, when it is up.
    pub(crate) fn addr(&self, i: usize) -> Option<SocketAddr> {
        self.addrs.read().expect("addrs lock")[i]
    }

    /// SIGKILL: no drain, no flush, whatever it held stays held.
    pub(crate) fn kill(&self, i: usize) {
        self.addrs.write().expect("addrs lock")[i] = None;
        if let Some(mut r) = self.running[i].lock().expect("instance lock").take() {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }

    /// Starts instance `i` (again) and waits until it listens.
    pub(crate) fn restart(&self, i: usize) -> Result<(), String> {
        let mut slot = self.running[i].lock().expect("instance lock");
        if slot.is_some() {
            return Ok(());
        }
        let n = {
            let mut s = self.starts.lock().expect("starts lock");
            *s += 1;
            *s
        };
        let log = self.launch.logs.join(format!("gateway-{i}-start-{n}.log"));
        let (child, addr) = spawn(&self.launch, &log)?;
        *slot = Some(Running { child });
        self.addrs.write().expect("addrs lock")[i] = Some(addr);
        Ok(())
    }

    /// Kills every instance.
    pub(crate) fn stop_all(&self) {
        for i in 0..self.len() {
            self.kill(i);
        }
    }
}

impl Drop for Instances {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn spawn(launch: &Launch, log: &Path) -> Result<(Child, SocketAddr), String> {
    let mut child = Command::new(&launch.oncely)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&launch.config)
        .env_remove("ONCELY_STORE")
        .envs(launch.envs.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start {}: {e}", launch.oncely.display()))?;
    let stderr = child.stderr.take().expect("piped stderr");
    let mut file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(i) = line.find("listening on ") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(line[i..].to_owned());
                }
            }
            let _ = writeln!(file, "{line}");
        }
    });
    let Ok(first) = rx.recv_timeout(Duration::from_secs(30)) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("oncely serve did not start; see {}", log.display()));
    };
    // "listening on http://127.0.0.1:PORT (admin http://127.0.0.1:PORT2), store ..."
    let rest = &first["listening on http://".len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
        .unwrap_or(rest.len());
    let addr = rest[..end]
        .parse()
        .map_err(|e| format!("address in {first:?}: {e}"))?;
    Ok((child, addr))
}

/// The gateway's config: three guarded route classes and one webhook endpoint, every
/// upstream call through the fault proxy, short leases and timeouts.
pub(crate) fn config(store: &str, proxy: SocketAddr, timing: &Timing) -> String {
    format!(
        r#"store = "{store}"
upstream = "http://{proxy}"

[defaults]
window = "1h"
wait = "{wait}ms"
lease = "{lease}ms"
timeout = "{timeout}ms"
principal = "header:authorization"
key = "header-or-fingerprint"

[[routes]]
method = "POST"
path = "/w/{{id}}"
class = "write"

[[routes]]
method = "POST"
path = "/s/{{id}}"
class = "write"
timeout = "60s"

[[routes]]
method = "POST"
path = "/a/{{id}}"
class = "action"

# The key-churn agent's intentions: the same classes, routes of their own.
[[routes]]
method = "POST"
path = "/cw/{{id}}"
class = "write"

[[routes]]
method = "POST"
path = "/ca/{{id}}"
class = "action"

[[routes]]
method = "POST"
path = "/j/{{id}}"
class = "job"
concurrency = 4

[[webhooks]]
path = "/hooks/in"
verify = "standard"
secret_env = "CHAOS_WEBHOOK_SECRET"
tolerance = "10m"
deliver_to = "http://{proxy}/internal/hook"
deliver_timeout = "{timeout}ms"
max_attempts = 1000
retry_backoff = "100ms"
"#,
        wait = timing.wait.as_millis(),
        lease = timing.lease.as_millis(),
        timeout = timing.timeout.as_millis(),
    )
}

/// The routes' timing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) wait: Duration,
    pub(crate) lease: Duration,
    pub(crate) timeout: Duration,
}
