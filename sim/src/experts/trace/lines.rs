//! Bounded reading of text traces: every line, every run of blank lines and every trace's total
//! picks has a ceiling, so a hostile input (`/dev/zero`, one 100 MB line, an endless stream of
//! newlines, a log of billions of rows) fails quickly with a typed [`TraceError`] instead of
//! aborting on an allocation or filling memory.

use super::TraceError;
use std::io::{BufRead, Read};

/// Longest line a JSONL trace may hold, in bytes (without the newline). A routing record of a
/// top-8 token is about 200 bytes; a meta line a few hundred.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Most blank lines in a row a JSONL trace may hold.
pub const MAX_BLANK_RUN: u64 = 1 << 20;

/// Most expert ids (picks) one read may keep in memory: 2^28 ids, 1 GiB as `u32`. The default
/// synthetic scenario holds 36.9 M.
pub const MAX_PICKS: u64 = 1 << 28;

/// Most bytes a whole-document format (`.tkt` binary, `Trace` JSON, counts JSON) may hold.
pub const MAX_DOCUMENT_BYTES: u64 = 1 << 30;

/// The non-blank lines of a reader with their 1-based line numbers, each at most
/// [`MAX_LINE_BYTES`] long (read through a capped `take`, so a longer line is never held in
/// full). Stops after the first error.
pub(crate) struct BoundedLines<'a, R> {
    reader: R,
    path: &'a str,
    line: u64,
    blank_run: u64,
    buf: Vec<u8>,
    done: bool,
}

impl<'a, R: BufRead> BoundedLines<'a, R> {
    pub(crate) fn new(reader: R, path: &'a str) -> Self {
        Self {
            reader,
            path,
            line: 0,
            blank_run: 0,
            buf: Vec::new(),
            done: false,
        }
    }

    fn next_line(&mut self) -> Option<Result<(u64, String), TraceError>> {
        loop {
            self.buf.clear();
            let cap = MAX_LINE_BYTES as u64 + 1;
            let n = match (&mut self.reader)
                .take(cap)
                .read_until(b'\n', &mut self.buf)
            {
                Ok(n) => n,
                Err(e) => return Some(Err(TraceError::io(self.path, e))),
            };
            if n == 0 {
                return None;
            }
            self.line += 1;
            if self.buf.last() == Some(&b'\n') {
                self.buf.pop();
            } else if self.buf.len() > MAX_LINE_BYTES {
                return Some(Err(TraceError::malformed(
                    self.path,
                    self.line,
                    format!(
                        "line longer than {MAX_LINE_BYTES} bytes: not a JSONL routing trace (is \
                         this the right file, or a binary file read as text?)"
                    ),
                )));
            }
            if self.buf.last() == Some(&b'\r') {
                self.buf.pop();
            }
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t,
                Err(e) => {
                    return Some(Err(TraceError::malformed(
                        self.path,
                        self.line,
                        format!("line is not UTF-8 text ({e}): not a JSONL routing trace"),
                    )))
                }
            };
            if text.trim().is_empty() {
                self.blank_run += 1;
                if self.blank_run > MAX_BLANK_RUN {
                    return Some(Err(TraceError::malformed(
                        self.path,
                        self.line,
                        format!("more than {MAX_BLANK_RUN} blank lines in a row: not a JSONL routing trace"),
                    )));
                }
                continue;
            }
            self.blank_run = 0;
            return Some(Ok((self.line, text.to_string())));
        }
    }
}

impl<R: BufRead> Iterator for BoundedLines<'_, R> {
    type Item = Result<(u64, String), TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.next_line();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}

/// Counts picks kept in memory against [`MAX_PICKS`].
#[derive(Debug, Default)]
pub(crate) struct PickBudget {
    used: u64,
}

