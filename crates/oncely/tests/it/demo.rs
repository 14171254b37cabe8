//! `oncely demo` through the real binary: it exits 0 and the numbers it prints show
//! fewer executions than requests and fewer characters charged through oncely.

use crate::common::{run, stderr, stdout};

/// The two numbers (without oncely, with oncely) of the table row that starts with
/// `label`.
fn row(out: &str, label: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} row in:\n{out}"));
    // The last two columns.
    let words: Vec<&str> = line.split_whitespace().collect();
    let numbers: Vec<u64> = words[words.len().saturating_sub(2)..]
        .iter()
        .map(|n| {
            // "-": not applicable straight to the service.
            n.replace(',', "")
                .replace('-', "0")
                .parse()
                .unwrap_or_else(|_| panic!("{n:?} in {line:?}"))
        })
        .collect();
    assert_eq!(numbers.len(), 2, "{line:?}");
    (numbers[0], numbers[1])
}

#[test]
fn the_demo_exits_0_and_shows_what_oncely_saved() {
    let started = std::time::Instant::now();
    let out = run(&["demo", "--render-time", "600ms"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}\n{text}", stderr(&out));
    assert!(
        started.elapsed().as_secs() < 60,
        "the demo took {:?}",
        started.elapsed()
    );

    let (sent_direct, sent) = row(&text, "requests sent");
    assert_eq!(sent_direct, sent, "both runs send the same script");
    let (exec_direct, exec) = row(&text, "upstream executions");
    // Straight to the service, every request is a render; through oncely, one per
    // distinct chapter (4), the given-up one included.
    assert_eq!(exec_direct, sent_direct);
    assert_eq!(exec, 4, "{text}");
    assert!(exec < sent);
    let (_, replayed) = row(&text, "replayed");
    let (_, joined) = row(&text, "joined");
    let (_, fresh) = row(&text, "answered by a new render");
    let (gave_up_direct, gave_up) = row(&text, "given up by the agent");
    assert_eq!((gave_up_direct, gave_up), (1, 1));
    assert_eq!(replayed, 3, "step 3 asks for three completed renders");
    // The retry after giving up, and 19 of the burst of 20.
    assert_eq!(joined, 20, "{text}");
    assert_eq!(fresh + replayed + joined + gave_up, sent);
    let (charged_direct, charged) = row(&text, "characters charged");
    assert!(charged < charged_direct, "{text}");
    assert!(charged > 0);

    // The ledger's own count agrees with what the agent saw.
    let ledger = text
        .lines()
        .find(|l| l.starts_with("The ledger"))
        .expect("the ledger line");
    assert!(
        ledger.contains(&format!("{exec} fresh executions")),
        "{ledger}"
    );
    assert!(
        ledger.contains(&format!("{} repeats", replayed + joined)),
        "{ledger}"
    );
    assert!(text.contains("Conclusion:"), "{text}");
}

#[test]
fn the_demo_rejects_unknown_arguments() {
    let out = run(&["demo", "--fast"]);
    crate::common::assert_usage_error(&out, "demo takes no argument");
}
