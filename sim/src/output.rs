//! Output paths of the lab's commands, checked before the work that fills them (minutes of
//! simulation or of GPU runs) rather than after.

use std::path::Path;

/// Fails when `path` (the value of command-line flag `flag`, named in the message) cannot be
/// written as a new file: it is a directory, or its directory does not exist or is not one.
///
/// # Errors
/// A one-line message naming the flag and the path.
pub fn check_writable(flag: &str, path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!("{flag} {}: is a directory", path.display()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        let why = if dir.exists() {
            "is not a directory"
        } else {
            "does not exist"
        };
        return Err(format!(
            "{flag} {}: directory {} {why}",
            path.display(),
            dir.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_and_missing_parents_are_refused_naming_the_flag() {
        let dir = std::env::temp_dir();
        assert!(check_writable("--out", &dir.join("x.json")).is_ok());
        assert!(check_writable("--out", Path::new("x.json")).is_ok());
        let e = check_writable("--out", &dir).unwrap_err();
        assert!(
            e.starts_with("--out ") && e.ends_with("is a directory"),
            "{e}"
        );
        let e = check_writable("--json", Path::new("/nonexistent-dir/x.json")).unwrap_err();
        assert!(e.contains("--json") && e.contains("does not exist"), "{e}");
        let file = dir.join(format!("tierkit-output-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        let e = check_writable("--plot", &file.join("x.png")).unwrap_err();
        assert!(e.contains("is not a directory"), "{e}");
        std::fs::remove_file(&file).unwrap();
    }
}
