//! `multipart/form-data` bodies read as their parts, for the fingerprint.
//!
//! A part is what RFC 7578 says a form field is: its `name` and optional `filename` (the
//! `Content-Disposition: form-data` parameters), its optional `Content-Type` and its
//! content. The framing is not: the boundary, the preamble, the epilogue, transport
//! padding after a delimiter and every other part header, so that an SDK that retries an
//! upload with a new boundary sends the same parts. Contents are slices of the body, never
//! copied: a 25 MB upload is read (and hashed) where it lies.
//!
//! The reading is strict (RFC 2046 section 5.1.1): lines end in CRLF; the body is
//! `[preamble CRLF] --boundary padding CRLF part (CRLF --boundary padding CRLF part)*
//! CRLF --boundary-- padding [CRLF epilogue]`; a boundary that appears at the start of a
//! line inside a part, a folded header line, a header given twice, a part without a
//! `form-data` name, a `filename*` (RFC 7578 section 4.2 forbids it) and a missing close
//! delimiter are each [`Malformed`]. The fingerprint then hashes the body as bytes: a
//! malformed body is never refused, and never read in a way its receiver might not.

use std::borrow::Cow;

use memchr::memmem;

/// The longest boundary RFC 2046 allows.
const MAX_BOUNDARY: usize = 70;

/// One part of a `multipart/form-data` body: what the fingerprint covers of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part<'a> {
    /// The `name` parameter of its `Content-Disposition`, quoted-string escapes undone.
    pub name: Cow<'a, [u8]>,
    /// The `filename` parameter, escapes undone; `None` when absent (unlike empty).
    pub filename: Option<Cow<'a, [u8]>>,
    /// Its `Content-Type` header value without surrounding white space; `None` when
    /// absent (unlike empty).
    pub content_type: Option<&'a [u8]>,
    /// Its content: a slice of the body.
    pub content: &'a [u8],
}

/// Why a body is not a well-formed `multipart/form-data` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformed {
    /// No line starts with `--boundary`.
    #[error("no boundary delimiter line")]
    NoDelimiter,
    /// A delimiter line with more than white space after the boundary (the boundary at
    /// the start of a line inside a part, or a longer boundary).
    #[error("a delimiter line with more than white space after the boundary")]
    DelimiterLine,
    /// A part header that is not `name: value` on one line.
    #[error("a part header that is not `name: value` on one line")]
    Header,
    /// A part without a `Content-Disposition: form-data` with a `name`, or with a
    /// `filename*`, or with parameters that do not parse.
    #[error("a part without a form-data Content-Disposition naming it")]
    Disposition,
    /// A part with two `Content-Disposition` or `Content-Type` headers, or a parameter
    /// given twice.
    #[error("a part header or parameter given twice")]
    Repeated,
    /// The body ends before the close delimiter.
    #[error("no close delimiter")]
    Unclosed,
    /// More than white space after the close delimiter on its line.
    #[error("text after the close delimiter on its line")]
    AfterClose,
}

/// The boundary of a `multipart/form-data` `Content-Type` header value: `None` when the
/// media type (compared case-insensitively) is another, when the parameters do not parse,
/// or when there is not exactly one `boundary` parameter of 1 to 70 characters of RFC
/// 2046's `bchars` (not ending in a space).
///
/// ```
/// use oncely_core::multipart::boundary;
/// assert_eq!(boundary(b"Multipart/Form-Data; boundary=\"a b\"").as_deref(), Some(&b"a b"[..]));
/// assert_eq!(boundary(b"multipart/form-data; boundary=x1").as_deref(), Some(&b"x1"[..]));
/// assert_eq!(boundary(b"multipart/mixed; boundary=x1"), None);
/// ```
pub fn boundary(content_type: &[u8]) -> Option<Cow<'_, [u8]>> {
    let (media_type, params) = split_value(content_type);
    if !media_type.eq_ignore_ascii_case(b"multipart/form-data") {
        return None;
    }
    let mut found = None;
    for param in Params(params) {
        let (name, value) = param.ok()?;
        if name.eq_ignore_ascii_case(b"boundary") && found.replace(value).is_some() {
            return None;
        }
    }
    let found = found?;
    let valid = !found.is_empty()
        && found.len() <= MAX_BOUNDARY
        && found.last() != Some(&b' ')
        && found.iter().all(|&b| is_bchar(b));
    valid.then_some(found)
}

