//! A stored answer in a content coding its caller accepts. An answer is stored as the
//! upstream sent it, `Content-Encoding` and all, for the caller that asked first; a
//! replay or a join goes to another request, whose `Accept-Encoding` (RFC 9110, section
//! 12.5.3) may refuse that coding (`identity`, or `gzip` only where `br` was stored).
//! A request without `Accept-Encoding` is taken to accept identity only (RFC 9110 lets
//! it take any, but the clients that send none do not decode). Then the body is decoded
//! on the way out, a chunk at a time as the caller reads (the
//! stored body is the only copy held), with no `Content-Encoding` and no
//! `Content-Length`. `Vary` stays as the upstream sent it.

use std::io::Read;

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use http::{HeaderMap, HeaderValue};

use crate::body::full;
use crate::BoxBody;

/// How much decoded body one chunk of a decoded replay holds.
const CHUNK: usize = 64 << 10;

/// The body of a stored answer for a caller that sent `accept` (its `Accept-Encoding`):
/// as stored when the caller accepts its codings, else decoded (`headers` lose
/// `Content-Encoding` and `Content-Length`). A coding oncely cannot decode is sent as it
/// is, as before.
pub(crate) fn replay_body(body: Bytes, headers: &mut HeaderMap, accept: &Accept) -> BoxBody {
    let codings = codings(headers);
    if codings.is_empty() || codings.iter().all(|c| accept.allows(c)) {
        return full(body);
    }
    let Some(reader) = decoder(&codings, body.clone()) else {
        tracing::warn!(codings = ?codings, "a replay in a content coding its caller does not \
            accept, and that oncely cannot decode, is sent as stored");
        return full(body);
    };
    headers.remove(CONTENT_ENCODING);
    headers.remove(CONTENT_LENGTH);
    decoded(reader)
}

/// The content codings of an answer, in the order they were applied, lower case.
fn codings(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty() && c != "identity")
        .collect()
}

/// A reader of the body with every coding undone (the last applied first), or `None`
/// when one of them is not one oncely decodes.
fn decoder(codings: &[String], body: Bytes) -> Option<Box<dyn Read + Send>> {
    let mut reader: Box<dyn Read + Send> = Box::new(std::io::Cursor::new(body));
    for coding in codings.iter().rev() {
        reader = match coding.as_str() {
            "gzip" | "x-gzip" => Box::new(flate2::read::MultiGzDecoder::new(reader)),
            "deflate" => Box::new(flate2::read::ZlibDecoder::new(reader)),
            "br" => Box::new(brotli_decompressor::Decompressor::new(reader, 4096)),
            "zstd" => Box::new(ruzstd::decoding::StreamingDecoder::new(reader).ok()?),
            _ => return None,
        };
    }
    Some(reader)
}

/// A body that decodes as it is read. A body that fails to decode (stored corrupt, or
/// not in the coding it names) ends with an error after what decoded.
fn decoded(reader: Box<dyn Read + Send>) -> BoxBody {
    let chunks = futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut buf = vec![0u8; CHUNK];
        let mut filled = 0;
        while filled < CHUNK {
            match reader.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let e: crate::BoxError =
                        format!("the stored answer does not decode: {e}").into();
                    return Some((Err(e), None));
                }
            }
        }
        if filled == 0 {
            return None;
        }
        buf.truncate(filled);
        let frame = http_body::Frame::data(Bytes::from(buf));
        let more = (filled == CHUNK).then_some(reader);
        Some((Ok(frame), more))
    });
    crate::body::boxed(http_body_util::StreamBody::new(chunks))
}

/// A request's `Accept-Encoding`: which content codings its answer may come in.
#[derive(Debug, Clone, Default)]
pub(crate) struct Accept {
    /// The codings named, each with whether its weight is above 0.
    listed: Vec<(String, bool)>,
}

