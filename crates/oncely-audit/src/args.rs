//! The audit's settings: raw command-line strings in, one validated [`AuditArgs`] out.
//!
//! The binary hands over what the user typed ([`RawAuditArgs`]); [`RawAuditArgs::resolve`]
//! turns it into typed settings or a one-line reason (exit 2). Nothing deeper in the
//! crate looks at strings from the command line again.

use std::path::PathBuf;
use std::time::Duration;

use oncely_core::units::parse_duration;

use crate::AuditError;

/// The contract's default window: a repeat within three hours would have been replayed.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3 * 3600);

/// How far back in time a line may be, relative to the newest line seen, and still be put
/// in its place (see [`AuditArgs::reorder`]).
pub const DEFAULT_REORDER: Duration = Duration::from_secs(5 * 60);

/// How many of the most repeated requests the report lists.
pub const DEFAULT_TOP: usize = 10;

/// One of the fields the audit reads from a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// When the request started: RFC 3339, or a number of seconds / milliseconds since
    /// the epoch.
    Ts,
    /// The account the request was charged to.
    Principal,
    /// The HTTP method.
    Method,
    /// The path and query as sent.
    Path,
    /// The request body: a JSON value, or a string holding the body's text.
    Body,
    /// The body's SHA-256 (hex), for logs that do not keep bodies.
    BodySha256,
    /// Billing units charged for the request.
    Units,
    /// How long the original took, in milliseconds.
    DurationMs,
    /// The Idempotency-Key the client sent, if the log keeps it: a string or a number.
    /// Unless mapped, it is also read from the other spellings in [`Field::aliases`].
    IdempotencyKey,
}

impl Field {
    /// Every field, in the order they are documented.
    pub const ALL: [Field; 9] = [
        Field::Ts,
        Field::Principal,
        Field::Method,
        Field::Path,
        Field::Body,
        Field::BodySha256,
        Field::Units,
        Field::DurationMs,
        Field::IdempotencyKey,
    ];

    /// How many fields there are.
    pub(crate) const COUNT: usize = Field::ALL.len();

    /// The name used in `--field NAME=SOURCE` and, by default, in the log.
    pub fn name(self) -> &'static str {
        match self {
            Field::Ts => "ts",
            Field::Principal => "principal",
            Field::Method => "method",
            Field::Path => "path",
            Field::Body => "body",
            Field::BodySha256 => "body_sha256",
            Field::Units => "units",
            Field::DurationMs => "duration_ms",
            Field::IdempotencyKey => "idempotency_key",
        }
    }

    /// The other member names a field is read from when `--field` does not map it: the
    /// spellings logs give the Idempotency-Key header (`Idempotency-Key`,
    /// `idempotency-key`, `idempotencyKey`); none for the other fields.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            Field::IdempotencyKey => &["Idempotency-Key", "idempotency-key", "idempotencyKey"],
            _ => &[],
        }
    }

    fn from_name(name: &str) -> Option<Field> {
        Field::ALL.into_iter().find(|f| f.name() == name)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Where a field is found in a log line: a top-level member, optionally followed by a
/// JSON pointer into it (`--field principal=/auth/account`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The top-level member's name.
    pub member: String,
    /// The rest of the pointer inside that member (`/account`), if any.
    pub inner: Option<String>,
}

impl Source {
    /// Reads a source as written after `NAME=`: a plain member name, or a JSON pointer
    /// (RFC 6901) starting with `/`.
    pub fn parse(text: &str) -> Result<Source, String> {
        if text.is_empty() {
            return Err("a --field source must not be empty".into());
        }
        let Some(pointer) = text.strip_prefix('/') else {
            return Ok(Source {
                member: text.to_string(),
                inner: None,
            });
        };
        let (first, rest) = match pointer.find('/') {
            Some(i) => (&pointer[..i], Some(pointer[i..].to_string())),
            None => (pointer, None),
        };
        let member = first.replace("~1", "/").replace("~0", "~");
        Ok(Source {
            member,
            inner: rest,
        })
    }