/// The parts of `body`, in order, read with `boundary` (as [`boundary`] returns it). The
/// iterator ends after the first error.
///
/// ```
/// use oncely_core::multipart::parts;
/// let body = b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--b--\r\n";
/// let read: Vec<_> = parts(body, b"b").collect::<Result<_, _>>().unwrap();
/// assert_eq!((&read[0].name[..], read[0].content), (&b"a"[..], &b"1"[..]));
/// ```
pub fn parts<'a>(body: &'a [u8], boundary: &[u8]) -> Parts<'a> {
    let mut delimiter = Vec::with_capacity(boundary.len() + 4);
    delimiter.extend_from_slice(b"\r\n--");
    delimiter.extend_from_slice(boundary);
    Parts {
        body,
        finder: memmem::Finder::new(&delimiter).into_owned(),
        at: Position::Start,
    }
}

/// The iterator [`parts`] returns.
#[derive(Debug, Clone)]
pub struct Parts<'a> {
    body: &'a [u8],
    /// Finds `CRLF --boundary`, the delimiter that ends a part.
    finder: memmem::Finder<'static>,
    at: Position,
}

#[derive(Debug, Clone, Copy)]
enum Position {
    /// Before the first delimiter (in the preamble).
    Start,
    /// Just after the `--boundary` of a delimiter, at this offset.
    AfterBoundary(usize),
    /// Past the close delimiter, or past an error.
    Done,
}

impl<'a> Iterator for Parts<'a> {
    type Item = Result<Part<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        let result = self.step();
        if !matches!(result, Some(Ok(_))) {
            self.at = Position::Done;
        }
        result
    }
}

impl<'a> Parts<'a> {
    fn step(&mut self) -> Option<Result<Part<'a>, Malformed>> {
        let body = self.body;
        let after = match self.at {
            Position::Done => return None,
            Position::Start => {
                // The first delimiter has no CRLF before it when there is no preamble.
                let dash_boundary = &self.finder.needle()[2..];
                if body.starts_with(dash_boundary) {
                    dash_boundary.len()
                } else {
                    match self.finder.find(body) {
                        Some(i) => i + self.finder.needle().len(),
                        None => return Some(Err(Malformed::NoDelimiter)),
                    }
                }
            }
            Position::AfterBoundary(at) => at,
        };
        let rest = &body[after..];
        if let Some(close) = rest.strip_prefix(b"--") {
            // The close delimiter: padding, then the end or a line break and the epilogue.
            let close = trim_padding(close);
            return if close.is_empty() || close.starts_with(b"\r\n") {
                None
            } else {
                Some(Err(Malformed::AfterClose))
            };
        }
        let Some(start) = trim_padding(rest).strip_prefix(b"\r\n") else {
            return Some(Err(Malformed::DelimiterLine));
        };
        let start = body.len() - start.len();
        let Some(len) = self.finder.find(&body[start..]) else {
            return Some(Err(Malformed::Unclosed));
        };
        let end = start + len;
        self.at = Position::AfterBoundary(end + self.finder.needle().len());
        Some(part(&body[start..end]))
    }
}

/// Reads one part: its header lines, an empty line, its content.
fn part(region: &[u8]) -> Result<Part<'_>, Malformed> {
    // Headers end with an empty line; a part that ends right after its last header line
    // (the delimiter's CRLF being the empty line) has empty content.
    let (head, content) = if region.starts_with(b"\r\n") {
        (&region[..0], &region[2..])
    } else if let Some(i) = memmem::find(region, b"\r\n\r\n") {
        (&region[..i + 2], &region[i + 4..])
    } else if region.ends_with(b"\r\n") {
        (region, &region[region.len()..])
    } else {
        return Err(Malformed::Header);
    };
    let mut disposition = None;
    let mut content_type = None;
    for line in head.split_inclusive(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r\n").ok_or(Malformed::Header)?;
        let (name, value) = header(line)?;
        let slot = if name.eq_ignore_ascii_case(b"content-disposition") {
            &mut disposition
        } else if name.eq_ignore_ascii_case(b"content-type") {
            &mut content_type
        } else {
            continue;
        };
        if slot.replace(value).is_some() {
            return Err(Malformed::Repeated);
        }
    }
    let Disposition { name, filename } = form_data(disposition.ok_or(Malformed::Disposition)?)?;
    Ok(Part {
        name,
        filename,
        content_type,
        content,
    })
}

