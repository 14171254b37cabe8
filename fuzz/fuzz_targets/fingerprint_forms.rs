//! Differential fuzzing of the form and multipart readings of a body
//! (`oncely_core::form`, `oncely_core::multipart`, `FingerprintBuilder::request_body`).
//!
//! Run with: `cargo +nightly fuzz run fingerprint_forms` (from the repository root). The
//! input's first byte says what the rest is:
//!
//! - 0: a form body. The reference is the `form_urlencoded` crate (the WHATWG parser): where
//!   oncely reads the body, it reads the same pairs (sorted by name, stably), and where
//!   oncely refuses it, the body has a `%` without two hex digits after it; a refused body
//!   is fingerprinted as bytes, a read one never is; the pairs written again (escaped
//!   otherwise, different names in another order) have the same fingerprint.
//! - 1: a multipart body (with one of a few boundaries): a refused body is fingerprinted
//!   as bytes; the parts of a read one, written again with another boundary, read back
//!   the same and have the same fingerprint.
//! - 2: pairs generated from the rest, written two ways (escapes, `+` or `%20`, empty
//!   pieces, different names reordered): both read back as the pairs sorted by name, the
//!   first (in written order) as `form_urlencoded` reads it, with one fingerprint.
//! - 3: parts generated from the rest, written with two framings (boundary, preamble,
//!   epilogue, transport padding, header case and order, other headers, escapes in quoted
//!   strings): both read back exactly as the parts, with one fingerprint, never that of
//!   the bytes.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use oncely_core::{form, multipart, Fingerprint, FingerprintBuilder};

const FORM: &[u8] = b"application/x-www-form-urlencoded";

fn builder() -> FingerprintBuilder {
    FingerprintBuilder::new("principal", "POST", "/v1/upload")
}

fn request(content_type: &[u8], body: &[u8]) -> Fingerprint {
    builder().request_body(Some(content_type), body, &[])
}

fn bytes(body: &[u8]) -> Fingerprint {
    builder().body(body, &[])
}

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn read_form(body: &[u8]) -> Option<Pairs> {
    let pairs = form::pairs(body).ok()?;
    Some(
        pairs
            .iter()
            .map(|p| {
                for text in [p.name, p.value] {
                    let decoded = text.decode();
                    assert_eq!(decoded.len(), text.decoded_len());
                    assert_eq!(text.bytes().collect::<Vec<_>>(), &decoded[..]);
                    assert!(text.is(&decoded));
                }
                (p.name.decode().into_owned(), p.value.decode().into_owned())
            })
            .collect(),
    )
}

fn sorted(mut pairs: Pairs) -> Pairs {
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
}

/// What the WHATWG parser reads, when it reads text (every pair valid UTF-8 once decoded).
fn reference(body: &[u8], ours: &Pairs) -> Option<Pairs> {
    let utf8 = ours
        .iter()
        .all(|(n, v)| std::str::from_utf8(n).is_ok() && std::str::from_utf8(v).is_ok());
    utf8.then(|| {
        form_urlencoded::parse(body)
            .map(|(n, v)| (n.into_owned().into_bytes(), v.into_owned().into_bytes()))
            .collect()
    })
}

fn has_bad_escape(body: &[u8]) -> bool {
    (0..body.len()).any(|i| {
        body[i] == b'%'
            && !(i + 2 < body.len()
                && body[i + 1].is_ascii_hexdigit()
                && body[i + 2].is_ascii_hexdigit())
    })
}

/// Writes pairs: `escape` says which bytes to escape beyond those that must be (a space as
/// `%20` then, else `+`), `lower` the hex digits' case, `gaps` empty pieces between pairs.
fn write_form(pairs: &Pairs, escape: &dyn Fn(usize) -> bool, lower: bool, gaps: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut k = 0;
    let mut text = |out: &mut Vec<u8>, t: &[u8]| {
        for &b in t {
            k += 1;
            let must = !(b.is_ascii_alphanumeric() || b"-._*[]~!$'(),;:@/?".contains(&b));
            if b == b' ' && !escape(k) {
                out.push(b'+');
            } else if must || escape(k) {
                let hex = if lower {
                    format!("%{b:02x}")
                } else {
                    format!("%{b:02X}")
                };
                out.extend_from_slice(hex.as_bytes());
            } else {
                out.push(b);
            }
        }
    };
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 || gaps {
            out.push(b'&');
        }
        if gaps {
            out.push(b'&');
        }
        text(&mut out, name);
        // `name` alone is `name=`; an empty name keeps its `=` (an empty piece is none).
        if !value.is_empty() || name.is_empty() || !gaps {
            out.push(b'=');
        }
        text(&mut out, value);
    }
    out
}

