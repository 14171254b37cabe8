//! Newline-delimited JSON-RPC, read with a bound: [`LineReader`] gives each line whole up
//! to its limit, and of a longer one only its length and its top-level `id` (read on the
//! way by [`IdScan`], while the rest is skipped), so that a message over the limit costs
//! no memory and still gets an answer under its own id.

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One line of a newline-delimited stream (its line end removed).
#[derive(Debug, PartialEq)]
pub(crate) enum Line {
    /// A line within the limit.
    Whole(Vec<u8>),
    /// A line over the limit: how long it was, and its top-level `id` when it is a JSON
    /// object that has one.
    TooLong { len: usize, id: Option<Value> },
}

/// Reads lines of at most `limit` bytes from `inner`. Cancel-safe: what a dropped
/// [`LineReader::next`] read of a line is kept for the next call (it is used in
/// `select!` loops).
pub(crate) struct LineReader<R> {
    inner: R,
    limit: usize,
    /// The line read so far, while within the limit.
    line: Vec<u8>,
    /// The length so far and the id scan of a line over the limit.
    over: Option<(usize, IdScan)>,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub(crate) fn new(inner: R, limit: usize) -> LineReader<R> {
        LineReader {
            inner,
            limit,
            line: Vec::new(),
            over: None,
        }
    }

    /// The next line; `None` at the end of the stream (a last line without a line end
    /// counts as a line).
    pub(crate) async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let buf = self.inner.fill_buf().await?;
            if buf.is_empty() {
                return Ok(match self.over.take() {
                    Some((len, scan)) => Some(Line::TooLong { len, id: scan.id() }),
                    None if self.line.is_empty() => None,
                    None => Some(Line::Whole(trimmed(std::mem::take(&mut self.line)))),
                });
            }
            let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            match &mut self.over {
                Some((len, scan)) => {
                    *len += chunk.len();
                    scan.feed(chunk);
                }
                None if self.line.len() + chunk.len() > self.limit => {
                    let mut scan = IdScan::default();
                    scan.feed(&self.line);
                    scan.feed(chunk);
                    self.over = Some((self.line.len() + chunk.len(), scan));
                    self.line = Vec::new();
                }
                None => self.line.extend_from_slice(chunk),
            }
            let used = done.unwrap_or(chunk.len());
            self.inner.consume(used);
            if done.is_some() {
                return Ok(Some(match self.over.take() {
                    Some((len, scan)) => Line::TooLong { len, id: scan.id() },
                    None => Line::Whole(trimmed(std::mem::take(&mut self.line))),
                }));
            }
        }
    }
}

/// `line` without a trailing carriage return.
fn trimmed(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    line
}

/// Most bytes of an `id` kept (a longer one is not an id anyone can answer under).
const MAX_ID: usize = 256;

/// Finds the top-level `"id"` member of a JSON object fed to it in pieces, without
/// keeping the object: it follows strings and nesting, and keeps only the text of the
/// value of a member named `id` at the top level.
#[derive(Debug, Default)]
pub(crate) struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At the top level: a member name is expected next (not its value).
    expect_name: bool,
    /// The member name being read (top level).
    name: Option<Vec<u8>>,
    /// The last member name read (top level).
    last_name: Vec<u8>,
    /// The `id` value being read, as text.
    value: Option<Vec<u8>>,
    /// The `id` value, as text, once read.
    found: Option<Vec<u8>>,
}

