//! The libpq parameters of a store URL that tokio-postgres does not read (or reads
//! differently): they are taken out of the URL here, and the rest of it is handed to
//! tokio-postgres unchanged, so that everything it knows (several hosts,
//! `target_session_attrs`, `hostaddr`, `connect_timeout`, `application_name`,
//! `channel_binding`, `sslnegotiation`, ...) keeps its own meaning.
//!
//! - `sslmode`: tokio-postgres knows `disable`, `prefer` and `require`; libpq adds
//!   `verify-ca` and `verify-full`. `allow` (plain first, TLS if refused) is refused.
//! - `sslrootcert` (a PEM file, or `system`), `sslcert` and `sslkey` (PEM), `sslsni`.
//! - `statement_timeout` out of `options` (`-c statement_timeout=5s`): applied with `SET`
//!   once a connection is open instead of in the startup packet, so that a pooler that
//!   refuses startup options (PgBouncer) still gets it; the rest of `options` stays.

use std::path::PathBuf;

use crate::StoreError;

/// A store URL, split into what tokio-postgres reads and what oncely reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoreUrl {
    /// The URL without the parameters taken out here, for tokio-postgres.
    pub(super) driver: String,
    /// How TLS is used.
    pub(super) tls: TlsParams,
    /// `statement_timeout` as `options` sets it (a PostgreSQL duration, e.g. `5s` or
    /// `5000`), if it does.
    pub(super) statement_timeout: Option<String>,
}

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, else plain (the default).
    Prefer,
    /// TLS, or no connection.
    Require,
    /// TLS, with a certificate signed by a trusted CA.
    VerifyCa,
    /// TLS, with a certificate signed by a trusted CA for the host connected to.
    VerifyFull,
}

impl SslMode {
    /// Its libpq spelling.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where the trusted CA certificates come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RootCert {
    /// The system's root certificates (`sslrootcert=system`, and the default).
    System,
    /// A PEM file.
    File(PathBuf),
}

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Nothing: the connection is encrypted, but to whoever answers.
    Nothing,
    /// That a trusted CA signed it.
    Chain,
    /// That a trusted CA signed it for the host connected to.
    ChainAndHost,
}

/// The TLS parameters of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TlsParams {
    pub(super) mode: SslMode,
    /// `sslrootcert`, when given.
    pub(super) root_cert: Option<RootCert>,
    /// `sslcert` and `sslkey`.
    pub(super) client_cert: Option<(PathBuf, PathBuf)>,
    /// `sslsni` (default on): the host name is sent in the handshake.
    pub(super) sni: bool,
}

impl TlsParams {
    /// What is checked. libpq's rule: `verify-ca` checks the chain, `verify-full` the
    /// host as well; `prefer` and `require` check the chain only when a root
    /// certificate file is named ("if a root CA file exists, the behavior of
    /// sslmode=require will be the same as that of verify-ca").
    pub(super) fn check(&self) -> Check {
        match (self.mode, &self.root_cert) {
            (SslMode::VerifyFull, _) => Check::ChainAndHost,
            (SslMode::VerifyCa, _) => Check::Chain,
            (SslMode::Disable, _) => Check::Nothing,
            (SslMode::Prefer | SslMode::Require, Some(RootCert::File(_))) => Check::Chain,
            (SslMode::Prefer | SslMode::Require, _) => Check::Nothing,
        }
    }

    /// The roots a checked certificate must chain to.
    pub(super) fn roots(&self) -> &RootCert {
        self.root_cert.as_ref().unwrap_or(&RootCert::System)
    }

    /// The mode tokio-postgres is given: it negotiates; the checks are the connector's.
    pub(super) fn driver_mode(&self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Driver;
        match self.mode {
            SslMode::Disable => Driver::Disable,
            SslMode::Prefer => Driver::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Driver::Require,
        }
    }
}