fn raw_form(body: &[u8]) {
    let Some(ours) = read_form(body) else {
        assert!(has_bad_escape(body), "refused {body:?}");
        assert_eq!(request(FORM, body), bytes(body));
        return;
    };
    assert!(!has_bad_escape(body));
    assert_ne!(request(FORM, body), bytes(body));
    assert_eq!(ours.len(), form_urlencoded::parse(body).count());
    if let Some(theirs) = reference(body, &ours) {
        assert_eq!(ours, sorted(theirs), "{body:?}");
    }
    let mut reversed = ours.clone();
    reversed.sort_by(|a, b| b.0.cmp(&a.0));
    let again = write_form(&reversed, &|k| k % 3 == 0, true, true);
    assert_eq!(read_form(&again).as_ref(), Some(&ours));
    assert_eq!(request(FORM, body), request(FORM, &again));
}

fn generated_form(u: &mut Unstructured<'_>) -> Result<()> {
    let pairs: Pairs = u.arbitrary()?;
    let salt: u8 = u.arbitrary()?;
    let lower: bool = u.arbitrary()?;
    let mask: u64 = u.arbitrary()?;
    let first = write_form(&pairs, &|_| false, false, false);
    // Different names in another order (a stable sort keeps repeated names in order).
    let mut shuffled = pairs.clone();
    shuffled.sort_by_key(|(name, _)| name.iter().map(|b| b ^ salt).collect::<Vec<_>>());
    let second = write_form(&shuffled, &|k| mask >> (k % 64) & 1 == 1, lower, true);
    let expected = sorted(pairs.clone());
    let ours = read_form(&first).expect("a written form reads");
    assert_eq!(ours, expected);
    assert_eq!(read_form(&second).as_ref(), Some(&expected));
    if let Some(theirs) = reference(&first, &ours) {
        assert_eq!(theirs, pairs);
    }
    assert_eq!(request(FORM, &first), request(FORM, &second));
    Ok(())
}

/// A part as the fuzzer writes it.
#[derive(Debug, Clone, PartialEq)]
struct Field {
    name: Vec<u8>,
    filename: Option<Vec<u8>>,
    content_type: Option<Vec<u8>>,
    content: Vec<u8>,
}

fn read_parts(body: &[u8], boundary: &[u8]) -> Option<Vec<Field>> {
    multipart::parts(body, boundary)
        .map(|part| {
            part.ok().map(|p| Field {
                name: p.name.into_owned(),
                filename: p.filename.map(|f| f.into_owned()),
                content_type: p.content_type.map(<[u8]>::to_vec),
                content: p.content.to_vec(),
            })
        })
        .collect()
}

/// How a body is framed.
struct Framing {
    boundary: Vec<u8>,
    preamble: Option<Vec<u8>>,
    epilogue: Option<Vec<u8>>,
    padding: Vec<u8>,
    odd: bool,
}

impl Framing {
    fn plain(boundary: &[u8]) -> Framing {
        Framing {
            boundary: boundary.to_vec(),
            preamble: None,
            epilogue: None,
            padding: Vec::new(),
            odd: false,
        }
    }

    /// Whether the boundary could be read out of a content or the preamble.
    fn fits(&self, fields: &[Field]) -> bool {
        let mut delimiter = b"\r\n--".to_vec();
        delimiter.extend_from_slice(&self.boundary);
        let inside = |t: &[u8]| t.windows(delimiter.len()).any(|w| w == delimiter);
        let opens = self
            .preamble
            .as_deref()
            .is_some_and(|p| p.starts_with(&delimiter[2..]) || inside(p));
        !opens && !fields.iter().any(|f| inside(&f.content))
    }
}