/// One header line as name and value (white space around the value removed). A line that
/// starts with white space (an obsolete folded continuation) is refused.
fn header(line: &[u8]) -> Result<(&[u8], &[u8]), Malformed> {
    let colon = memchr::memchr(b':', line).ok_or(Malformed::Header)?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    let clean = |b: &u8| !matches!(b, b'\r' | b'\n');
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) || !value.iter().all(clean) {
        return Err(Malformed::Header);
    }
    Ok((name, trim_ows(value)))
}

/// The `name` and `filename` of a `Content-Disposition: form-data` value.
fn form_data(value: &[u8]) -> Result<Disposition<'_>, Malformed> {
    let (kind, params) = split_value(value);
    if !kind.eq_ignore_ascii_case(b"form-data") {
        return Err(Malformed::Disposition);
    }
    let (mut name, mut filename) = (None, None);
    for param in Params(params) {
        let (key, value) = param.map_err(|()| Malformed::Disposition)?;
        let slot = if key.eq_ignore_ascii_case(b"name") {
            &mut name
        } else if key.eq_ignore_ascii_case(b"filename") {
            &mut filename
        } else if key.eq_ignore_ascii_case(b"filename*") {
            return Err(Malformed::Disposition);
        } else {
            continue;
        };
        if slot.replace(value).is_some() {
            return Err(Malformed::Repeated);
        }
    }
    Ok(Disposition {
        name: name.ok_or(Malformed::Disposition)?,
        filename,
    })
}

/// What a `Content-Disposition: form-data` says of a part.
struct Disposition<'a> {
    name: Cow<'a, [u8]>,
    filename: Option<Cow<'a, [u8]>>,
}

/// A parameter's name and value.
type Param<'a> = (&'a [u8], Cow<'a, [u8]>);

/// Splits a header value at its first `;`: the leading token (white space removed) and
/// the parameters after it (starting with that `;`).
fn split_value(value: &[u8]) -> (&[u8], &[u8]) {
    let i = memchr::memchr(b';', value).unwrap_or(value.len());
    (trim_ows(&value[..i]), &value[i..])
}

/// The `; name=value` parameters of a header value (RFC 9110 section 5.6.6), values as
/// tokens or quoted strings; empty ones (`;;`, a trailing `;`) are skipped.
struct Params<'a>(&'a [u8]);

impl<'a> Iterator for Params<'a> {
    type Item = Result<Param<'a>, ()>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let rest = trim_ows(self.0);
            if rest.is_empty() {
                return None;
            }
            let Some(rest) = rest.strip_prefix(b";") else {
                self.0 = &[];
                return Some(Err(()));
            };
            let rest = trim_start_ows(rest);
            if rest.is_empty() || rest[0] == b';' {
                self.0 = rest;
                continue;
            }
            let result = param(rest);
            self.0 = match result {
                Ok((_, after)) => after,
                Err(()) => &[],
            };
            return Some(result.map(|(param, _)| param));
        }
    }
}

/// One `name=value` at the start of `text`, and what follows it.
fn param(text: &[u8]) -> Result<(Param<'_>, &[u8]), ()> {
    let name_len = text.iter().take_while(|&&b| is_tchar(b)).count();
    let (name, rest) = text.split_at(name_len);
    let rest = rest.strip_prefix(b"=").ok_or(())?;
    if name.is_empty() {
        return Err(());
    }
    if rest.first() == Some(&b'"') {
        let (value, after) = quoted_string(&rest[1..])?;
        return Ok(((name, value), after));
    }
    let value_len = rest.iter().take_while(|&&b| is_tchar(b)).count();
    if value_len == 0 {
        return Err(());
    }
    Ok((
        (name, Cow::Borrowed(&rest[..value_len])),
        &rest[value_len..],
    ))
}

