//! A schema as an ordered list of migrations, and the one way a backend runs them
//! (`sqlite/schema.rs`, `postgres/migrations.rs`): in one transaction, read what the
//! schema has applied; refuse a schema newer than this build ([`pending`]); then apply
//! each pending migration in order, record its version and log it ([`applied`]), or say
//! which failed ([`failed`]). A list only grows: a migration that has shipped is never
//! edited, because databases in the field have already applied it.

use std::fmt::Display;

use crate::StoreError;

/// One step of a schema. `V` is its version as the backend stores it: SQLite's
/// `PRAGMA user_version` is a `u32`, PostgreSQL's `schema_migrations.version` an
/// `integer` (`i32`).
#[derive(Debug, Clone, Copy)]
pub struct Migration<V> {
    /// Strictly increasing, starting at 1.
    pub version: V,
    /// What the step adds, for logs.
    pub name: &'static str,
    /// The statements, run in one transaction with the record of the version.
    pub sql: &'static str,
}

/// The migrations of `all` that a schema still needs, oldest first: those for which
/// `is_applied` is false. `newest` is the newest version the schema has applied; one
/// newer than the last of `all` (a database of a newer oncely) is refused, naming `what`.
pub(crate) fn pending<'m, V: Copy + PartialOrd + Display>(
    all: &'m [Migration<V>],
    what: &str,
    newest: Option<V>,
    is_applied: impl Fn(V) -> bool,
) -> Result<Vec<&'m Migration<V>>, StoreError> {
    let known = all.last().map(|m| m.version);
    if let (Some(newest), Some(known)) = (newest, known) {
        if newest > known {
            return Err(StoreError::Config(format!(
                "{what} has schema version {newest}, newer than this oncely knows \
                 ({known}): upgrade oncely"
            )));
        }
    }
    Ok(all.iter().filter(|m| !is_applied(m.version)).collect())
}

/// The error of a migration whose statements failed.
pub(crate) fn failed<V: Display>(m: &Migration<V>, error: impl Display) -> StoreError {
    StoreError::Unavailable(format!(
        "migration {} ({}) failed: {error}",
        m.version, m.name
    ))
}

/// Logs a migration applied to `what`.
pub(crate) fn applied<V: Display>(m: &Migration<V>, what: &str) {
    tracing::info!(version = %m.version, name = m.name, schema = what, "applied migration");
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[Migration<u32>] = &[
        Migration {
            version: 1,
            name: "one",
            sql: "",
        },
        Migration {
            version: 2,
            name: "two",
            sql: "",
        },
    ];

    #[test]
    fn what_is_not_applied_is_pending_and_a_newer_schema_is_refused() {
        let names = |p: Vec<&Migration<u32>>| p.iter().map(|m| m.name).collect::<Vec<_>>();
        assert_eq!(
            names(pending(ALL, "x", None, |_| false).unwrap()),
            ["one", "two"]
        );
        assert_eq!(
            names(pending(ALL, "x", Some(1), |v| v <= 1).unwrap()),
            ["two"]
        );
        assert!(pending(ALL, "x", Some(2), |v| v <= 2).unwrap().is_empty());
        let err = pending(ALL, "the ledger", Some(3), |v| v <= 3).unwrap_err();
        assert!(
            matches!(&err, StoreError::Config(m) if m.contains("newer") && m.contains('3')),
            "{err}"
        );
    }
}