impl IdScan {
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        if self.in_string {
            if let Some(v) = self.value.as_mut().filter(|v| v.len() < MAX_ID) {
                v.push(b);
            }
            if let Some(n) = self.name.as_mut().filter(|n| n.len() < MAX_ID) {
                if b != b'"' || self.escaped {
                    n.push(b);
                }
            }
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if let Some(name) = self.name.take() {
                    self.last_name = name;
                }
                if let Some(v) = self.value.take() {
                    self.found = Some(v);
                }
            }
            return;
        }
        let top = self.depth == 1;
        match b {
            b'"' => {
                self.in_string = true;
                if top && self.expect_name {
                    self.name = Some(Vec::new());
                } else if top && self.last_name == b"id" && self.found.is_none() {
                    self.value = Some(vec![b'"']);
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_name = b == b'{';
                }
            }
            b'}' | b']' => {
                self.end_value();
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if top => self.expect_name = false,
            b',' if top => {
                self.end_value();
                self.expect_name = true;
                self.last_name.clear();
            }
            b' ' | b'\t' | b'\r' | b'\n' => self.end_value(),
            _ if top && !self.expect_name && self.last_name == b"id" && self.found.is_none() => {
                if let Some(v) = self.value.as_mut().filter(|v| v.len() < MAX_ID) {
                    v.push(b);
                } else if self.value.is_none() {
                    self.value = Some(vec![b]);
                }
            }
            _ => {}
        }
    }

    /// A number (or literal) value being read ends.
    fn end_value(&mut self) {
        if !self.in_string {
            if let Some(v) = self.value.take() {
                self.found = Some(v);
            }
        }
    }

    /// The `id` found, when it is a string or a number.
    pub(crate) fn id(mut self) -> Option<Value> {
        self.end_value();
        let text = self.found?;
        match serde_json::from_slice::<Value>(&text).ok()? {
            v @ (Value::String(_) | Value::Number(_)) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scan(text: &str) -> Option<Value> {
        let mut s = IdScan::default();
        for piece in text.as_bytes().chunks(3) {
            s.feed(piece);
        }
        s.id()
    }

    #[test]
    fn the_top_level_id_is_found_wherever_it_is() {
        assert_eq!(
            scan(r#"{"jsonrpc":"2.0","id":7,"method":"x"}"#),
            Some(json!(7))
        );
        assert_eq!(
            scan(r#"{"method":"x","params":{"id":1,"a":"\"id\":2"},"id":"k-1"}"#),
            Some(json!("k-1"))
        );
        assert_eq!(scan(r#"{ "id" : 42 }"#), Some(json!(42)));
        assert_eq!(scan(r#"{"params":{"id":3}}"#), None);
        assert_eq!(scan(r#"{"id":null}"#), None);
        assert_eq!(scan(r#"{"x":"a\\","id":"b\"c"}"#), Some(json!("b\"c")));
        // Cut off before the end (a line over the limit is read whole, but a stream may end).
        assert_eq!(
            scan(r#"{"id":12,"params":{"arguments":{"text":"aaaa"#),
            Some(json!(12))
        );
    }

    #[tokio::test]
    async fn a_line_read_in_part_by_a_dropped_call_is_read_whole_by_the_next() {
        let (mut tx, rx) = tokio::io::duplex(64);
        let mut r = LineReader::new(tokio::io::BufReader::new(rx), 1024);
        use tokio::io::AsyncWriteExt;
        tx.write_all(br#"{"id":1,"#).await.unwrap();
        // Dropped while the line is half there (as `select!` drops it).
        let cut = tokio::time::timeout(std::time::Duration::from_millis(50), r.next()).await;
        assert!(cut.is_err());
        tx.write_all(b"\"x\":2}\n").await.unwrap();
        assert_eq!(
            r.next().await.unwrap(),
            Some(Line::Whole(br#"{"id":1,"x":2}"#.to_vec()))
        );
    }

    #[tokio::test]
    async fn lines_over_the_limit_give_their_length_and_id() {
        let big = format!("{{\"id\":5,\"x\":\"{}\"}}", "a".repeat(100));
        let input = format!("{{\"id\":1}}\r\n{big}\n\n{{\"id\":2}}");
        let mut r = LineReader::new(std::io::Cursor::new(input.into_bytes()), 50);
        assert_eq!(
            r.next().await.unwrap(),
            Some(Line::Whole(br#"{"id":1}"#.to_vec()))
        );
        assert_eq!(
            r.next().await.unwrap(),
            Some(Line::TooLong {
                len: big.len(),
                id: Some(json!(5))
            })
        );
        assert_eq!(r.next().await.unwrap(), Some(Line::Whole(Vec::new())));
        assert_eq!(
            r.next().await.unwrap(),
            Some(Line::Whole(br#"{"id":2}"#.to_vec()))
        );
        assert_eq!(r.next().await.unwrap(), None);
    }
}