/// The rest of a quoted string after its opening quote: its value with `\` escapes
/// undone (borrowed when there is none), and what follows the closing quote.
fn quoted_string(text: &[u8]) -> Result<(Cow<'_, [u8]>, &[u8]), ()> {
    let allowed = |b: u8| b == b'\t' || (b >= 0x20 && b != 0x7f);
    let end = memchr::memchr2(b'"', b'\\', text).ok_or(())?;
    if text[..end].iter().any(|&b| !allowed(b)) {
        return Err(());
    }
    if text[end] == b'"' {
        return Ok((Cow::Borrowed(&text[..end]), &text[end + 1..]));
    }
    let mut value = text[..end].to_vec();
    let mut i = end;
    loop {
        match text.get(i) {
            Some(b'"') => return Ok((Cow::Owned(value), &text[i + 1..])),
            Some(b'\\') => match text.get(i + 1) {
                Some(&b) if allowed(b) => {
                    value.push(b);
                    i += 2;
                }
                _ => return Err(()),
            },
            Some(&b) if allowed(b) => {
                value.push(b);
                i += 1;
            }
            _ => return Err(()),
        }
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// RFC 2046's `bchars`: what a boundary is made of.
fn is_bchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"'()+_,-./:=? ".contains(&b)
}

fn is_ows(b: &u8) -> bool {
    matches!(b, b' ' | b'\t')
}

fn trim_start_ows(text: &[u8]) -> &[u8] {
    let start = text.iter().take_while(|b| is_ows(b)).count();
    &text[start..]
}

fn trim_ows(text: &[u8]) -> &[u8] {
    let text = trim_start_ows(text);
    let end = text.len() - text.iter().rev().take_while(|b| is_ows(b)).count();
    &text[..end]
}

/// Transport padding: the white space RFC 2046 allows after a boundary.
fn trim_padding(text: &[u8]) -> &[u8] {
    trim_start_ows(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fingerprint, FingerprintBuilder};
    use proptest::prelude::*;

    /// A part as a test writes it.
    #[derive(Debug, Clone, PartialEq)]
    struct Field {
        name: Vec<u8>,
        filename: Option<Vec<u8>>,
        content_type: Option<Vec<u8>>,
        content: Vec<u8>,
    }

    fn field(
        name: &str,
        filename: Option<&str>,
        content_type: Option<&str>,
        content: &[u8],
    ) -> Field {
        Field {
            name: name.into(),
            filename: filename.map(Into::into),
            content_type: content_type.map(Into::into),
            content: content.to_vec(),
        }
    }

    /// How a sender frames the parts. The plain framing is what SDKs send; the odd one
    /// uses every freedom the format allows.
    #[derive(Debug, Clone)]
    struct Framing {
        boundary: String,
        preamble: Option<Vec<u8>>,
        epilogue: Option<Vec<u8>>,
        padding: String,
        odd: bool,
    }

    fn plain(boundary: &str) -> Framing {
        Framing {
            boundary: boundary.into(),
            preamble: None,
            epilogue: None,
            padding: String::new(),
            odd: false,
        }
    }

    fn quote(text: &[u8], escape_all: bool) -> Vec<u8> {
        let mut out = vec![b'"'];
        for &b in text {
            if escape_all || b == b'"' || b == b'\\' {
                out.push(b'\\');
            }
            out.push(b);
        }
        out.push(b'"');
        out
    }

    fn encode(fields: &[Field], f: &Framing) -> (String, Vec<u8>) {
        let content_type = if f.odd {
            format!(
                "Multipart/Form-Data ;charset=utf-8;  BOUNDARY={}",
                String::from_utf8(quote(f.boundary.as_bytes(), false)).unwrap()
            )
        } else if f.boundary.bytes().all(is_tchar) {
            format!("multipart/form-data; boundary={}", f.boundary)
        } else {
            format!("multipart/form-data; boundary=\"{}\"", f.boundary)
        };
        let mut body = Vec::new();
        if let Some(preamble) = &f.preamble {
            body.extend_from_slice(preamble);
            body.extend_from_slice(b"\r\n");
        }
        for field in fields {
            body.extend_from_slice(format!("--{}{}\r\n", f.boundary, f.padding).as_bytes());
            let mut disposition = b"form-data".to_vec();
            let mut params = vec![(&b"name"[..], &field.name)];
            if let Some(filename) = &field.filename {
                params.push((b"filename", filename));
            }
            if f.odd {
                params.reverse();
                disposition = b"Form-Data; size=3".to_vec();
            }
            for (key, value) in params {
                disposition.extend_from_slice(if f.odd { b" ;\t" } else { b"; " });
                disposition.extend_from_slice(key);
                disposition.push(b'=');
                disposition.extend_from_slice(&quote(value, f.odd));
            }
            if f.odd {
                body.extend_from_slice(b"X-Request-Part: 1\r\n");
            }
            let name = if f.odd {
                "content-DISPOSITION"
            } else {
                "Content-Disposition"
            };
            body.extend_from_slice(format!("{name}:{}", if f.odd { "  " } else { " " }).as_bytes());
            body.extend_from_slice(&disposition);
            body.extend_from_slice(if f.odd { b" \r\n" } else { b"\r\n" });
            if let Some(content_type) = &field.content_type {
                body.extend_from_slice(if f.odd {
                    b"content-type:\t"
                } else {
                    b"Content-Type: "
                });
                body.extend_from_slice(content_type);
                body.extend_from_slice(b"\r\n");
            }
            if f.odd {
                body.extend_from_slice(b"Content-Transfer-Encoding: binary\r\n");
            }
            body.extend_from_slice(b"\r\n");
            body.extend_from_slice(&field.content);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{}--{}", f.boundary, f.padding).as_bytes());
        match &f.epilogue {
            Some(epilogue) => {
                body.extend_from_slice(b"\r\n");
                body.extend_from_slice(epilogue);
            }
            None if !f.odd => body.extend_from_slice(b"\r\n"),
            None => {}
        }
        (content_type, body)
    }

    fn read(body: &[u8], boundary: &str) -> Result<Vec<Field>, Malformed> {
        parts(body, boundary.as_bytes())
            .map(|part| {
                part.map(|p| Field {
                    name: p.name.into_owned(),
                    filename: p.filename.map(Cow::into_owned),
                    content_type: p.content_type.map(<[u8]>::to_vec),
                    content: p.content.to_vec(),
                })
            })
            .collect()
    }

    fn fp_with(content_type: &str, body: &[u8], ignore: &[&str]) -> Fingerprint {
        let ignore: Vec<String> = ignore.iter().map(|s| s.to_string()).collect();
        FingerprintBuilder::new("acct", "POST", "/v1/audio").request_body(
            Some(content_type.as_bytes()),
            body,
            &ignore,
        )
    }

    fn fp(fields: &[Field], framing: &Framing) -> Fingerprint {
        let (content_type, body) = encode(fields, framing);
        fp_with(&content_type, &body, &[])
    }

    fn bytes_fp(body: &[u8]) -> Fingerprint {
        FingerprintBuilder::new("acct", "POST", "/v1/audio").body(body, &[])
    }

    fn upload() -> Vec<Field> {
        vec![
            field("model", None, None, b"whisper-1"),
            field(
                "file",
                Some("talk.mp3"),
                Some("audio/mpeg"),
                b"ID3\x04\0\r\n--x\r\n\0\xff",
            ),
            field("note", None, Some("text/plain; charset=utf-8"), b""),
        ]
    }

    #[test]
    fn reads_each_part_as_written() {
        let body = b"preamble\r\n--b  \r\nContent-Disposition: form-data; name=\"a\\\"q\"; filename=\"\"\r\n\
              Content-Type: text/plain\r\n\r\nline 1\r\nline 2\r\n--b\r\nContent-Disposition: form-data; name=b\r\n\r\n--b--\t\r\nepilogue";
        let read = read(body, "b").unwrap();
        assert_eq!(
            read,
            vec![
                field("a\"q", Some(""), Some("text/plain"), b"line 1\r\nline 2"),
                field("b", None, None, b""),
            ]
        );
        // Contents are slices of the body.
        let part = parts(body, b"b").next().unwrap().unwrap();
        assert!(body.as_ptr_range().contains(&part.content.as_ptr()));
        assert!(matches!(part.name, Cow::Owned(_)));
        // A body with no parts, as a browser sends an empty form.
        assert_eq!(read_ok(b"--b--\r\n"), vec![]);
    }

    fn read_ok(body: &[u8]) -> Vec<Field> {
        read(body, "b").unwrap()
    }

    #[test]
    fn boundary_of_the_content_type() {
        let b =
            |ct: &str| boundary(ct.as_bytes()).map(|b| String::from_utf8(b.into_owned()).unwrap());
        assert_eq!(
            b("multipart/form-data; boundary=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(
            b("MULTIPART/form-DATA;BOUNDARY=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(
            b(" multipart/form-data ; charset=utf-8 ; boundary=\"a b:c\" ").as_deref(),
            Some("a b:c")
        );
        assert_eq!(
            b("multipart/form-data; boundary=\"a\\bc\"").as_deref(),
            Some("abc")
        );
        assert_eq!(
            b(&format!("multipart/form-data; boundary={}", "x".repeat(70))).map(|s| s.len()),
            Some(70)
        );
        for refused in [
            "multipart/form-data",
            "multipart/form-data; boundary=",
            "multipart/form-data; boundary=\"\"",
            "multipart/form-data; boundary=a; boundary=a",
            "multipart/form-data; boundary=\"a \"",
            "multipart/form-data; boundary=\"a\"b",
            "multipart/form-data; boundary=\"a",
            "multipart/form-data; boundary=a*b",
            "multipart/form-data; boundary = a",
            "multipart/form-data boundary=a",
            "multipart/mixed; boundary=a",
            "application/json; boundary=a",
        ] {
            assert_eq!(b(refused), None, "{refused}");
        }
        assert_eq!(
            b(&format!("multipart/form-data; boundary={}", "x".repeat(71))),
            None
        );
    }

    #[test]
    fn the_framing_does_not_count() {
        let base = fp(&upload(), &plain("x1"));
        assert_eq!(
            base,
            fp(&upload(), &plain("----WebKitFormBoundary7MA4YWxkTrZu0gW"))
        );
        let odd = Framing {
            boundary: "retry 2 (a:b)".into(),
            preamble: Some(b"This is a multi-part message.\r\n\r\nIgnore me.".to_vec()),
            epilogue: Some(b"\r\n--retry 2 (a:b)\r\nanything".to_vec()),
            padding: " \t ".into(),
            odd: true,
        };
        assert_eq!(base, fp(&upload(), &odd));
        // Headers without content: the delimiter's line break ends the headers.
        let short = b"--b\r\nContent-Disposition: form-data; name=note\r\nContent-Type: text/plain\r\n\r\n--b--";
        let (ct, long) = encode(&[field("note", None, Some("text/plain"), b"")], &plain("b"));
        assert_eq!(fp_with(&ct, short, &[]), fp_with(&ct, &long, &[]));
    }

    #[test]
    fn every_part_of_a_part_counts() {
        let base = fp(&upload(), &plain("x1"));
        let changed = |change: &dyn Fn(&mut Vec<Field>)| {
            let mut fields = upload();
            change(&mut fields);
            fp(&fields, &plain("x1"))
        };
        assert_ne!(base, changed(&|f| f[0].name = b"Model".to_vec()));
        assert_ne!(
            base,
            changed(&|f| f[1].filename = Some(b"talk.wav".to_vec()))
        );
        assert_ne!(
            base,
            changed(&|f| f[1].content_type = Some(b"audio/wav".to_vec()))
        );
        assert_ne!(base, changed(&|f| f[1].content.push(0)));
        assert_ne!(base, changed(&|f| f.swap(0, 2)));
        assert_ne!(base, changed(&|f| f.truncate(2)));
        // Absent is not empty.
        assert_ne!(base, changed(&|f| f[0].filename = Some(Vec::new())));
        assert_ne!(base, changed(&|f| f[0].content_type = Some(Vec::new())));
        // Bytes do not move between fields.
        let one = changed(&|f| {
            f[0].name = b"mo".to_vec();
            f[0].content = b"delwhisper-1".to_vec();
        });
        assert_ne!(base, one);
        // A multipart body never shares a fingerprint with its bytes.
        let (ct, body) = encode(&upload(), &plain("x1"));
        assert_ne!(fp_with(&ct, &body, &[]), bytes_fp(&body));
    }

    #[test]
    fn ignored_parts_do_not_count() {
        let (ct, body) = encode(&upload(), &plain("x1"));
        let mut without = upload();
        without.remove(2);
        let (_, shorter) = encode(&without, &plain("x1"));
        assert_eq!(fp_with(&ct, &body, &["/note"]), fp_with(&ct, &shorter, &[]));
        assert_eq!(
            fp_with(&ct, &body, &["/note", "/absent"]),
            fp_with(&ct, &shorter, &["/x"])
        );
        assert_ne!(
            fp_with(&ct, &body, &["/note/x"]),
            fp_with(&ct, &shorter, &[])
        );
        assert_ne!(fp_with(&ct, &body, &["note"]), fp_with(&ct, &shorter, &[]));
        let escaped = [
            field("a/b~c", None, None, b"1"),
            field("k", None, None, b"2"),
        ];
        let (ct, body) = encode(&escaped, &plain("x1"));
        let (_, shorter) = encode(&escaped[1..], &plain("x1"));
        assert_eq!(
            fp_with(&ct, &body, &["/a~1b~0c"]),
            fp_with(&ct, &shorter, &[])
        );
    }

    #[test]
    fn a_malformed_body_is_hashed_as_bytes() {
        let d = "Content-Disposition: form-data; name=a";
        let cases: &[(&str, Malformed)] = &[
            ("no delimiter here", Malformed::NoDelimiter),
            ("--bb\r\n", Malformed::DelimiterLine),
            ("--b x\r\n", Malformed::DelimiterLine),
            ("--b\n", Malformed::DelimiterLine),
            (&format!("--b\r\n{d}\r\n\r\nopen"), Malformed::Unclosed),
            (
                &format!("--b\r\n{d}\r\n\r\n1\r\n--bc\r\n{d}\r\n\r\n2\r\n--b--"),
                Malformed::DelimiterLine,
            ),
            (
                &format!("--b\r\n{d}\r\n\r\n1\r\n--b-- x"),
                Malformed::AfterClose,
            ),
            (
                &format!("--b\r\n{d}\r\n\r\n1\r\n--b--x"),
                Malformed::AfterClose,
            ),
            (&format!("--b\r\n{d}\r\n--b--"), Malformed::Header),
            (&format!("--b\r\n{d}--b--"), Malformed::Unclosed),
            (
                &format!("--b\r\n{d}\n\r\n\r\n1\r\n--b--"),
                Malformed::Header,
            ),
            (
                &format!("--b\r\n{d}\r\n folded\r\n\r\n1\r\n--b--"),
                Malformed::Header,
            ),
            (
                &format!("--b\r\nno colon\r\n{d}\r\n\r\n1\r\n--b--"),
                Malformed::Header,
            ),
            ("--b\r\n\r\n1\r\n--b--", Malformed::Disposition),
            (
                "--b\r\nContent-Type: text/plain\r\n\r\n1\r\n--b--",
                Malformed::Disposition,
            ),
            (
                "--b\r\nContent-Disposition: attachment; name=a\r\n\r\n1\r\n--b--",
                Malformed::Disposition,
            ),
            (
                "--b\r\nContent-Disposition: form-data\r\n\r\n1\r\n--b--",
                Malformed::Disposition,
            ),
            (
                "--b\r\nContent-Disposition: form-data; filename=x\r\n\r\n1\r\n--b--",
                Malformed::Disposition,
            ),
            (
                &format!("--b\r\n{d}; filename*=UTF-8''x\r\n\r\n1\r\n--b--"),
                Malformed::Disposition,
            ),
            (
                &format!("--b\r\n{d}; filename=\"x\r\n\r\n1\r\n--b--"),
                Malformed::Disposition,
            ),
            (
                &format!("--b\r\n{d}; filename=x y\r\n\r\n1\r\n--b--"),
                Malformed::Disposition,
            ),
            (
                &format!("--b\r\n{d}; name=b\r\n\r\n1\r\n--b--"),
                Malformed::Repeated,
            ),
            (
                &format!("--b\r\n{d}\r\n{d}\r\n\r\n1\r\n--b--"),
                Malformed::Repeated,
            ),
            (
                &format!("--b\r\n{d}\r\nContent-Type: a\r\ncontent-type: a\r\n\r\n1\r\n--b--"),
                Malformed::Repeated,
            ),
        ];
        for (body, why) in cases {
            let got = read(body.as_bytes(), "b");
            assert_eq!(got, Err(*why), "{body:?}");
            let ct = "multipart/form-data; boundary=b";
            assert_eq!(
                fp_with(ct, body.as_bytes(), &[]),
                bytes_fp(body.as_bytes()),
                "{body:?}"
            );
        }
        // A part after a malformed one is not read.
        let body =
            format!("--b\r\n{d}\r\n\r\n1\r\n--b\r\nbad\r\n\r\n2\r\n--b\r\n{d}\r\n\r\n3\r\n--b--");
        let mut it = parts(body.as_bytes(), b"b");
        assert!(it.next().unwrap().is_ok());
        assert_eq!(it.next(), Some(Err(Malformed::Header)));
        assert_eq!(it.next(), None);
        // JSON sent with a multipart content type: what `body` gives it.
        let json = br#"{"a": 1}"#;
        assert_eq!(
            fp_with("multipart/form-data; boundary=b", json, &[]),
            bytes_fp(br#"{"a":1}"#)
        );
        // And a content type that is not multipart reads nothing as parts.
        let (_, body) = encode(&upload(), &plain("x1"));
        assert_eq!(
            fp_with("application/octet-stream", &body, &[]),
            bytes_fp(&body)
        );
        assert_eq!(
            fp_with("multipart/form-data; boundary=x2", &body, &[]),
            bytes_fp(&body)
        );
    }

    fn bytes_without_ctl() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop_oneof![Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff], 0..10)
    }

    fn content() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..16),
            Just(b"\r\n".to_vec()),
            Just(b"--".to_vec()),
            Just(b"\r\n\r\n".to_vec()),
        ];
        proptest::collection::vec(piece, 0..6).prop_map(|p| p.concat())
    }

    fn fields() -> impl Strategy<Value = Vec<Field>> {
        let one = (
            bytes_without_ctl(),
            proptest::option::of(bytes_without_ctl()),
            proptest::option::of("[a-z]{1,8}/[a-z0-9.+-]{1,8}(; ?charset=[a-z0-9-]{1,8})?"),
            content(),
        )
            .prop_map(|(name, filename, content_type, content)| Field {
                name,
                filename,
                content_type: content_type.map(String::into_bytes),
                content,
            });
        proptest::collection::vec(one, 0..5)
    }

    fn framing() -> impl Strategy<Value = Framing> {
        (
            "[A-Za-z0-9'()+_,./:=?-][A-Za-z0-9'()+_,./:=? -]{0,68}[A-Za-z0-9'()+_,./:=?-]",
            proptest::option::of(proptest::collection::vec(
                prop_oneof![Just(b'\r'), Just(b'\n'), b'a'..=b'z'],
                0..20,
            )),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
            "[ \t]{0,3}",
            any::<bool>(),
        )
            .prop_map(|(boundary, preamble, epilogue, padding, odd)| Framing {
                boundary,
                preamble,
                epilogue,
                padding,
                odd,
            })
    }

    /// Whether the boundary could be read out of the fields or the preamble.
    fn fits(fields: &[Field], f: &Framing) -> bool {
        let delimiter = format!("\r\n--{}", f.boundary).into_bytes();
        let inside = |text: &[u8]| memmem::find(text, &delimiter).is_some();
        !fields.iter().any(|field| inside(&field.content))
            && !f.preamble.as_deref().is_some_and(inside)
    }

    proptest! {
        #[test]
        fn any_framing_reads_back_the_same_parts(fields in fields(), a in framing(), b in framing()) {
            prop_assume!(fits(&fields, &a) && fits(&fields, &b));
            for f in [&a, &b] {
                let (content_type, body) = encode(&fields, f);
                let boundary = boundary(content_type.as_bytes()).unwrap();
                prop_assert_eq!(&read(&body, std::str::from_utf8(&boundary).unwrap()), &Ok(fields.clone()));
            }
            prop_assert_eq!(fp(&fields, &a), fp(&fields, &b));
        }

        #[test]
        fn any_changed_part_changes_the_fingerprint(fields in fields(), other in fields(), a in framing()) {
            prop_assume!(fields != other && fits(&fields, &a) && fits(&other, &a));
            prop_assert_ne!(fp(&fields, &a), fp(&other, &a));
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..256), fields in fields()) {
            let (content_type, body) = encode(&fields, &plain("b"));
            let _ = fp_with(&content_type, &raw, &["/a"]);
            let _ = boundary(&raw);
            // And a valid body cut or spliced anywhere.
            let cut = raw.first().map_or(0, |&n| n as usize % (body.len() + 1));
            let spliced = [&body[..cut], &raw[..], &body[cut..]].concat();
            for broken in [&body[..cut], &spliced[..]] {
                let read: Vec<_> = parts(broken, b"b").collect();
                prop_assert!(read.iter().filter(|r| r.is_err()).count() <= 1);
                let _ = fp_with(&content_type, broken, &[]);
            }
        }
    }
}
