//! Reading and parsing off the main thread.
//!
//! Each input has a reader thread that cuts its bytes (decompressed, for gzip) into
//! chunks of whole lines; a pool of parser threads, one per core, turns chunks into
//! requests; the main thread receives each input's chunks back in order and only merges
//! and judges. Channels are bounded, so memory stays a few chunks per input however long
//! the log. Lines are cut at `\n` (a trailing `\r` is dropped) and never grow past
//! [`MAX_LINE`]: a longer line is skipped to its end and reported, not buffered.

use std::io::{self, BufRead};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;

use crate::input::Input;
use crate::line::{LineReader, Request};

/// The longest line read; longer lines are counted as unreadable.
pub const MAX_LINE: usize = 16 << 20;

/// Bytes of lines handed to a parser at once (with few inputs)...
const CHUNK: usize = 1 << 20;

/// ...and at most this much in flight over all inputs, so that a thousand hourly files
/// read at once (merged by time) still fit: each then gets smaller chunks.
const ALL_IN_FLIGHT: usize = 64 << 20;

/// Chunks an input may have in flight before its reader waits.
const IN_FLIGHT: usize = 4;

/// A line number and what it held.
pub(crate) type Parsed = (u64, Result<Request, String>);

/// Whole lines of one input.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Chunk {
    /// Lines, each ending in `\n` (the last one of an input may not).
    pub(crate) text: Vec<u8>,
    /// The number of the first line in `text`.
    pub(crate) first_line: u64,
    /// Lines judged unreadable before parsing (too long, read errors); their place in
    /// `text` is an empty line.
    pub(crate) extra: Vec<(u64, String)>,
}

struct Job {
    chunk: Chunk,
    reply: SyncSender<Vec<Parsed>>,
}

/// One input's parsed lines, in order.
pub(crate) struct Lines {
    order: Receiver<Receiver<Vec<Parsed>>>,
    current: std::vec::IntoIter<Parsed>,
    pub(crate) name: String,
    pub(crate) consumed: Arc<AtomicU64>,
}

impl Lines {
    /// The next line that held something (blank lines are skipped).
    pub(crate) fn next(&mut self) -> Option<Parsed> {
        loop {
            if let Some(p) = self.current.next() {
                return Some(p);
            }
            let reply = self.order.recv().ok()?;
            match reply.recv() {
                Ok(batch) => self.current = batch.into_iter(),
                Err(_) => {
                    return Some((0, Err("internal error: a parser thread stopped".into())));
                }
            }
        }
    }
}

/// Starts the reader threads and the parser pool.
pub(crate) fn start(inputs: Vec<Input>, reader: LineReader) -> Vec<Lines> {
    let reader = Arc::new(reader);
    let (jobs, queue) = mpsc::channel::<Job>();
    let queue = Arc::new(Mutex::new(queue));
    let parsers = thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    let chunk = (ALL_IN_FLIGHT / IN_FLIGHT / inputs.len().max(1)).clamp(16 << 10, CHUNK);
    for _ in 0..parsers {
        let queue = queue.clone();
        let reader = reader.clone();
        thread::Builder::new()
            .name("audit-parse".into())
            .spawn(move || parser(&queue, &reader))
            .expect("a parser thread starts");
    }
    inputs
        .into_iter()
        .map(|input| {
            let (order_tx, order) = mpsc::sync_channel(IN_FLIGHT);
            let jobs = jobs.clone();
            let Input {
                name,
                reader,
                consumed,
                ..
            } = input;
            thread::Builder::new()
                .name("audit-read".into())
                .spawn(move || {
                    let mut reader = reader;
                    split(&mut reader, chunk, MAX_LINE, &mut |c| {
                        hand_over(c, &jobs, &order_tx)
                    });
                })
                .expect("a reader thread starts");
            Lines {
                order,
                current: Vec::new().into_iter(),
                name,
                consumed,
            }
        })
        .collect()
}

fn hand_over(chunk: Chunk, jobs: &Sender<Job>, order: &SyncSender<Receiver<Vec<Parsed>>>) -> bool {
    let (reply, result) = mpsc::sync_channel(1);
    // Order first: when the consumer is gone, stop before queueing work.
    order.send(result).is_ok() && jobs.send(Job { chunk, reply }).is_ok()
}