/// Splits `url` (`postgres://...` or `postgresql://...`).
pub(super) fn parse(url: &str) -> Result<StoreUrl, StoreError> {
    // tokio-postgres reads the user and password up to the first '@', and the
    // parameters from the first '?' after them.
    let body = url.find("://").map_or(0, |i| i + 3);
    let after_user = url[body..].find('@').map_or(body, |i| body + i + 1);
    let (base, query) = match url[after_user..].find('?') {
        Some(i) => (&url[..after_user + i], &url[after_user + i + 1..]),
        None => (url, ""),
    };
    let mut kept: Vec<String> = Vec::new();
    let mut mode = None;
    let mut root_cert = None;
    let (mut cert, mut key) = (None, None);
    let mut sni = true;
    let mut statement_timeout = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(raw_key)?;
        let value = || decode(raw_value);
        match name.as_str() {
            "sslmode" => mode = Some(ssl_mode(&value()?)?),
            "sslrootcert" => {
                let value = value()?;
                root_cert = match value.as_str() {
                    "" => None,
                    "system" => Some(RootCert::System),
                    path => Some(RootCert::File(PathBuf::from(path))),
                };
            }
            "sslcert" => cert = Some(value()?).filter(|v| !v.is_empty()),
            "sslkey" => key = Some(value()?).filter(|v| !v.is_empty()),
            "sslsni" => {
                sni = match value()?.as_str() {
                    "1" => true,
                    "0" => false,
                    other => return Err(bad(format!("sslsni must be 0 or 1, not {other:?}"))),
                }
            }
            "sslpassword" => {
                return Err(bad(
                    "sslpassword: an encrypted sslkey is not supported; give an unencrypted \
                     key file (owner-only)"
                        .into(),
                ))
            }
            "options" => {
                let (rest, timeout) = take_statement_timeout(&value()?);
                match timeout {
                    Some(timeout) => {
                        statement_timeout = Some(timeout);
                        if !rest.is_empty() {
                            kept.push(format!("options={}", encode(&rest)));
                        }
                    }
                    None => kept.push(pair.to_owned()),
                }
            }
            _ => kept.push(pair.to_owned()),
        }
    }
    let mode = match (mode, &root_cert) {
        // libpq: "If sslrootcert=system is used, the default sslmode is changed to
        // verify-full, and weaker modes will result in an error."
        (None, Some(RootCert::System)) => SslMode::VerifyFull,
        (Some(weak), Some(RootCert::System)) if weak != SslMode::VerifyFull => {
            return Err(bad(format!(
                "weak sslmode={} may not be used with sslrootcert=system (use verify-full)",
                weak.as_str()
            )))
        }
        (mode, _) => mode.unwrap_or(SslMode::Prefer),
    };
    let client_cert = match (cert, key) {
        (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
        (None, None) => None,
        (Some(_), None) => return Err(bad("sslcert needs sslkey (its private key)".into())),
        (None, Some(_)) => return Err(bad("sslkey needs sslcert (its certificate)".into())),
    };
    let driver = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(StoreUrl {
        driver,
        tls: TlsParams {
            mode,
            root_cert,
            client_cert,
            sni,
        },
        statement_timeout,
    })
}

fn bad(message: String) -> StoreError {
    StoreError::Config(format!("bad PostgreSQL URL: {message}"))
}

fn ssl_mode(value: &str) -> Result<SslMode, StoreError> {
    Ok(match value {
        "disable" => SslMode::Disable,
        "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        "allow" => {
            return Err(bad(
                "sslmode=allow is not supported: use prefer (TLS when the server offers it) \
                 or disable"
                    .into(),
            ))
        }
        other => {
            return Err(bad(format!(
                "sslmode must be disable, prefer, require, verify-ca or verify-full, not \
                 {other:?}"
            )))
        }
    })
}

/// `options` without its `statement_timeout` setting, and that setting's value (the
/// last one, as the server would take it). The server splits `options` at whitespace,
/// a backslash escaping the next character, and reads `-c NAME=VALUE`, `-cNAME=VALUE`
/// and `--NAME=VALUE`, with `-` in a name read as `_`.
fn take_statement_timeout(options: &str) -> (String, Option<String>) {
    let words = split_options(options);
    let mut kept: Vec<&str> = Vec::new();
    let mut timeout = None;
    let mut i = 0;
    while i < words.len() {
        let word = &words[i].1;
        let (setting, used) = if word == "-c" && i + 1 < words.len() {
            (Some(words[i + 1].1.as_str()), 2)
        } else if let Some(rest) = word.strip_prefix("--").or_else(|| word.strip_prefix("-c")) {
            (Some(rest), 1)
        } else {
            (None, 1)
        };
        let value = setting
            .and_then(|s| s.split_once('='))
            .and_then(|(name, value)| {
                (name
                    .replace('-', "_")
                    .eq_ignore_ascii_case("statement_timeout"))
                .then(|| value.to_owned())
            });
        match value {
            Some(value) => timeout = Some(value),
            None => kept.extend(words[i..i + used].iter().map(|(raw, _)| raw.as_str())),
        }
        i += used;
    }
    (kept.join(" "), timeout)
}

