//! Where lines come from: files, standard input or any reader, plain or gzip.
//!
//! Compression is recognised by content (the gzip magic bytes `1f 8b`), not by the file
//! name, so `-` can be gzip too; concatenated gzip members (`cat a.gz b.gz`) read as one
//! stream. Lines are cut at `\n` (a trailing `\r` is dropped) and never grow past
//! [`MAX_LINE`]: a longer line is skipped to its end and reported, not buffered.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flate2::bufread::MultiGzDecoder;

use crate::AuditError;

/// The longest line read; longer lines are counted as unreadable.
pub const MAX_LINE: usize = 16 << 20;

const BUFFER: usize = 1 << 20;

/// One log to read: a name for messages and a reader.
pub struct Input {
    pub(crate) name: String,
    pub(crate) reader: Box<dyn BufRead + Send>,
    /// Compressed (on-disk) size, when known, for the progress bar.
    pub(crate) size: Option<u64>,
    /// Bytes taken from the underlying reader so far (compressed bytes for gzip).
    pub(crate) consumed: Arc<AtomicU64>,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("name", &self.name)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Input {
    /// Opens a file, or standard input for `-`.
    pub fn open(path: &Path) -> Result<Input, AuditError> {
        if path.as_os_str() == "-" {
            return Input::from_reader("-", io::stdin());
        }
        let open_error = |source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(open_error)?;
        let meta = file.metadata().map_err(open_error)?;
        if meta.is_dir() {
            return Err(open_error(io::Error::other("is a directory")));
        }
        let mut input =
            Input::from_reader(&path.display().to_string(), file).map_err(|e| match e {
                AuditError::Open { source, .. } => open_error(source),
                other => other,
            })?;
        input.size = Some(meta.len());
        Ok(input)
    }

    /// Any reader (standard input, a socket, a test's bytes), plain or gzip.
    pub fn from_reader<R: Read + Send + 'static>(
        name: &str,
        reader: R,
    ) -> Result<Input, AuditError> {
        let consumed = Arc::new(AtomicU64::new(0));
        let counted = Counted {
            inner: reader,
            consumed: consumed.clone(),
        };
        let mut buffered = BufReader::with_capacity(BUFFER, counted);
        let head = buffered.fill_buf().map_err(|source| AuditError::Open {
            path: name.into(),
            source,
        })?;
        let reader: Box<dyn BufRead + Send> = if head.starts_with(&[0x1f, 0x8b]) {
            Box::new(BufReader::with_capacity(
                BUFFER,
                MultiGzDecoder::new(buffered),
            ))
        } else {
            Box::new(buffered)
        };
        Ok(Input {
            name: name.to_string(),
            reader,
            size: None,
            consumed,
        })
    }

    /// The name used in messages (the path as given, `-` for standard input).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Counts the bytes read, for the progress bar.
struct Counted<R> {
    inner: R,
    consumed: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.consumed.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// What [`next_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// A line is in the buffer (without `\n` or `\r\n`).
    Text,
    /// A line longer than the limit was skipped; its length so far.
    TooLong(usize),
    /// End of input.
    End,
}

/// Reads the next line into `buf` (cleared first), never holding more than `max` bytes.
pub(crate) fn next_line(
    reader: &mut dyn BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<Line> {
    buf.clear();
    let mut skipped = 0usize;
    let mut any = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            break;
        }
        any = true;
        let (chunk, done) = match memchr::memchr(b'\n', available) {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if skipped > 0 || buf.len() + chunk.len() > max {
            skipped += buf.len() + chunk.len();
            buf.clear();
        } else {
            buf.extend_from_slice(chunk);
        }
        let used = done.unwrap_or(available.len());
        reader.consume(used);
        if done.is_some() {
            break;
        }
    }
    if skipped > 0 {
        return Ok(Line::TooLong(skipped));
    }
    if !any {
        return Ok(Line::End);
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Line::Text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Cursor, Write};

    fn lines(input: &mut Input, max: usize) -> Vec<Result<String, usize>> {
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            match next_line(&mut input.reader, &mut buf, max).unwrap() {
                Line::Text => out.push(Ok(String::from_utf8(buf.clone()).unwrap())),
                Line::TooLong(n) => out.push(Err(n)),
                Line::End => return out,
            }
        }
    }

    #[test]
    fn plain_lines_crlf_and_a_last_line_without_newline() {
        let mut input = Input::from_reader("t", Cursor::new(b"a\r\nbb\n\nccc".to_vec())).unwrap();
        assert_eq!(
            lines(&mut input, 100),
            vec![
                Ok("a".into()),
                Ok("bb".into()),
                Ok("".into()),
                Ok("ccc".into())
            ]
        );
        assert_eq!(input.consumed.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn long_lines_are_skipped_not_buffered() {
        let mut input =
            Input::from_reader("t", Cursor::new(b"ok\n0123456789\nfine\n".to_vec())).unwrap();
        assert_eq!(
            lines(&mut input, 5),
            vec![Ok("ok".into()), Err(10), Ok("fine".into())]
        );
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
        let mut input = Input::from_reader("t.log", Cursor::new(both)).unwrap();
        assert_eq!(
            lines(&mut input, 100),
            vec![Ok("one".into()), Ok("two".into()), Ok("three".into())]
        );
    }

    #[test]
    fn opening_a_missing_file_or_a_directory_is_an_open_error() {
        let e = Input::open(Path::new("/nonexistent/oncely.jsonl")).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e
            .to_string()
            .starts_with("cannot open /nonexistent/oncely.jsonl"));
        let dir = tempfile::tempdir().unwrap();
        let e = Input::open(dir.path()).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
    }
}
