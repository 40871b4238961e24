//! Bounded reads of side-input files: configs, seed maps, counter dumps, benchmark reports.
//!
//! Every file a tierkit loader reads whole goes through [`CappedReader`]: at most `cap` bytes,
//! and one byte more is an error ([`ReadError::TooLarge`]), never a longer read. A regular file
//! whose length is above the cap is refused before any byte is read; a stream without a length
//! (`/dev/zero`, a pipe) is cut at the cap. JSON is parsed as it streams ([`read_json`]), so
//! `/dev/zero` fails at its first byte and memory follows the parsed value, not the file.
//! The same rule as the trace readers' (`take` of the cap plus one probe byte); one home for it.

use std::io::{self, Read};
use std::path::Path;

/// Why a capped read failed. Every message starts with the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The file could not be opened or read (the OS error is part of the message, not a
    /// separate source, so it prints once).
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        error: io::Error,
    },
    /// The path is a directory.
    #[error("{path}: is a directory, not a file")]
    Directory {
        /// The path.
        path: String,
    },
    /// The file holds more than `cap` bytes.
    #[error("{path}: more than {} ({cap} bytes), the most this input may hold", show_bytes(*cap))]
    TooLarge {
        /// The file.
        path: String,
        /// The cap, bytes.
        cap: u64,
    },
    /// The file is not JSON of the expected shape (serde's message, with line and column).
    #[error("{path}: {error}")]
    Json {
        /// The file.
        path: String,
        /// The parse error.
        error: serde_json::Error,
    },
}

/// `bytes` in the largest binary unit that divides it (`64 MiB`, `1 KiB`, `100 B`).
pub fn show_bytes(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// A reader that yields at most `cap` bytes of `inner` and fails (with
/// [`io::ErrorKind::FileTooLarge`]) as soon as `inner` holds one byte more: an input exactly
/// `cap` bytes long reads whole, a longer one is never read past `cap + 1` bytes (a
/// [`std::io::Take`] of `cap + 1`, whose last byte is the probe).
#[derive(Debug)]
pub struct CappedReader<R> {
    inner: io::Take<R>,
    cap: u64,
    exceeded: bool,
}

impl<R: Read> CappedReader<R> {
    /// Wraps `inner`, allowing `cap` bytes.
    pub fn new(inner: R, cap: u64) -> Self {
        Self {
            inner: inner.take(cap.saturating_add(1)),
            cap,
            exceeded: false,
        }
    }

    /// Whether the input was found longer than the cap (every later read fails too).
    pub fn exceeded(&self) -> bool {
        self.exceeded
    }

    /// The cap, bytes.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    fn too_large(&mut self) -> io::Error {
        self.exceeded = true;
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("more than {} bytes", self.cap),
        )
    }
}

impl<R: Read> Read for CappedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.exceeded {
            return Err(self.too_large());
        }
        let n = self.inner.read(buf)?;
        if n > 0 && self.inner.limit() == 0 {
            // The probe byte came in: the input is longer than the cap.
            return Err(self.too_large());
        }
        Ok(n)
    }

    /// `Take`'s own `read_to_end` (it fills without zeroing first: a 1 GiB document reads at
    /// the speed of the device), then the probe check.
    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        if self.exceeded {
            return Err(self.too_large());
        }
        let n = self.inner.read_to_end(buf)?;
        if n > 0 && self.inner.limit() == 0 {
            buf.pop();
            return Err(self.too_large());
        }
        Ok(n)
    }
}

/// Opens `path` for reading at most `cap` bytes.
///
/// # Errors
/// [`ReadError::Io`] (missing file, no permission), [`ReadError::Directory`],
/// [`ReadError::TooLarge`] for a regular file longer than `cap` (nothing read).
pub fn open_capped(path: &Path, cap: u64) -> Result<CappedReader<std::fs::File>, ReadError> {
    let shown = || path.display().to_string();
    let io = |error| ReadError::Io {
        path: shown(),
        error,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    if meta.is_dir() {
        return Err(ReadError::Directory { path: shown() });
    }
    if meta.is_file() && meta.len() > cap {
        return Err(ReadError::TooLarge { path: shown(), cap });
    }
    Ok(CappedReader::new(f, cap))
}

/// The error of a read through `r` of `path`: [`ReadError::TooLarge`] when `r` hit its cap.
fn read_error<R: Read>(path: &Path, r: &CappedReader<R>, error: io::Error) -> ReadError {
    if r.exceeded() {
        ReadError::TooLarge {
            path: path.display().to_string(),
            cap: r.cap(),
        }
    } else {
        ReadError::Io {
            path: path.display().to_string(),
            error,
        }
    }
}

/// Reads the whole of `path`, at most `cap` bytes.
///
/// # Errors
/// As [`open_capped`]; [`ReadError::TooLarge`] for a stream longer than `cap` (read up to
/// `cap + 1` bytes, no further); [`ReadError::Io`] for read errors.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, ReadError> {
    let mut r = open_capped(path, cap)?;
    let mut out = Vec::new();
    match r.read_to_end(&mut out) {
        Ok(_) => Ok(out),
        Err(e) => Err(read_error(path, &r, e)),
    }
}

