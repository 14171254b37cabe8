//! What the console's handlers share, and who is looking at a page: the ledger, the
//! config, the admin token and the webhook routes, which the admin API hands over when it
//! mounts the console (the console does not reach into the admin API), and the browser
//! sessions the login form opens, kept in this process's memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oncely_store::Store;

use crate::config::Config;

/// How long a console session lasts.
pub(super) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// At most this many sessions are kept (the oldest go first).
const MAX_SESSIONS: usize = 1000;

/// Who is looking at a page.
#[derive(Debug, Clone)]
pub(crate) enum Viewer {
    /// A request with the admin token in its `Authorization` header.
    Bearer,
    /// A browser session opened at the login form.
    Session {
        /// The session id (the cookie's value).
        id: String,
        /// The token its forms carry.
        csrf: String,
    },
}

#[derive(Debug)]
struct Session {
    csrf: String,
    expires: Instant,
}

/// What the console's handlers share: what they take of the admin API's state, and the
/// sessions.
#[derive(Clone)]
pub(crate) struct Console {
    /// The ledger.
    pub(super) store: Arc<dyn Store>,
    /// The config (routes, windows, reconcile endpoints, `admin_token_env`).
    pub(super) config: Arc<Config>,
    /// The admin token; `None` closes the console, as it closes the admin API.
    token: Option<String>,
    /// Wakes this process's webhook delivery worker (when it has one) on a redelivery.
    pub(super) webhook_waker: Option<oncely_webhooks::Waker>,
    sessions: Arc<Mutex<HashMap<String, Session>>>,
}

impl Console {
    /// A console over the admin API's ledger, config, token and webhook worker, with no
    /// session open yet.
    pub(super) fn new(
        store: Arc<dyn Store>,
        config: Arc<Config>,
        token: Option<String>,
        webhook_waker: Option<oncely_webhooks::Waker>,
    ) -> Console {
        Console {
            store,
            config,
            token,
            webhook_waker,
            sessions: Arc::default(),
        }
    }

    /// The admin token; `None` when the console is closed.
    pub(super) fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Opens a session: its id (the cookie's value) and its CSRF token.
    pub(super) fn open_session(&self) -> (String, String) {
        let id = random_hex();
        let csrf = random_hex();
        let now = Instant::now();
        let mut sessions = self.sessions.lock().expect("sessions lock");
        sessions.retain(|_, s| s.expires > now);
        while sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => sessions.remove(&k),
                None => break,
            };
        }
        sessions.insert(
            id.clone(),
            Session {
                csrf: csrf.clone(),
                expires: now + SESSION_TTL,
            },
        );
        (id, csrf)
    }

    /// The CSRF token of a live session.
    pub(super) fn session(&self, id: &str) -> Option<String> {
        let sessions = self.sessions.lock().expect("sessions lock");
        sessions
            .get(id)
            .filter(|s| s.expires > Instant::now())
            .map(|s| s.csrf.clone())
    }

    /// Closes a session (logout).
    pub(super) fn close_session(&self, id: &str) {
        self.sessions.lock().expect("sessions lock").remove(id);
    }
}

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}
