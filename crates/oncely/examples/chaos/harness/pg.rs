//! The PostgreSQL of a chaos phase: one server of its own, or, when the run injects
//! failovers, a primary with a synchronous streaming standby (the gateways' URL lists
//! both, with `target_session_attrs=read-write`). A restart stops and starts the primary;
//! a failover SIGKILLs the primary's postmaster, promotes the standby, and makes the dead
//! node a standby of the new primary, so that the next failover can go the other way. A
//! pause SIGSTOPs every process of the server (the primary) and a resume SIGCONTs them.

use std::time::Duration;

use oncely_store_conformance::testing::{PgCluster, PgServer};

/// A server, or a primary and its standby.
#[derive(Debug)]
pub(crate) enum Pg {
    Server(PgServer),
    Cluster(PgCluster),
}

impl Pg {
    /// Starts a cluster when `failovers`, else one server (blocking: run it off the
    /// runtime).
    pub(crate) fn start(failovers: bool) -> Pg {
        if failovers {
            Pg::Cluster(PgCluster::start())
        } else {
            Pg::Server(PgServer::start())
        }
    }

    /// The gateways' store URL.
    pub(crate) fn url(&self) -> String {
        match self {
            Pg::Server(s) => s.url.clone(),
            Pg::Cluster(c) => c.url(&[c.port(0), c.port(1)], "target_session_attrs=read-write"),
        }
    }

    /// Stops the server (the primary), as a restart begins.
    pub(crate) fn stop(&self) {
        match self {
            Pg::Server(s) => s.stop(),
            Pg::Cluster(c) => c.stop_primary(),
        }
    }

    /// Starts it again on the same data and port.
    pub(crate) fn start_again(&self) {
        match self {
            Pg::Server(s) => s.start_again(),
            Pg::Cluster(c) => c.start_primary(),
        }
    }

    /// Freezes the server (the primary): SIGSTOP of every process, connections open.
    pub(crate) fn pause(&self) {
        match self {
            Pg::Server(s) => s.pause(),
            Pg::Cluster(c) => c.pause_primary(),
        }
    }

    /// Lets a paused server run on (SIGCONT).
    pub(crate) fn resume(&self) {
        match self {
            Pg::Server(s) => s.resume(),
            Pg::Cluster(c) => c.resume_primary(),
        }
    }

    /// A failover that leaves no primary for `down`: the primary's postmaster SIGKILLed,
    /// the standby promoted after `down`, then a new standby made of the dead node (the
    /// new primary replicates to it synchronously once it streams). Nothing without a
    /// cluster.
    pub(crate) fn fail_over(&self, down: Duration) {
        if let Pg::Cluster(c) = self {
            c.kill_primary();
            std::thread::sleep(down);
            c.promote();
            c.rebuild_standby();
        }
    }
}