impl Accept {
    /// Reads every `Accept-Encoding` field of a request.
    pub(crate) fn of(headers: &HeaderMap) -> Accept {
        let fields: Vec<&HeaderValue> = headers
            .get_all(http::header::ACCEPT_ENCODING)
            .iter()
            .collect();
        if fields.is_empty() {
            // RFC 9110 would allow any coding here, but servers answer such a request
            // uncompressed, and clients that send none (curl without `--compressed`,
            // stripe-node) do not decode: identity only.
            return Accept::default();
        }
        let listed = fields
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|item| {
                let mut parts = item.split(';');
                let coding = parts.next()?.trim().to_ascii_lowercase();
                if coding.is_empty() {
                    return None;
                }
                let mut allowed = true;
                for param in parts {
                    if let Some((k, v)) = param.split_once('=') {
                        if k.trim().eq_ignore_ascii_case("q") {
                            allowed = v.trim().parse::<f32>().map(|q| q > 0.0).unwrap_or(false);
                        }
                    }
                }
                Some((coding, allowed))
            })
            .collect();
        Accept { listed }
    }

    /// Whether `coding` (lower case, not `identity`) is acceptable: named with a weight
    /// above 0, or covered by `*` and not named.
    fn allows(&self, coding: &str) -> bool {
        let named = |name: &str| {
            self.listed
                .iter()
                .find(|(c, _)| c == name)
                .map(|(_, ok)| *ok)
        };
        let alias = match coding {
            "gzip" => Some("x-gzip"),
            "x-gzip" => Some("gzip"),
            _ => None,
        };
        named(coding)
            .or_else(|| alias.and_then(named))
            .or_else(|| named("*"))
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::io::Write;

    fn accept(v: &str) -> Accept {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::ACCEPT_ENCODING,
            HeaderValue::from_str(v).unwrap(),
        );
        Accept::of(&h)
    }

    #[test]
    fn accept_encoding_is_read_as_rfc_9110_says() {
        assert!(!Accept::of(&HeaderMap::new()).allows("gzip"));
        assert!(accept("gzip, deflate").allows("gzip"));
        assert!(accept("GZIP;q=0.5").allows("gzip"));
        assert!(accept("x-gzip").allows("gzip"));
        assert!(!accept("identity").allows("gzip"));
        assert!(!accept("").allows("gzip"));
        assert!(!accept("gzip;q=0").allows("gzip"));
        assert!(!accept("gzip;q=0.000, *").allows("gzip"));
        assert!(accept("*").allows("br"));
        assert!(!accept("*;q=0").allows("br"));
        assert!(!accept("gzip, deflate").allows("br"));
    }

    async fn replayed(
        stored: &[u8],
        encoding: &str,
        accept_encoding: &str,
    ) -> (Vec<u8>, HeaderMap) {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_ENCODING, HeaderValue::from_str(encoding).unwrap());
        headers.insert(CONTENT_LENGTH, HeaderValue::from(stored.len()));
        let body = replay_body(
            Bytes::copy_from_slice(stored),
            &mut headers,
            &accept(accept_encoding),
        );
        let bytes = body.collect().await.unwrap().to_bytes().to_vec();
        (bytes, headers)
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[tokio::test]
    async fn a_refused_coding_is_decoded_and_an_accepted_one_kept() {
        let text: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        let z = gzip(&text);
        let (body, headers) = replayed(&z, "gzip", "identity").await;
        assert_eq!(body, text);
        assert!(headers.get(CONTENT_ENCODING).is_none());
        assert!(headers.get(CONTENT_LENGTH).is_none());

        let (body, headers) = replayed(&z, "gzip", "gzip, deflate").await;
        assert_eq!(body, z);
        assert_eq!(headers[CONTENT_ENCODING], "gzip");
        assert_eq!(headers[CONTENT_LENGTH], z.len().to_string().as_str());

        // Two codings, the last applied undone first.
        let mut zz = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        zz.write_all(&z).unwrap();
        let (body, _) = replayed(&zz.finish().unwrap(), "gzip, deflate", "br").await;
        assert_eq!(body, text);
    }

    #[tokio::test]
    async fn brotli_is_decoded_for_a_caller_without_it() {
        let text = b"a brotli answer, a brotli answer, a brotli answer".repeat(100);
        let mut out = Vec::new();
        {
            let mut w = brotli_encoder(&mut out);
            w.write_all(&text).unwrap();
        }
        let (body, headers) = replayed(&out, "br", "gzip, deflate").await;
        assert_eq!(body, text);
        assert!(headers.get(CONTENT_ENCODING).is_none());
    }

    fn brotli_encoder(out: &mut Vec<u8>) -> impl Write + '_ {
        // The decompressor crate has no encoder; a stored brotli stream of one
        // uncompressed meta-block is valid brotli (RFC 7932, section 9.2).
        BrotliRaw {
            out,
            data: Vec::new(),
        }
    }

    struct BrotliRaw<'a> {
        out: &'a mut Vec<u8>,
        data: Vec<u8>,
    }

    impl Write for BrotliRaw<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.data.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Drop for BrotliRaw<'_> {
        fn drop(&mut self) {
            // WBITS = 16 (one bit 0); a meta-block: ISLAST=0, MNIBBLES=4 (bits 00),
            // MLEN-1 in 16 bits, ISUNCOMPRESSED=1, then the bytes byte-aligned; then a
            // last empty meta-block (ISLAST=1, ISLASTEMPTY=1).
            let n = self.data.len() - 1;
            assert!(n < 1 << 16);
            // bits, least significant first: 0 | 0 | 00 | n (16 bits) | 1
            let bits: u32 = ((n as u32) << 4) | (1 << 20);
            self.out.push((bits & 0xff) as u8);
            self.out.push(((bits >> 8) & 0xff) as u8);
            self.out.push(((bits >> 16) & 0xff) as u8);
            self.out.extend_from_slice(&self.data);
            self.out.push(0b11);
        }
    }

    #[tokio::test]
    async fn an_unknown_coding_and_a_corrupt_body_lose_nothing() {
        let (body, headers) = replayed(b"packed", "compress", "identity").await;
        assert_eq!(body, b"packed");
        assert_eq!(headers[CONTENT_ENCODING], "compress");

        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let body = replay_body(
            Bytes::from_static(b"not gzip"),
            &mut headers,
            &accept("identity"),
        );
        assert!(
            body.collect().await.is_err(),
            "a corrupt body ends with an error"
        );
    }
}