fn quote(text: &[u8], all: bool) -> Vec<u8> {
    let mut out = vec![b'"'];
    for &b in text {
        if all || b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
    out
}

fn write_parts(fields: &[Field], f: &Framing) -> (Vec<u8>, Vec<u8>) {
    let mut content_type = if f.odd {
        b"Multipart/Form-Data; charset=utf-8 ;BOUNDARY=".to_vec()
    } else {
        b"multipart/form-data; boundary=".to_vec()
    };
    content_type.extend_from_slice(&quote(&f.boundary, f.odd));
    let mut body = Vec::new();
    if let Some(preamble) = &f.preamble {
        body.extend_from_slice(preamble);
        body.extend_from_slice(b"\r\n");
    }
    let line = |body: &mut Vec<u8>, parts: &[&[u8]]| {
        for p in parts {
            body.extend_from_slice(p);
        }
        body.extend_from_slice(b"\r\n");
    };
    for field in fields {
        line(&mut body, &[b"--", &f.boundary, &f.padding]);
        let name = quote(&field.name, f.odd);
        let filename = field.filename.as_deref().map(|n| quote(n, f.odd));
        if f.odd {
            line(&mut body, &[b"X-Part: 1"]);
            if let Some(ct) = &field.content_type {
                line(&mut body, &[b"content-type:\t", ct, b" "]);
            }
            let mut d: Vec<u8> = b"CONTENT-disposition:  Form-Data; size=1".to_vec();
            if let Some(filename) = &filename {
                d.extend_from_slice(b" ;\tFILENAME=");
                d.extend_from_slice(filename);
            }
            d.extend_from_slice(b";Name=");
            d.extend_from_slice(&name);
            line(&mut body, &[&d, b"\t"]);
        } else {
            let mut d: Vec<u8> = b"Content-Disposition: form-data; name=".to_vec();
            d.extend_from_slice(&name);
            if let Some(filename) = &filename {
                d.extend_from_slice(b"; filename=");
                d.extend_from_slice(filename);
            }
            line(&mut body, &[&d]);
            if let Some(ct) = &field.content_type {
                line(&mut body, &[b"Content-Type: ", ct]);
            }
        }
        line(&mut body, &[]);
        line(&mut body, &[&field.content]);
    }
    body.extend_from_slice(b"--");
    body.extend_from_slice(&f.boundary);
    body.extend_from_slice(b"--");
    body.extend_from_slice(&f.padding);
    if let Some(epilogue) = &f.epilogue {
        body.extend_from_slice(b"\r\n");
        body.extend_from_slice(epilogue);
    }
    (content_type, body)
}

/// Checks that `fields` written with `framing` read back as themselves.
fn round_trip(fields: &[Field], framing: &Framing) -> Option<Fingerprint> {
    if !framing.fits(fields) {
        return None;
    }
    let (content_type, body) = write_parts(fields, framing);
    let boundary = multipart::boundary(&content_type).expect("a written boundary reads");
    assert_eq!(&boundary[..], &framing.boundary[..]);
    assert_eq!(
        read_parts(&body, &boundary).as_deref(),
        Some(fields),
        "{body:?}"
    );
    let fingerprint = request(&content_type, &body);
    assert_ne!(fingerprint, bytes(&body));
    Some(fingerprint)
}

fn raw_multipart(selector: u8, body: &[u8]) {
    let boundary: &[u8] = match selector % 3 {
        0 => b"b",
        1 => b"----x",
        _ => b"a b",
    };
    let mut content_type = b"multipart/form-data; boundary=\"".to_vec();
    content_type.extend_from_slice(boundary);
    content_type.push(b'"');
    match read_parts(body, boundary) {
        None => assert_eq!(request(&content_type, body), bytes(body)),
        Some(fields) => {
            let fingerprint = request(&content_type, body);
            assert_ne!(fingerprint, bytes(body));
            for other in [&b"oncely-fuzz-0"[..], b"oncely fuzz 1"] {
                if let Some(again) = round_trip(&fields, &Framing::plain(other)) {
                    assert_eq!(again, fingerprint);
                }
            }
        }
    }
}

/// Quoted-string text: no control character but the tab.
fn quotable(u: &mut Unstructured<'_>) -> Result<Vec<u8>> {
    let raw: Vec<u8> = u.arbitrary()?;
    Ok(raw
        .into_iter()
        .map(|b| {
            if (b < 0x20 && b != b'\t') || b == 0x7f {
                b'_'
            } else {
                b
            }
        })
        .collect())
}

fn header_value(u: &mut Unstructured<'_>) -> Result<Vec<u8>> {
    let raw: Vec<u8> = u.arbitrary()?;
    let raw: Vec<u8> = raw
        .into_iter()
        .filter(|b| !matches!(b, b'\r' | b'\n'))
        .collect();
    let start = raw.iter().take_while(|b| matches!(b, b' ' | b'\t')).count();
    let end = raw.len()
        - raw[start..]
            .iter()
            .rev()
            .take_while(|b| matches!(b, b' ' | b'\t'))
            .count();
    Ok(raw[start..end].to_vec())
}

fn framing(u: &mut Unstructured<'_>) -> Result<Framing> {
    const BCHARS: &[u8] =
        b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=? ";
    let len = u.int_in_range(1..=70)?;
    let mut boundary = Vec::with_capacity(len);
    for i in 0..len {
        let chars = if i + 1 == len {
            &BCHARS[..BCHARS.len() - 1]
        } else {
            BCHARS
        };
        boundary.push(*u.choose(chars)?);
    }
    let padding = (0..u.int_in_range(0..=3)?)
        .map(|_| Ok(*u.choose(b" \t")?))
        .collect::<Result<Vec<u8>>>()?;
    Ok(Framing {
        boundary,
        preamble: u.arbitrary()?,
        epilogue: u.arbitrary()?,
        padding,
        odd: u.arbitrary()?,
    })
}

fn generated_multipart(u: &mut Unstructured<'_>) -> Result<()> {
    let count = u.int_in_range(0..=6)?;
    let mut fields = Vec::with_capacity(count);
    for _ in 0..count {
        fields.push(Field {
            name: quotable(u)?,
            filename: if u.arbitrary()? {
                Some(quotable(u)?)
            } else {
                None
            },
            content_type: if u.arbitrary()? {
                Some(header_value(u)?)
            } else {
                None
            },
            content: u.arbitrary()?,
        });
    }
    let (a, b) = (framing(u)?, framing(u)?);
    if let (Some(x), Some(y)) = (round_trip(&fields, &a), round_trip(&fields, &b)) {
        assert_eq!(x, y);
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => raw_form(rest),
        1 => {
            if let Some((&selector, body)) = rest.split_first() {
                raw_multipart(selector, body);
            }
        }
        2 => {
            let _ = generated_form(&mut Unstructured::new(rest));
        }
        _ => {
            let _ = generated_multipart(&mut Unstructured::new(rest));
        }
    }
});
