//! CONTRACT.md read as a black-box tester would: each test names the contract line it
//! checks, found deviating when the binary was exercised from outside, and runs the real
//! binary.

use std::process::Stdio;

use crate::common::{assert_usage_error, oncely, run, stderr};

/// "A bad argument or bad config exits 2 with a one-line reason on standard error":
/// a command family called without its command is a bad argument too (clap would print
/// its whole help to standard error).
#[test]
fn a_missing_command_exits_2_with_one_line_naming_the_commands() {
    let o = run(&[]);
    assert_usage_error(&o, "serve");
    let o = run(&["ledger"]);
    assert_usage_error(&o, "list, show, resolve, reconcile, purge");
    let o = run(&["webhooks"]);
    assert_usage_error(&o, "dead, redeliver");
}

/// `oncely ledger list | head -1`: a reader that stops reading is not a crash (no panic
/// and backtrace on standard error), and the command ends quietly.
#[test]
fn a_closed_standard_output_ends_a_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("l.db").display());
    for args in [
        vec!["ledger", "list", "--store", &store],
        vec!["usage", "--store", &store],
        vec!["ledger", "list", "--json", "--store", &store],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        // The reader is gone before the command writes a byte: every write is EPIPE.
        drop(reader);
        let o = oncely()
            .args(&args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    }
}
