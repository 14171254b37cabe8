//! The one error type of the crate, and the exit code each kind stands for.

use std::io;
use std::path::PathBuf;

/// Why an audit could not run (or could not write its answer).
///
/// Lines that cannot be read are *not* errors: they are counted in the report and the run
/// goes on. These are the failures that stop a run before or after the counting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// A command-line argument is malformed (unknown field name, bad duration, ...).
    #[error("{0}")]
    Argument(String),
    /// An input file could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file named on the command line.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// The `--credits-csv` file could not be written.
    #[error("cannot write credits CSV {}: {source}", path.display())]
    CreditsCsv {
        /// The file named by `--credits-csv`.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// Standard output (or the given writer) refused the report.
    #[error("cannot write the report: {0}")]
    Output(#[source] io::Error),
}

impl AuditError {
    /// The process exit code the `oncely` binary should use: 2 for a bad argument, an
    /// input that cannot be opened or a credits file that cannot be created (all found
    /// before any line is read: the contract's "bad argument"), 1 when the report itself
    /// cannot be written.
    pub fn exit_code(&self) -> i32 {
        match self {
            AuditError::Argument(_) | AuditError::Open { .. } | AuditError::CreditsCsv { .. } => 2,
            AuditError::Output(_) => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line_and_codes_follow_the_contract() {
        let errors = [
            AuditError::Argument("unknown field name \"tz\"".into()),
            AuditError::Open {
                path: "/nope.jsonl".into(),
                source: io::Error::new(io::ErrorKind::NotFound, "No such file or directory"),
            },
            AuditError::CreditsCsv {
                path: "/ro/credits.csv".into(),
                source: io::Error::new(io::ErrorKind::PermissionDenied, "denied"),
            },
            AuditError::Output(io::Error::new(io::ErrorKind::BrokenPipe, "broken pipe")),
        ];
        let codes: Vec<i32> = errors.iter().map(AuditError::exit_code).collect();
        assert_eq!(codes, [2, 2, 2, 1]);
        for e in &errors {
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        assert_eq!(
            errors[1].to_string(),
            "cannot open /nope.jsonl: No such file or directory"
        );
    }
}
