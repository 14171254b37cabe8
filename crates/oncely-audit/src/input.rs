//! Where lines come from: files, standard input or any reader, plain or gzip.
//!
//! Compression is recognised by content (the gzip magic bytes `1f 8b`), not by the file
//! name, so `-` can be gzip too; concatenated gzip members (`cat a.gz b.gz`) read as one
//! stream.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flate2::bufread::MultiGzDecoder;

use crate::AuditError;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn bytes_taken_are_counted_for_the_progress_bar() {
        let mut input = Input::from_reader("t", Cursor::new(vec![b'x'; 3000])).unwrap();
        let mut all = Vec::new();
        input.reader.read_to_end(&mut all).unwrap();
        assert_eq!(all.len(), 3000);
        assert_eq!(input.consumed.load(Ordering::Relaxed), 3000);
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
