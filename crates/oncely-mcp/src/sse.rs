//! An incremental Server-Sent Events parser (the WHATWG event-stream format), fed with the
//! chunks of a response as they pass through, so the proxy can find the JSON-RPC response
//! in a stream without holding the stream back.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// `event:` (empty means `message`).
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// `id:`, when given.
    pub id: Option<String>,
}

/// Feeds bytes in, takes events out. Lines may be split across chunks anywhere.
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    pending_cr: bool,
    current: Event,
    has_data: bool,
    limit: usize,
}

impl Parser {
    /// A parser that drops any single line longer than `limit` bytes (a guard against a
    /// stream that never ends a line).
    pub fn new(limit: usize) -> Parser {
        Parser {
            limit,
            ..Parser::default()
        }
    }

    /// Feeds `chunk`; returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        for &b in chunk {
            if self.pending_cr {
                self.pending_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\r' => {
                    self.pending_cr = true;
                    self.end_line(&mut out);
                }
                b'\n' => self.end_line(&mut out),
                _ => {
                    if self.line.len() < self.limit {
                        self.line.push(b);
                    }
                }
            }
        }
        out
    }

    fn end_line(&mut self, out: &mut Vec<Event>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if self.has_data {
                out.push(std::mem::take(&mut self.current));
            } else {
                self.current = Event::default();
            }
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            return;
        }
        let text = String::from_utf8_lossy(&line);
        let (field, value) = match text.find(':') {
            Some(i) => {
                let v = &text[i + 1..];
                (&text[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&text[..], ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.current.event = value.to_string(),
            "id" => self.current.id = Some(value.to_string()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_across_chunks() {
        let stream = b"event: message\r\ndata: {\"a\":\r\ndata: 1}\r\nid: 5\r\n\r\n: ping\r\n\r\ndata: x\n\n";
        for split in 0..stream.len() {
            let mut p = Parser::new(1 << 20);
            let mut events = p.feed(&stream[..split]);
            events.extend(p.feed(&stream[split..]));
            assert_eq!(events.len(), 2, "split at {split}");
            assert_eq!(events[0].data, "{\"a\":\n1}");
            assert_eq!(events[0].id.as_deref(), Some("5"));
            assert_eq!(events[1].data, "x");
        }
    }

    #[test]
    fn an_event_without_data_is_not_dispatched() {
        let mut p = Parser::new(1 << 20);
        assert!(p.feed(b"id: 1\n\n").is_empty());
        assert_eq!(p.feed(b"data:y\n\n")[0].data, "y");
    }
}