/// Parses `path` as JSON into `T` while reading it (at most `cap` bytes; nothing after the
/// value but whitespace): memory follows the parsed value, and input that is not JSON fails at
/// its first bad byte.
///
/// # Errors
/// As [`read_capped`]; [`ReadError::Json`] for input that is not a JSON `T` (an empty file
/// included).
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, cap: u64) -> Result<T, ReadError> {
    let mut r = open_capped(path, cap)?;
    match serde_json::from_reader(io::BufReader::new(&mut r)) {
        Ok(v) => Ok(v),
        Err(e) => Err(match e.io_error_kind() {
            Some(kind) => read_error(path, &r, io::Error::new(kind, e.to_string())),
            None => ReadError::Json {
                path: path.display().to_string(),
                error: e,
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tier-core-capped-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    #[test]
    fn reads_up_to_the_cap_and_refuses_one_byte_more() {
        let p = temp("exact");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_capped(&p, 10).unwrap(), b"0123456789");
        assert_eq!(read_capped(&p, 11).unwrap(), b"0123456789");
        let e = read_capped(&p, 9).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { cap: 9, .. }), "{e}");
        assert!(
            e.to_string().starts_with(&p.display().to_string()),
            "the message names the file: {e}"
        );
        // A stream (no length) is cut at the cap + 1 probe byte, never read further.
        let mut src = io::repeat(7).take(1 << 30);
        let mut r = CappedReader::new(&mut src, 100);
        let mut out = Vec::new();
        let e = r.read_to_end(&mut out).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert!(r.exceeded());
        assert_eq!(out.len(), 100);
        assert!(r.read(&mut [0u8; 4]).is_err(), "fails again after the cap");
        assert_eq!(src.limit(), (1 << 30) - 101);
        let mut ok = CappedReader::new(&b"abc"[..], 3);
        let mut out = Vec::new();
        ok.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"abc");
        assert!(!ok.exceeded());
    }

    #[test]
    fn a_sparse_file_above_the_cap_is_refused_before_reading() {
        let p = temp("sparse");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(5 << 30).unwrap(); // 5 GiB, no disk used
        let e = read_capped(&p, 1 << 20).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("1 MiB"), "{e}");
        let e = read_json::<serde_json::Value>(&p, 1 << 20).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { .. }), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn directories_missing_files_and_bad_json_are_named_errors() {
        let dir = std::env::temp_dir();
        assert!(matches!(
            read_capped(&dir, 10),
            Err(ReadError::Directory { .. })
        ));
        let missing = temp("no-such-file");
        let e = read_json::<serde_json::Value>(&missing, 10).unwrap_err();
        assert!(matches!(e, ReadError::Io { .. }), "{e}");
        assert!(
            std::error::Error::source(&e).is_none(),
            "cause printed once"
        );
        let p = temp("bad.json");
        std::fs::write(&p, b"{\"a\": ").unwrap();
        let e = read_json::<serde_json::Value>(&p, 100).unwrap_err();
        assert!(matches!(e, ReadError::Json { .. }), "{e}");
        // JSON longer than the cap: TooLarge, not a parse error.
        std::fs::write(&p, b"[1, 2, 3, 4, 5, 6]").unwrap();
        let e = read_json::<serde_json::Value>(&p, 8).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { .. }), "{e}");
        assert_eq!(
            read_json::<Vec<u32>>(&p, 18).unwrap(),
            vec![1, 2, 3, 4, 5, 6]
        );
        assert_eq!(show_bytes(64 << 20), "64 MiB");
        assert_eq!(show_bytes(1000), "1000 B");
    }

    #[cfg(unix)]
    #[test]
    fn dev_zero_fails_fast() {
        let zero = Path::new("/dev/zero");
        if !zero.exists() {
            println!("SKIP dev_zero_fails_fast: no /dev/zero");
            return;
        }
        let e = read_capped(zero, 1 << 16).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { .. }), "{e}");
        // JSON stops at the first NUL byte, whatever the cap.
        let e = read_json::<serde_json::Value>(zero, 1 << 40).unwrap_err();
        assert!(matches!(e, ReadError::Json { .. }), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]
        /// Any bytes and any cap: the reader returns the input when it fits, else fails after
        /// at most `cap + 1` bytes.
        #[test]
        fn capped_reader_returns_the_input_or_refuses_it(
            data in proptest::collection::vec(any::<u8>(), 0..256),
            cap in 0u64..300,
        ) {
            let mut src = &data[..];
            let mut r = CappedReader::new(&mut src, cap);
            let mut out = Vec::new();
            let res = r.read_to_end(&mut out);
            if data.len() as u64 <= cap {
                prop_assert!(res.is_ok());
                prop_assert_eq!(&out, &data);
            } else {
                prop_assert!(res.is_err());
                prop_assert!(r.exceeded());
                prop_assert_eq!(out.len() as u64, cap);
                prop_assert_eq!(src.len() as u64, data.len() as u64 - cap - 1);
            }
        }
    }
}