    fn plain(name: &str) -> Source {
        Source {
            member: name.to_string(),
            inner: None,
        }
    }
}

/// Where each [`Field`] is read from. By default every field is the member of its own name
/// (and of its [aliases](Field::aliases)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldMap {
    sources: [Source; Field::COUNT],
    /// Fields given a source with `--field` (their aliases are then not read).
    mapped: [bool; Field::COUNT],
}

impl Default for FieldMap {
    fn default() -> FieldMap {
        FieldMap {
            sources: Field::ALL.map(|f| Source::plain(f.name())),
            mapped: [false; Field::COUNT],
        }
    }
}

impl FieldMap {
    /// Reads `--field NAME=SOURCE` arguments over the defaults.
    pub fn parse<S: AsRef<str>>(specs: &[S]) -> Result<FieldMap, String> {
        let mut map = FieldMap::default();
        for spec in specs {
            let spec = spec.as_ref();
            let (name, source) = spec.split_once('=').ok_or_else(|| {
                format!("--field {spec:?} is not NAME=SOURCE (e.g. --field principal=account)")
            })?;
            let field = Field::from_name(name.trim()).ok_or_else(|| {
                format!(
                    "--field {spec:?}: unknown field name {name:?} (one of {})",
                    Field::ALL.map(Field::name).join(", ")
                )
            })?;
            let source =
                Source::parse(source.trim()).map_err(|e| format!("--field {spec:?}: {e}"))?;
            map.set(field, source);
        }
        Ok(map)
    }

    /// Reads `field` from `source` instead (and no longer from its aliases).
    pub fn set(&mut self, field: Field, source: Source) {
        self.sources[field.index()] = source;
        self.mapped[field.index()] = true;
    }

    /// Where `field` is read from.
    pub fn source(&self, field: Field) -> &Source {
        &self.sources[field.index()]
    }

    /// Every place `field` is read from: its source, then, unless it was mapped, the
    /// members named by its [aliases](Field::aliases).
    pub fn sources(&self, field: Field) -> impl Iterator<Item = Source> + '_ {
        let aliases = if self.mapped[field.index()] {
            &[][..]
        } else {
            field.aliases()
        };
        std::iter::once(self.source(field).clone()).chain(aliases.iter().map(|a| Source::plain(a)))
    }
}

/// The settings of one audit, validated.
#[derive(Debug, Clone)]
pub struct AuditArgs {
    /// The logs, read as one stream; `-` is standard input. Plain or gzip, detected by
    /// content.
    pub files: Vec<PathBuf>,
    /// A request repeats an original when it starts before the original's completion
    /// (`ts + duration_ms`) plus this window.
    pub window: Duration,
    /// Where each field is read from.
    pub fields: FieldMap,
    /// JSON pointers left out of a JSON body before comparison.
    pub ignore_fields: Vec<String>,
    /// Money per unit; when given, `credit` is money rather than units.
    pub price_per_unit: Option<f64>,
    /// Writes one line per principal to credit here.
    pub credits_csv: Option<PathBuf>,
    /// One JSON document on standard output instead of the human report.
    pub json: bool,
    /// Draw a progress bar on the terminal (hidden when standard error is not one).
    pub progress: bool,
    /// Lines whose time is at most this much before the newest line seen are put back in
    /// time order; older stragglers are taken as they come and counted as out of order.
    pub reorder: Duration,
    /// How many of the most repeated requests to list.
    pub top: usize,
    /// How many repeats to keep, per principal, for statements (in time order; 0 keeps
    /// none). The sums count every repeat whatever this is.
    pub listed_repeats: usize,
}

impl AuditArgs {
    /// The defaults for these files: window 3h, the contract's field names, no price.
    pub fn new(files: Vec<PathBuf>) -> AuditArgs {
        AuditArgs {
            files,
            window: DEFAULT_WINDOW,
            fields: FieldMap::default(),
            ignore_fields: Vec::new(),
            price_per_unit: None,
            credits_csv: None,
            json: false,
            progress: false,
            reorder: DEFAULT_REORDER,
            top: DEFAULT_TOP,
            listed_repeats: 0,
        }
    }
}