/// The words of `options`: each as written (escapes kept) and as read.
fn split_options(options: &str) -> Vec<(String, String)> {
    let mut words = Vec::new();
    let mut chars = options.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return words;
        }
        let (mut raw, mut read) = (String::new(), String::new());
        while let Some(&c) = chars.peek() {
            if c.is_ascii_whitespace() {
                break;
            }
            chars.next();
            raw.push(c);
            if c == '\\' {
                if let Some(next) = chars.next() {
                    raw.push(next);
                    read.push(next);
                }
            } else {
                read.push(c);
            }
        }
        words.push((raw, read));
    }
}

/// Percent-decodes a URL component (`+` is a plus, as libpq and tokio-postgres read it).
fn decode(text: &str) -> Result<String, StoreError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad(format!("{text:?} is not UTF-8 once decoded")))
}

/// Percent-encodes a URL parameter's value.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(url: &str) -> TlsParams {
        parse(url).unwrap().tls
    }

    fn refused(url: &str) -> String {
        match parse(url) {
            Err(StoreError::Config(m)) => m,
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn the_tls_parameters_are_taken_out_and_the_rest_is_kept_as_written() {
        let url = parse(
            "postgres://me:p%40ss@db:5432/ledger?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem\
             &application_name=billing&sslcert=c.pem&sslkey=k.pem&connect_timeout=7&sslsni=0",
        )
        .unwrap();
        assert_eq!(
            url.driver,
            "postgres://me:p%40ss@db:5432/ledger?application_name=billing&connect_timeout=7"
        );
        assert_eq!(
            url.tls,
            TlsParams {
                mode: SslMode::VerifyFull,
                root_cert: Some(RootCert::File("/etc/ca.pem".into())),
                client_cert: Some(("c.pem".into(), "k.pem".into())),
                sni: false,
            }
        );
        assert_eq!(url.statement_timeout, None);
        // No parameters left: no '?'.
        let url = parse("postgresql://db/ledger?sslmode=require").unwrap();
        assert_eq!(url.driver, "postgresql://db/ledger");
        let url = parse("postgres://db/ledger").unwrap();
        assert_eq!(url.driver, "postgres://db/ledger");
    }

    #[test]
    fn several_hosts_and_target_session_attrs_reach_tokio_postgres_unchanged() {
        let text = "postgres://oncely@pg1:5432,pg2:5433,[::1]:5434/ledger\
                    ?target_session_attrs=read-write&sslmode=verify-ca&sslrootcert=ca.pem\
                    &load_balance_hosts=disable";
        let url = parse(text).unwrap();
        assert_eq!(
            url.driver,
            "postgres://oncely@pg1:5432,pg2:5433,[::1]:5434/ledger\
             ?target_session_attrs=read-write&load_balance_hosts=disable"
        );
        let config: tokio_postgres::Config = url.driver.parse().unwrap();
        assert_eq!(config.get_hosts().len(), 3);
        assert_eq!(config.get_ports(), &[5432, 5433, 5434]);
        assert_eq!(
            config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        // The keyword form of several hosts too.
        let url = parse("postgres:///ledger?host=pg1,pg2&port=5432,5433&sslmode=require").unwrap();
        assert_eq!(url.driver, "postgres:///ledger?host=pg1,pg2&port=5432,5433");
    }

    #[test]
    fn the_defaults_are_prefer_the_system_roots_sni_and_no_client_certificate() {
        let t = tls("postgres://db/x");
        assert_eq!(t.mode, SslMode::Prefer);
        assert_eq!(t.root_cert, None);
        assert_eq!(t.roots(), &RootCert::System);
        assert_eq!(t.client_cert, None);
        assert!(t.sni);
        assert_eq!(t.check(), Check::Nothing);
        assert_eq!(t.driver_mode(), tokio_postgres::config::SslMode::Prefer);
    }

    #[test]
    fn each_mode_checks_what_libpq_checks() {
        let check = |q: &str| tls(&format!("postgres://db/x?{q}")).check();
        assert_eq!(check("sslmode=disable"), Check::Nothing);
        assert_eq!(check("sslmode=disable&sslrootcert=ca.pem"), Check::Nothing);
        assert_eq!(check("sslmode=prefer"), Check::Nothing);
        assert_eq!(check("sslmode=require"), Check::Nothing);
        // "If a root CA file exists, sslmode=require behaves as verify-ca."
        assert_eq!(check("sslmode=require&sslrootcert=ca.pem"), Check::Chain);
        assert_eq!(check("sslmode=prefer&sslrootcert=ca.pem"), Check::Chain);
        assert_eq!(check("sslmode=verify-ca"), Check::Chain);
        assert_eq!(check("sslmode=verify-full"), Check::ChainAndHost);
        // sslrootcert=system makes verify-full the default, and refuses weaker modes.
        assert_eq!(check("sslrootcert=system"), Check::ChainAndHost);
        let m = refused("postgres://db/x?sslrootcert=system&sslmode=require");
        assert!(m.contains("verify-full"), "{m}");
        let driver = |q: &str| tls(&format!("postgres://db/x?{q}")).driver_mode();
        use tokio_postgres::config::SslMode as D;
        assert_eq!(driver("sslmode=disable"), D::Disable);
        assert_eq!(driver("sslmode=verify-ca"), D::Require);
        assert_eq!(driver("sslmode=verify-full"), D::Require);
        // The last value wins, as in libpq.
        assert_eq!(
            tls("postgres://db/x?sslmode=disable&sslmode=verify-ca").mode,
            SslMode::VerifyCa
        );
    }

    #[test]
    fn bad_tls_parameters_are_refused_with_a_reason() {
        for (q, needle) in [
            ("sslmode=allow", "sslmode=allow is not supported"),
            ("sslmode=strict", "sslmode must be"),
            ("sslcert=c.pem", "sslcert needs sslkey"),
            ("sslkey=k.pem", "sslkey needs sslcert"),
            ("sslsni=yes", "sslsni must be 0 or 1"),
            ("sslpassword=x", "encrypted sslkey is not supported"),
        ] {
            let m = refused(&format!("postgres://db/x?{q}"));
            assert!(m.contains(needle), "{q}: {m}");
            assert!(m.starts_with("bad PostgreSQL URL"), "{m}");
        }
    }

    #[test]
    fn statement_timeout_is_taken_out_of_options_and_the_other_settings_stay() {
        let url = parse("postgres://db/x?options=-c%20statement_timeout%3D5s").unwrap();
        assert_eq!(url.statement_timeout.as_deref(), Some("5s"));
        assert_eq!(url.driver, "postgres://db/x");
        let url = parse(
            "postgres://db/x?options=-csearch_path%3Dt_1%20--statement-timeout%3D250ms\
             %20-c%20work_mem%3D4MB&sslmode=disable",
        )
        .unwrap();
        assert_eq!(url.statement_timeout.as_deref(), Some("250ms"));
        assert_eq!(
            url.driver,
            "postgres://db/x?options=-csearch_path%3Dt_1%20-c%20work_mem%3D4MB"
        );
        let config: tokio_postgres::Config = url.driver.parse().unwrap();
        assert_eq!(
            config.get_options(),
            Some("-csearch_path=t_1 -c work_mem=4MB")
        );
        // Options without it are kept exactly as written.
        let url = parse("postgres://db/x?options=-csearch_path%3Dt_1").unwrap();
        assert_eq!(url.driver, "postgres://db/x?options=-csearch_path%3Dt_1");
        assert_eq!(url.statement_timeout, None);
        // An escaped space belongs to its word.
        let (rest, t) = take_statement_timeout(r"-c application_name=a\ b -cstatement_timeout=0");
        assert_eq!(rest, r"-c application_name=a\ b");
        assert_eq!(t.as_deref(), Some("0"));
    }

    #[test]
    fn a_password_or_parameter_with_a_question_mark_or_at_sign_is_read_as_tokio_postgres_does() {
        let url = parse("postgres://me:a?b@db/x?sslmode=require").unwrap();
        assert_eq!(url.driver, "postgres://me:a?b@db/x");
        assert_eq!(url.tls.mode, SslMode::Require);
        let url = parse("postgres://db/x?sslrootcert=%2Fa%20b%2Fca.pem").unwrap();
        assert_eq!(
            url.tls.root_cert,
            Some(RootCert::File("/a b/ca.pem".into()))
        );
    }
}
