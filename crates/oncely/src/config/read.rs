//! Reading a TOML table field by field while collecting every problem.
//!
//! `serde`'s `deny_unknown_fields` stops at the first mistake; an operator fixing a
//! config file wants all of them at once, each with its location. So the raw layer is
//! the parsed [`toml::Table`] itself, read through these helpers: each getter reports a
//! wrong type at `location.key`, and [`unknown_keys`] reports every key a section does
//! not know.

use std::fmt;
use std::time::Duration;

use toml::{Table, Value};

/// One thing wrong with a config file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mistake {
    /// Where: `routes[2].window`, `tls.cert`, or the file's `LINE:COL` for syntax errors.
    pub at: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Mistake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.message)
    }
}

/// The problems found so far.
#[derive(Debug, Default)]
pub(crate) struct Mistakes(pub(crate) Vec<Mistake>);

impl Mistakes {
    pub(crate) fn add(&mut self, at: impl Into<String>, message: impl Into<String>) {
        self.0.push(Mistake {
            at: at.into(),
            message: message.into(),
        });
    }
}

/// `loc.key`, or `key` at the top level.
pub(crate) fn at(loc: &str, key: &str) -> String {
    if loc.is_empty() {
        key.to_owned()
    } else {
        format!("{loc}.{key}")
    }
}

/// Reports every key of `table` that is not in `known`.
pub(crate) fn unknown_keys(table: &Table, loc: &str, known: &[&str], problems: &mut Mistakes) {
    for key in table.keys() {
        if !known.contains(&key.as_str()) {
            problems.add(
                at(loc, key),
                format!("unknown key (known here: {})", known.join(", ")),
            );
        }
    }
}

/// `Ok`'s value, or `None` with the error reported at `loc.key`.
pub(crate) fn check<T>(
    problems: &mut Mistakes,
    loc: &str,
    key: &str,
    r: Result<T, String>,
) -> Option<T> {
    r.map_err(|e| problems.add(at(loc, key), e)).ok()
}

/// A string field that must be there: when it is absent, `missing (HINT)`.
pub(crate) fn required<'a>(
    t: &'a Table,
    loc: &str,
    key: &str,
    hint: &str,
    p: &mut Mistakes,
) -> Option<&'a str> {
    let v = string(t, loc, key, p);
    if v.is_none() && !t.contains_key(key) {
        p.add(at(loc, key), format!("missing ({hint})"));
    }
    v
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

/// A string field.
pub(crate) fn string<'a>(
    table: &'a Table,
    loc: &str,
    key: &str,
    problems: &mut Mistakes,
) -> Option<&'a str> {
    match table.get(key)? {
        Value::String(s) => Some(s),
        other => {
            problems.add(
                at(loc, key),
                format!("expected a string, found {}", type_name(other)),
            );
            None
        }
    }
}

/// A non-negative integer field.
pub(crate) fn integer(table: &Table, loc: &str, key: &str, problems: &mut Mistakes) -> Option<u64> {
    match table.get(key)? {
        Value::Integer(n) if *n >= 0 => Some(*n as u64),
        Value::Integer(n) => {
            problems.add(at(loc, key), format!("{n} is negative"));
            None
        }
        other => {
            problems.add(
                at(loc, key),
                format!("expected an integer, found {}", type_name(other)),
            );
            None
        }
    }
}

/// An array of strings; each element's problem is reported at `key[i]`.
pub(crate) fn strings(
    table: &Table,
    loc: &str,
    key: &str,
    problems: &mut Mistakes,
) -> Option<Vec<String>> {
    match table.get(key)? {
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    other => problems.add(
                        format!("{}[{i}]", at(loc, key)),
                        format!("expected a string, found {}", type_name(other)),
                    ),
                }
            }
            Some(out)
        }
        other => {
            problems.add(
                at(loc, key),
                format!("expected an array of strings, found {}", type_name(other)),
            );
            None
        }
    }
}

/// A sub-table (`tls = { ... }`).
pub(crate) fn table<'a>(
    parent: &'a Table,
    loc: &str,
    key: &str,
    problems: &mut Mistakes,
) -> Option<&'a Table> {
    match parent.get(key)? {
        Value::Table(t) => Some(t),
        other => {
            problems.add(
                at(loc, key),
                format!("expected a table, found {}", type_name(other)),
            );
            None
        }
    }
}

/// An array of tables (`[[routes]]`).
pub(crate) fn tables<'a>(parent: &'a Table, key: &str, problems: &mut Mistakes) -> Vec<&'a Table> {
    match parent.get(key) {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Value::Table(t) => Some(t),
                other => {
                    problems.add(
                        format!("{key}[{i}]"),
                        format!("expected a table, found {}", type_name(other)),
                    );
                    None
                }
            })
            .collect(),
        Some(other) => {
            problems.add(
                key,
                format!(
                    "expected an array of tables ([[{key}]]), found {}",
                    type_name(other)
                ),
            );
            Vec::new()
        }
    }
}

/// A duration field (`500ms`, `20s`, `5m`, `3h`, `7d`).
pub(crate) fn duration(
    table: &Table,
    loc: &str,
    key: &str,
    problems: &mut Mistakes,
) -> Option<Duration> {
    let text = string(table, loc, key, problems)?;
    match oncely_core::parse_duration(text) {
        Ok(d) => Some(d),
        Err(e) => {
            problems.add(at(loc, key), e);
            None
        }
    }
}

/// A size field (`10MiB`, or a plain integer of bytes).
pub(crate) fn size(table: &Table, loc: &str, key: &str, problems: &mut Mistakes) -> Option<u64> {
    match table.get(key)? {
        Value::Integer(n) if *n >= 0 => Some(*n as u64),
        Value::String(text) => match oncely_core::parse_size(text) {
            Ok(n) => Some(n),
            Err(e) => {
                problems.add(at(loc, key), e);
                None
            }
        },
        other => {
            problems.add(
                at(loc, key),
                format!(
                    "expected a size such as \"10MiB\", found {}",
                    type_name(other)
                ),
            );
            None
        }
    }
}

/// Where a TOML syntax error is, as `LINE:COL` (1-based).
pub(crate) fn line_col(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("{line}:{col}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_getter_reports_at_its_location() {
        let t: Table = "a = 1\nb = \"x\"\nn = -1\n[s]\nk = 2\n".parse().unwrap();
        let mut p = Mistakes::default();
        assert_eq!(string(&t, "", "b", &mut p), Some("x"));
        assert_eq!(string(&t, "", "a", &mut p), None);
        assert_eq!(integer(&t, "", "n", &mut p), None);
        assert_eq!(required(&t, "", "missing", "a hint", &mut p), None);
        assert_eq!(check(&mut p, "s", "k", Err::<(), _>("bad".into())), None);
        unknown_keys(table(&t, "", "s", &mut p).unwrap(), "s", &["j"], &mut p);
        let got: Vec<String> = p.0.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "a: expected a string, found an integer",
                "n: -1 is negative",
                "missing: missing (a hint)",
                "s.k: bad",
                "s.k: unknown key (known here: j)",
            ]
        );
        assert_eq!(line_col("a\nbc", 3), "2:2");
    }
}
