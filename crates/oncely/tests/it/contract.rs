//! CONTRACT.md read as a black-box tester would: each test names the contract line it
//! checks, found deviating when the binary was exercised from outside, and runs the real
//! binary.

use crate::common::{assert_usage_error, run};

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