/// The audit's arguments exactly as typed, before validation.
#[derive(Debug, Clone, Default)]
pub struct RawAuditArgs {
    /// `FILE...` (`-` for standard input).
    pub files: Vec<String>,
    /// `--window DURATION` (default `3h`).
    pub window: Option<String>,
    /// Each `--field NAME=SOURCE`.
    pub fields: Vec<String>,
    /// Each `--ignore-field POINTER`.
    pub ignore_fields: Vec<String>,
    /// `--price-per-unit P`.
    pub price_per_unit: Option<String>,
    /// `--credits-csv FILE`.
    pub credits_csv: Option<String>,
    /// `--json`.
    pub json: bool,
    /// Whether to draw a progress bar (the binary passes "standard error is a terminal and
    /// not --json").
    pub progress: bool,
    /// `--reorder DURATION` (default `5m`).
    pub reorder: Option<String>,
    /// `--top N` (default 10).
    pub top: Option<String>,
}

impl RawAuditArgs {
    /// Validates everything; the error is one line, meant for exit code 2.
    pub fn resolve(self) -> Result<AuditArgs, AuditError> {
        let bad = AuditError::Argument;
        if self.files.is_empty() {
            return Err(bad(
                "audit needs at least one FILE (or - for standard input)".into(),
            ));
        }
        if self.files.iter().filter(|f| f.as_str() == "-").count() > 1 {
            return Err(bad("standard input (-) can be read only once".into()));
        }
        if let Some(empty) = self.files.iter().find(|f| f.is_empty()) {
            return Err(bad(format!("empty file name {empty:?}")));
        }
        let window = match &self.window {
            Some(w) => parse_duration(w).map_err(|e| bad(format!("--window: {e}")))?,
            None => DEFAULT_WINDOW,
        };
        if window.is_zero() {
            return Err(bad("--window must be longer than 0".into()));
        }
        let reorder = match &self.reorder {
            Some(w) => parse_duration(w).map_err(|e| bad(format!("--reorder: {e}")))?,
            None => DEFAULT_REORDER,
        };
        let fields = FieldMap::parse(&self.fields).map_err(bad)?;
        for pointer in &self.ignore_fields {
            if !pointer.starts_with('/') {
                return Err(bad(format!(
                    "--ignore-field {pointer:?} is not a JSON pointer (write e.g. /request_id)"
                )));
            }
        }
        let price_per_unit = match &self.price_per_unit {
            Some(p) => {
                let value: f64 = p.trim().parse().map_err(|_| {
                    bad(format!(
                        "--price-per-unit {p:?} is not a number (e.g. 0.00003)"
                    ))
                })?;
                if !value.is_finite() || value < 0.0 {
                    return Err(bad(format!(
                        "--price-per-unit {p:?} must be a finite number of at least 0"
                    )));
                }
                Some(value)
            }
            None => None,
        };
        let top = match &self.top {
            Some(t) => t
                .trim()
                .parse::<usize>()
                .map_err(|_| bad(format!("--top {t:?} is not a whole number")))?,
            None => DEFAULT_TOP,
        };
        if let Some(csv) = &self.credits_csv {
            if csv.is_empty() {
                return Err(bad("--credits-csv needs a file name".into()));
            }
        }
        Ok(AuditArgs {
            files: self.files.into_iter().map(PathBuf::from).collect(),
            window,
            fields,
            ignore_fields: self.ignore_fields,
            price_per_unit,
            credits_csv: self.credits_csv.map(PathBuf::from),
            json: self.json,
            progress: self.progress,
            reorder,
            top,
            listed_repeats: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(files: &[&str]) -> RawAuditArgs {
        RawAuditArgs {
            files: files.iter().map(|s| s.to_string()).collect(),
            ..RawAuditArgs::default()
        }
    }

    fn reason(r: RawAuditArgs) -> String {
        let e = r.resolve().unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let text = e.to_string();
        assert!(!text.contains('\n'));
        text
    }

    #[test]
    fn defaults_follow_the_contract() {
        let a = raw(&["log.jsonl"]).resolve().unwrap();
        assert_eq!(a.window, Duration::from_secs(10_800));
        assert_eq!(a.fields, FieldMap::default());
        assert_eq!(a.fields.source(Field::BodySha256).member, "body_sha256");
        assert_eq!(a.price_per_unit, None);
        assert_eq!(a.top, 10);
    }

    #[test]
    fn fields_are_mapped_by_name_or_pointer() {
        let mut r = raw(&["-"]);
        r.fields = vec![
            "principal=account".into(),
            "ts=/meta/time".into(),
            "body=/a~1b".into(),
        ];
        r.window = Some("90s".into());
        r.price_per_unit = Some("0.00003".into());
        let a = r.resolve().unwrap();
        assert_eq!(a.window, Duration::from_secs(90));
        assert_eq!(a.price_per_unit, Some(0.00003));
        assert_eq!(a.fields.source(Field::Principal), &Source::plain("account"));
        assert_eq!(
            a.fields.source(Field::Ts),
            &Source {
                member: "meta".into(),
                inner: Some("/time".into())
            }
        );
        assert_eq!(a.fields.source(Field::Body), &Source::plain("a/b"));
        assert_eq!(a.fields.source(Field::Method), &Source::plain("method"));
    }

    #[test]
    fn the_idempotency_key_has_other_spellings_until_it_is_mapped() {
        let members = |map: &FieldMap| -> Vec<String> {
            map.sources(Field::IdempotencyKey)
                .map(|s| s.member)
                .collect()
        };
        let default = FieldMap::default();
        assert_eq!(
            members(&default),
            [
                "idempotency_key",
                "Idempotency-Key",
                "idempotency-key",
                "idempotencyKey"
            ]
        );
        assert_eq!(
            default.sources(Field::Principal).collect::<Vec<_>>(),
            [Source::plain("principal")]
        );
        let mapped = FieldMap::parse(&["idempotency_key=/headers/idem"]).unwrap();
        assert_eq!(
            mapped.sources(Field::IdempotencyKey).collect::<Vec<_>>(),
            [Source {
                member: "headers".into(),
                inner: Some("/idem".into())
            }]
        );
    }

    #[test]
    fn bad_arguments_get_one_line_reasons() {
        assert!(reason(raw(&[])).contains("at least one FILE"));
        assert!(reason(raw(&["-", "-"])).contains("only once"));
        let mut r = raw(&["x"]);
        r.window = Some("3 hours".into());
        assert!(reason(r).starts_with("--window:"));
        let mut r = raw(&["x"]);
        r.window = Some("0s".into());
        assert!(reason(r).contains("longer than 0"));
        let mut r = raw(&["x"]);
        r.fields = vec!["tz=time".into()];
        assert!(reason(r).contains("unknown field name \"tz\""));
        let mut r = raw(&["x"]);
        r.fields = vec!["principal".into()];
        assert!(reason(r).contains("NAME=SOURCE"));
        let mut r = raw(&["x"]);
        r.fields = vec!["principal=".into()];
        assert!(reason(r).contains("must not be empty"));
        let mut r = raw(&["x"]);
        r.ignore_fields = vec!["request_id".into()];
        assert!(reason(r).contains("not a JSON pointer"));
        for p in ["cheap", "-1", "NaN", "inf"] {
            let mut r = raw(&["x"]);
            r.price_per_unit = Some(p.into());
            assert!(reason(r).starts_with("--price-per-unit"), "{p}");
        }
        let mut r = raw(&["x"]);
        r.top = Some("ten".into());
        assert!(reason(r).starts_with("--top"));
    }
}
