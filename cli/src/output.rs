//! Everything the commands write: stdout lines that fail as errors instead of panicking, warnings
//! on stderr that never fail the command, and output paths checked before the work that fills
//! them.
//!
//! A full or failing stdout (`tierkit ... > /dev/full`) is an error: `error: cannot write to
//! stdout: ...`, exit 1. A closed pipe (`tierkit ... | head`) is not: SIGPIPE keeps its default
//! action (`main`), so the command ends quietly, as other command-line tools do.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

/// stdout could not be written (a full disk, an I/O error).
#[derive(Debug, thiserror::Error)]
#[error("cannot write to stdout: {0}")]
pub struct StdoutError(#[from] std::io::Error);

/// Writes `args` and a newline to stdout (the `outln!` macro).
///
/// # Errors
/// [`StdoutError`].
pub fn line(args: fmt::Arguments) -> Result<(), StdoutError> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(StdoutError)
}

/// Flushes stdout (at the end of a command: output still buffered must fail as an error too).
///
/// # Errors
/// [`StdoutError`].
pub fn flush() -> Result<(), StdoutError> {
    std::io::stdout().flush().map_err(StdoutError)
}

/// Writes `args` and a newline to stderr, ignoring errors: a warning or the final error message
/// has nowhere else to go, and must never turn into a panic.
pub fn eline(args: fmt::Arguments) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.write_all(b"\n"));
}

/// `println!` that returns `Result<(), StdoutError>` instead of panicking on a failed write; use
/// with `?`.
macro_rules! outln {
    () => {
        $crate::output::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics (errors writing stderr are ignored).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::eline(format_args!($($arg)*))
    };
}

/// Whether `path` names a file: its last component is a name, and it does not end with a
/// separator (`Path` drops a trailing `/`, so `dir/` would read as the file `dir`).
fn ends_in_file_name(path: &Path) -> bool {
    let s = path.as_os_str().to_string_lossy();
    !s.ends_with('/')
        && !s.ends_with(std::path::MAIN_SEPARATOR)
        && matches!(
            path.components().next_back(),
            Some(std::path::Component::Normal(_))
        )
}

/// Checks `--flag FILE.png` before the run: a `.png` name (the only format the charts are
/// written in) whose directory exists.
///
/// # Errors
/// A message naming the flag and the path.
pub fn check_png(flag: &str, path: &Path) -> Result<(), String> {
    let png = path
        .extension()
        .and_then(|x| x.to_str())
        .is_some_and(|x| x.eq_ignore_ascii_case("png"));
    if !png || !ends_in_file_name(path) {
        return Err(format!(
            "{flag} {}: charts are written as PNG: give a FILE.png path",
            path.display()
        ));
    }
    tierkit_sim::output::check_writable(flag, path)
}

/// The prefix of `--flag PREFIX` charts (`PREFIX-<chart>.png`), checked before the run: it must
/// end in a file name (`dir/` or `dir/..` would write `dir/-<chart>.png`), and its directory must
/// exist. A trailing `.png` is dropped (`bench.png` writes `bench-tokens.png`, not
/// `bench.png-tokens.png`).
///
/// # Errors
/// A message naming the flag and the path.
pub fn chart_prefix(flag: &str, prefix: &Path) -> Result<PathBuf, String> {
    let shown = prefix.display().to_string();
    if !ends_in_file_name(prefix) || prefix.is_dir() {
        return Err(format!(
            "{flag} {shown}: {}a file name prefix is needed (the charts are \
             PREFIX-<chart>.png), e.g. {}",
            if prefix.is_dir() {
                "is a directory; "
            } else {
                ""
            },
            match shown.trim_end_matches('/') {
                "" => PathBuf::from("/run"),
                dir => Path::new(dir).join("run"),
            }
            .display()
        ));
    }
    let prefix = match prefix.extension().and_then(|x| x.to_str()) {
        Some(x) if x.eq_ignore_ascii_case("png") => prefix.with_extension(""),
        _ => prefix.to_path_buf(),
    };
    tierkit_sim::output::check_writable(flag, &prefix)?;
    Ok(prefix)
}

/// `prefix` + `suffix` (`run` + `-tokens.png`).
pub fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_paths_and_chart_prefixes_are_checked_up_front() {
        let dir = std::env::temp_dir();
        assert!(check_png("--plot", &dir.join("a.png")).is_ok());
        assert!(check_png("--plot", &dir.join("a.PNG")).is_ok());
        for bad in ["a", "a.svg", "a.png/"] {
            let e = check_png("--plot", &dir.join(bad)).unwrap_err();
            assert!(e.starts_with("--plot ") && e.contains("PNG"), "{bad}: {e}");
        }
        let e = check_png("--plot", Path::new("/nonexistent-dir/a.png")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");

        let p = chart_prefix("--out", &dir.join("bench")).unwrap();
        assert_eq!(p, dir.join("bench"));
        assert_eq!(chart_prefix("--out", &dir.join("bench.png")).unwrap(), p);
        assert_eq!(with_suffix(&p, "-tokens.png"), dir.join("bench-tokens.png"));
        for bad in [
            dir.clone(),
            PathBuf::from(format!("{}/", dir.join("new").display())),
            dir.join(".."),
            PathBuf::from("."),
        ] {
            let e = chart_prefix("--out", &bad).unwrap_err();
            assert!(e.contains("a file name prefix is needed"), "{bad:?}: {e}");
        }
        let e = chart_prefix("--plot", Path::new("/nonexistent-dir/run")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }
}
