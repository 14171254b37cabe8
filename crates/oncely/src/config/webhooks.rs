//! `[[webhooks]]`: incoming webhook endpoints. The gateway checks each delivery's
//! signature, keeps one delivery per event id, and delivers it to `deliver_to` with
//! retries. On `hmac-sha256` (an extension) the keys `signature_header`,
//! `signature_encoding`, `signature_prefix` and `timestamp_header` describe the scheme.

use std::time::Duration;

use toml::Table;

use super::read::{self, at, check, required, Mistakes};
use super::upstream::Upstream;
use super::values::{endpoint_path, env_name, pointer};

/// One `[[webhooks]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    /// The path senders post to.
    pub path: String,
    /// How signatures are checked.
    pub verify: oncely_webhooks::Scheme,
    /// The variable holding the secrets (space-separated).
    pub secret_env: String,
    /// How far a signed timestamp may be from now (default 5m).
    pub tolerance: Duration,
    /// Where the event id comes from (the scheme's default when unset).
    pub event_id: Option<oncely_webhooks::EventIdSource>,
    /// JSON pointers whose values also make a delivery unique.
    pub dedupe_fields: Vec<String>,
    /// Where deliveries go.
    pub deliver_to: Upstream,
    /// Timeout of one delivery (default 30s).
    pub deliver_timeout: Duration,
    /// Attempts before dead-lettering (default 10).
    pub max_attempts: u32,
    /// First retry delay (default 1s).
    pub retry_backoff: Duration,
    /// The delivery worker's lease on a delivery, renewed while it runs: a delivery cut
    /// off by a crash is sent again about this long after (an extension; default 30s).
    pub lease: Duration,
}

const WEBHOOK_KEYS: &[&str] = &[
    "path",
    "verify",
    "secret_env",
    "tolerance",
    "event_id",
    "dedupe_fields",
    "deliver_to",
    "deliver_timeout",
    "max_attempts",
    "retry_backoff",
    "lease",
    "signature_header",
    "signature_encoding",
    "signature_prefix",
    "timestamp_header",
];

/// Reads `[[webhooks]]`: the entries without problems (each problem is reported).
pub(super) fn section(table: &Table, p: &mut Mistakes) -> Vec<WebhookEndpoint> {
    let mut webhooks = Vec::new();
    for (i, t) in read::tables(table, "webhooks", p).into_iter().enumerate() {
        if let Some(w) = entry(t, &format!("webhooks[{i}]"), p) {
            webhooks.push(w);
        }
    }
    webhooks
}