impl PickBudget {
    /// Charges `n` picks read at `path:line`.
    ///
    /// # Errors
    /// [`TraceError::TooLarge`] past [`MAX_PICKS`].
    pub(crate) fn charge(&mut self, n: usize, path: &str, line: u64) -> Result<(), TraceError> {
        self.used = self.used.saturating_add(n as u64);
        if self.used > MAX_PICKS {
            return Err(TraceError::TooLarge(format!(
                "{path}:{line}: more than {MAX_PICKS} expert picks; split the log (e.g. with \
                 `split -l`) and read the parts one at a time"
            )));
        }
        Ok(())
    }
}

/// Opens a whole-document file (binary trace, `Trace` JSON, counts JSON) for reading at most
/// [`MAX_DOCUMENT_BYTES`] bytes ([`tier_core::open_capped`], the rule every side-input file
/// follows), with its first (up to) `head` bytes already read. Callers check the head (magic
/// bytes, first character) before reading on, so `/dev/zero` fails after a few bytes.
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::TooLarge`] for a regular file above the cap.
pub(crate) fn open_document(
    path: &std::path::Path,
    head: usize,
) -> Result<
    (
        Vec<u8>,
        std::io::BufReader<tier_core::CappedReader<std::fs::File>>,
    ),
    TraceError,
> {
    let p = path.display().to_string();
    let f = tier_core::open_capped(path, MAX_DOCUMENT_BYTES).map_err(|e| match e {
        tier_core::ReadError::TooLarge { .. } => too_large(&p),
        tier_core::ReadError::Io { error, .. } => TraceError::io(&p, error),
        _ => TraceError::io(
            &p,
            std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "is a directory, not a file",
            ),
        ),
    })?;
    let mut r = std::io::BufReader::new(f);
    let mut first = Vec::new();
    (&mut r)
        .take(head as u64)
        .read_to_end(&mut first)
        .map_err(|e| read_error(&p, e))?;
    Ok((first, r))
}

fn too_large(p: &str) -> TraceError {
    TraceError::TooLarge(format!(
        "{p}: more than the {MAX_DOCUMENT_BYTES} bytes a trace or counts file may hold; split it"
    ))
}

/// A read error of a capped document: [`TraceError::TooLarge`] past the cap.
fn read_error(p: &str, e: std::io::Error) -> TraceError {
    if e.kind() == std::io::ErrorKind::FileTooLarge {
        too_large(p)
    } else {
        TraceError::io(p, e)
    }
}

/// Reads the rest of a document opened by [`open_document`] behind its head.
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::TooLarge`] past [`MAX_DOCUMENT_BYTES`].
pub(crate) fn read_rest(
    mut head: Vec<u8>,
    mut r: impl Read,
    path: &str,
) -> Result<Vec<u8>, TraceError> {
    r.read_to_end(&mut head).map_err(|e| read_error(path, e))?;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_blank_runs_and_crlf() {
        let text = "a\r\n\n  \nb\n";
        let got: Vec<_> = BoundedLines::new(text.as_bytes(), "f")
            .map(Result::unwrap)
            .collect();
        assert_eq!(got, vec![(1, "a".to_string()), (4, "b".to_string())]);
        let exact = "x".repeat(MAX_LINE_BYTES) + "\n";
        assert_eq!(BoundedLines::new(exact.as_bytes(), "f").count(), 1);
        let long = "x".repeat(MAX_LINE_BYTES + 1);
        let e = BoundedLines::new(long.as_bytes(), "f")
            .next()
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, TraceError::Malformed { line: 1, .. }), "{e}");
        let mut it = BoundedLines::new(
            std::io::BufReader::new(std::io::repeat(b'\n').take(MAX_BLANK_RUN + 10)),
            "f",
        );
        assert!(matches!(it.next(), Some(Err(TraceError::Malformed { .. }))));
        assert!(it.next().is_none());
    }

    #[test]
    fn pick_budget_refuses_past_the_cap() {
        let mut b = PickBudget::default();
        b.charge(MAX_PICKS as usize, "f", 1).unwrap();
        assert!(matches!(b.charge(1, "f", 2), Err(TraceError::TooLarge(_))));
    }
}