fn parser(queue: &Mutex<Receiver<Job>>, reader: &LineReader) {
    let mut scratch = Vec::new();
    loop {
        let job = match queue.lock() {
            Ok(q) => q.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        let out = parse_chunk(&job.chunk, reader, &mut scratch);
        let _ = job.reply.send(out);
    }
}

/// Parses every non-blank line of a chunk, with the chunk's pre-judged lines in place.
pub(crate) fn parse_chunk(
    chunk: &Chunk,
    reader: &LineReader,
    scratch: &mut Vec<u8>,
) -> Vec<Parsed> {
    let text = &chunk.text;
    let mut out = Vec::with_capacity(text.len() / 256 + chunk.extra.len());
    let mut line_no = chunk.first_line;
    let mut start = 0;
    let mut one = |line: &[u8], line_no: u64| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        out.push((
            line_no,
            reader.read(line, scratch).map_err(|e| e.to_string()),
        ));
    };
    for end in memchr::memchr_iter(b'\n', text) {
        one(&text[start..end], line_no);
        start = end + 1;
        line_no += 1;
    }
    if start < text.len() {
        one(&text[start..], line_no);
    }
    if !chunk.extra.is_empty() {
        out.extend(chunk.extra.iter().map(|(n, e)| (*n, Err(e.clone()))));
        out.sort_by_key(|p| p.0);
    }
    out
}

/// Cuts a reader into chunks of whole lines of about `size` bytes and hands each to
/// `emit` (which returns false to stop). Never holds a line longer than `max`.
pub(crate) fn split(
    reader: &mut dyn BufRead,
    size: usize,
    max: usize,
    emit: &mut dyn FnMut(Chunk) -> bool,
) {
    let mut line = 1u64;
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let mut text = std::mem::take(&mut carry);
        text.reserve(size);
        let mut end = false;
        // Fill to at least `size` bytes beyond the carried partial line.
        let target = text.len() + size;
        while text.len() < target {
            match reader.fill_buf() {
                Ok([]) => {
                    end = true;
                    break;
                }
                Ok(available) => {
                    let take = available.len().min(target - text.len());
                    text.extend_from_slice(&available[..take]);
                    reader.consume(take);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let lines = count_lines(&text);
                    let mut chunk = Chunk {
                        text,
                        first_line: line,
                        extra: Vec::new(),
                    };
                    // The partial last line is lost with the rest of the input.
                    let at = line + lines;
                    if let Some(i) = memchr::memrchr(b'\n', &chunk.text) {
                        chunk.text.truncate(i + 1);
                    } else {
                        chunk.text.clear();
                    }
                    chunk
                        .extra
                        .push((at, format!("read error, rest of input skipped: {e}")));
                    emit(chunk);
                    return;
                }
            }
        }
        if end {
            if !text.is_empty() {
                emit(Chunk {
                    text,
                    first_line: line,
                    extra: Vec::new(),
                });
            }
            return;
        }
        match memchr::memrchr(b'\n', &text) {
            Some(i) => {
                carry = text[i + 1..].to_vec();
                text.truncate(i + 1);
                let lines = count_lines(&text);
                if !emit(Chunk {
                    text,
                    first_line: line,
                    extra: Vec::new(),
                }) {
                    return;
                }
                line += lines;
            }
            None if text.len() > max => {
                // One line longer than allowed: skip to its end without keeping it.
                let mut length = text.len() as u64;
                drop(text);
                let found = loop {
                    match reader.fill_buf() {
                        Ok([]) => break false,
                        Ok(available) => match memchr::memchr(b'\n', available) {
                            Some(i) => {
                                length += i as u64;
                                reader.consume(i + 1);
                                break true;
                            }
                            None => {
                                length += available.len() as u64;
                                let n = available.len();
                                reader.consume(n);
                            }
                        },
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break false,
                    }
                };
                let chunk = Chunk {
                    text: b"\n".to_vec(),
                    first_line: line,
                    extra: vec![(line, format!("line of {length} bytes is longer than {max}"))],
                };
                if !emit(chunk) || !found {
                    return;
                }
                line += 1;
            }
            // A line longer than a chunk but within the limit: keep reading it.
            None => carry = text,
        }
    }
}