/// One `[[webhooks]]` entry at `loc`, or `None` when it has problems (each reported).
fn entry(t: &Table, loc: &str, p: &mut Mistakes) -> Option<WebhookEndpoint> {
    read::unknown_keys(t, loc, WEBHOOK_KEYS, p);
    let path = required(t, loc, "path", "e.g. path = \"/hooks/stripe\"", p)
        .and_then(|s| check(p, loc, "path", endpoint_path(s)));
    let mut verify = required(
        t,
        loc,
        "verify",
        "stripe, standard, github or hmac-sha256",
        p,
    )
    .and_then(|s| {
        check(
            p,
            loc,
            "verify",
            s.parse::<oncely_webhooks::Scheme>()
                .map_err(|e| e.to_string()),
        )
    });
    // The generic scheme's own keys.
    let hmac_keys = [
        "signature_header",
        "signature_encoding",
        "signature_prefix",
        "timestamp_header",
    ];
    match &mut verify {
        Some(oncely_webhooks::Scheme::HmacSha256(cfg)) => {
            if let Some(h) = read::string(t, loc, "signature_header", p) {
                cfg.header = h.to_owned();
            }
            if let Some(e) = read::string(t, loc, "signature_encoding", p) {
                if let Some(enc) = check(
                    p,
                    loc,
                    "signature_encoding",
                    e.parse()
                        .map_err(|e: oncely_webhooks::ConfigError| e.to_string()),
                ) {
                    cfg.encoding = enc;
                }
            }
            cfg.prefix = read::string(t, loc, "signature_prefix", p).map(str::to_owned);
            cfg.timestamp_header = read::string(t, loc, "timestamp_header", p).map(str::to_owned);
            if let Err(e) = cfg.validate() {
                p.add(at(loc, "verify"), e.to_string());
            }
        }
        Some(other) => {
            for k in hmac_keys {
                if t.contains_key(k) {
                    p.add(
                        at(loc, k),
                        format!("only for verify = \"hmac-sha256\", not {:?}", other.name()),
                    );
                }
            }
        }
        None => {}
    }
    let secret_env = required(t, loc, "secret_env", "the variable holding the secret", p)
        .and_then(|s| check(p, loc, "secret_env", env_name(s).map(|()| s.to_owned())));
    let tolerance =
        read::duration(t, loc, "tolerance", p).unwrap_or(oncely_webhooks::DEFAULT_TOLERANCE);
    let event_id = read::string(t, loc, "event_id", p).and_then(|s| {
        check(
            p,
            loc,
            "event_id",
            s.parse::<oncely_webhooks::EventIdSource>()
                .map_err(|e| e.to_string()),
        )
    });
    if let (Some(v), None, false) = (&verify, &event_id, t.contains_key("event_id")) {
        if v.default_event_id().is_none() {
            p.add(
                at(loc, "event_id"),
                format!(
                    "verify = {:?} has no default event id: set event_id = \"json:/POINTER\" or \"header:NAME\"",
                    v.name()
                ),
            );
        }
    }
    let dedupe_fields = read::strings(t, loc, "dedupe_fields", p).unwrap_or_default();
    for (i, f) in dedupe_fields.iter().enumerate() {
        if let Err(e) = pointer(f) {
            p.add(format!("{}[{i}]", at(loc, "dedupe_fields")), e);
        }
    }
    let deliver_to = required(t, loc, "deliver_to", "the URL deliveries go to", p)
        .and_then(|s| check(p, loc, "deliver_to", Upstream::parse(s)));
    let deliver_timeout =
        read::duration(t, loc, "deliver_timeout", p).unwrap_or(Duration::from_secs(30));
    let max_attempts = match read::integer(t, loc, "max_attempts", p) {
        Some(0) => {
            p.add(at(loc, "max_attempts"), "must be at least 1");
            10
        }
        Some(n) if n > u32::MAX as u64 => {
            p.add(at(loc, "max_attempts"), "is too large");
            10
        }
        Some(n) => n as u32,
        None => 10,
    };
    let retry_backoff =
        read::duration(t, loc, "retry_backoff", p).unwrap_or(Duration::from_secs(1));
    let lease = match read::duration(t, loc, "lease", p) {
        Some(d) if d.is_zero() => {
            p.add(at(loc, "lease"), "must be longer than 0");
            Duration::from_secs(30)
        }
        Some(d) => d,
        None => Duration::from_secs(30),
    };
    Some(WebhookEndpoint {
        path: path?,
        verify: verify?,
        secret_env: secret_env?,
        tolerance,
        event_id,
        dedupe_fields,
        deliver_to: deliver_to?,
        deliver_timeout,
        max_attempts,
        retry_backoff,
        lease,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `[[webhooks]]` entries of `text`, or its problems.
    fn read(text: &str) -> Result<Vec<WebhookEndpoint>, Vec<String>> {
        let table: Table = text.parse().unwrap();
        let mut p = Mistakes::default();
        let webhooks = section(&table, &mut p);
        if p.0.is_empty() {
            Ok(webhooks)
        } else {
            Err(p.0.iter().map(ToString::to_string).collect())
        }
    }

    #[test]
    fn defaults_apply() {
        let w = read(
            r#"
[[webhooks]]
path = "/hooks/stripe"
verify = "stripe"
secret_env = "STRIPE_WEBHOOK_SECRET"
deliver_to = "http://127.0.0.1:1/x"
"#,
        )
        .unwrap();
        let w = &w[0];
        assert_eq!(w.verify, oncely_webhooks::Scheme::Stripe);
        assert_eq!(w.tolerance, oncely_webhooks::DEFAULT_TOLERANCE);
        assert_eq!(w.event_id, None);
        assert_eq!(w.deliver_timeout, Duration::from_secs(30));
        assert_eq!(w.max_attempts, 10);
        assert_eq!(w.retry_backoff, Duration::from_secs(1));
        assert_eq!(w.lease, Duration::from_secs(30));
    }

    #[test]
    fn every_problem_is_reported() {
        let ps = read(
            r#"
[[webhooks]]
path = "/hooks/x"
verify = "hmac-sha256"
secret_env = "X SECRET"
deliver_to = "http://127.0.0.1:1/x"
max_attempts = 0
lease = "0s"
dedupe_fields = ["type"]
[[webhooks]]
path = "/hooks/s"
verify = "svix"
secret_env = "S"
deliver_to = "http://127.0.0.1:1/x"
signature_header = "x-sig"
[[webhooks]]
path = "/hooks/g"
verify = "github"
secret_env = "G"
deliver_to = "http://127.0.0.1:1/x"
signature_prefix = "sha256="
colour = "blue"
"#,
        )
        .unwrap_err();
        let want = [
            "webhooks[0].secret_env: ",
            "webhooks[0].max_attempts: must be at least 1",
            "webhooks[0].lease: must be longer than 0",
            "webhooks[0].dedupe_fields[0]: ",
            "webhooks[0].event_id: verify = \"hmac-sha256\" has no default event id",
            "webhooks[1].verify: unknown webhook verification scheme",
            "webhooks[2].signature_prefix: only for verify = \"hmac-sha256\"",
            "webhooks[2].colour: unknown key",
        ];
        for w in want {
            assert!(ps.iter().any(|p| p.starts_with(w)), "{w:?} not in {ps:#?}");
        }
        assert_eq!(ps.len(), want.len(), "{ps:#?}");
    }
}