fn count_lines(text: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', text).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::FieldMap;
    use std::io::{Cursor, Write};

    /// Every line of an input with its number, as `split` and `parse_chunk` see them.
    fn lines_of(bytes: Vec<u8>, size: usize, max: usize) -> Vec<(u64, Result<String, String>)> {
        let mut input = Input::from_reader("t", Cursor::new(bytes)).unwrap();
        let mut out = Vec::new();
        split(&mut input.reader, size, max, &mut |chunk| {
            let mut extra = chunk.extra.iter();
            let body = chunk.text.strip_suffix(b"\n").unwrap_or(&chunk.text);
            for (n, l) in (chunk.first_line..).zip(body.split(|b| *b == b'\n')) {
                match extra.clone().next() {
                    Some((at, e)) if *at == n => {
                        out.push((n, Err(e.clone())));
                        extra.next();
                    }
                    _ => out.push((n, Ok(String::from_utf8(l.to_vec()).unwrap()))),
                }
            }
            true
        });
        out
    }

    #[test]
    fn lines_keep_their_numbers_across_chunks() {
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        for size in [1, 7, 64, 1 << 20] {
            let lines = lines_of(text.clone().into_bytes(), size, 1000);
            assert_eq!(lines.len(), 100, "chunk size {size}");
            for (i, (n, l)) in lines.iter().enumerate() {
                assert_eq!(*n, i as u64 + 1);
                assert_eq!(l.as_deref(), Ok(format!("line {}", i + 1).as_str()));
            }
        }
    }

    #[test]
    fn a_last_line_without_newline_and_crlf() {
        let lines = lines_of(b"a\r\nbb\n\nccc".to_vec(), 4, 100);
        let texts: Vec<&str> = lines.iter().map(|l| l.1.as_deref().unwrap()).collect();
        assert_eq!(texts, ["a\r", "bb", "", "ccc"]);
    }

    #[test]
    fn long_lines_are_skipped_not_buffered() {
        let lines = lines_of(
            b"ok\n0123456789abcdef\nfine\nlast-is-long-too".to_vec(),
            4,
            8,
        );
        assert_eq!(lines[0], (1, Ok("ok".into())));
        assert_eq!(lines[1].0, 2);
        assert_eq!(
            lines[1].1.as_ref().unwrap_err(),
            "line of 16 bytes is longer than 8"
        );
        assert_eq!(lines[2], (3, Ok("fine".into())));
        assert_eq!(lines[3].0, 4);
        assert!(lines[3].1.is_err());
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn gzip_is_recognised_by_content_and_members_concatenate() {
        let gz = |text: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(text).unwrap();
            e.finish().unwrap()
        };
        let mut both = gz(b"one\ntwo\n");
        both.extend(gz(b"three\n"));
        let lines = lines_of(both, 3, 100);
        let texts: Vec<&str> = lines.iter().map(|l| l.1.as_deref().unwrap()).collect();
        assert_eq!(texts, ["one", "two", "three"]);
    }

    #[test]
    fn a_read_error_is_reported_at_its_line_and_ends_the_input() {
        struct Failing(Cursor<Vec<u8>>);
        impl io::Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                match self.0.read(buf)? {
                    0 => Err(io::Error::other("disk on fire")),
                    n => Ok(n),
                }
            }
        }
        let line = r#"{"ts":1,"principal":"p","method":"GET","path":"/"}"#;
        let text = format!("{line}\n{line}\npartial");
        let input = Input::from_reader("t", Failing(Cursor::new(text.into_bytes()))).unwrap();
        let mut lines = start(vec![input], LineReader::new(&FieldMap::default(), &[]));
        let mut got = Vec::new();
        while let Some((n, r)) = lines[0].next() {
            got.push((n, r.map(|_| ())));
        }
        assert_eq!(got.len(), 3);
        assert_eq!(got[1], (2, Ok(())));
        assert_eq!(got[2].0, 3);
        assert!(got[2].1.as_ref().unwrap_err().contains("disk on fire"));
    }

    #[test]
    fn parsed_lines_come_back_in_order_from_the_pool() {
        let text: String = (0..5_000)
            .map(|i| format!(r#"{{"ts":{i},"principal":"p","method":"GET","path":"/{i}"}}"#) + "\n")
            .collect();
        let inputs = (0..3)
            .map(|_| Input::from_reader("t", Cursor::new(text.clone().into_bytes())).unwrap())
            .collect();
        for mut lines in start(inputs, LineReader::new(&FieldMap::default(), &[])) {
            let mut n = 0;
            while let Some((line, r)) = lines.next() {
                n += 1;
                assert_eq!(line, n);
                assert_eq!(r.unwrap().names.path(), format!("/{}", n - 1));
            }
            assert_eq!(n, 5_000);
        }
    }
}
