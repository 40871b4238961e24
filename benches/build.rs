//! Records the commit the benchmark binaries are built from: `TIERKIT_BUILD_COMMIT` is
//! `git rev-parse --short HEAD` of this checkout at build time, with `-dirty` appended when tracked
//! files differ from it (`git status --porcelain --untracked-files=no`), or `unknown` when git or
//! the repository is missing (a source copy, a machine without git). It never fails the build.
//! The script reruns when HEAD moves (HEAD, the branch's ref, packed refs), when the index
//! changes, and when anything under the repository's tracked top-level folders changes (so an
//! edit after a clean build marks the next one dirty; `target/` is not among them).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `git args` run in the package directory: its trimmed stdout, or `None` on any failure.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = match git(&dir, &["rev-parse", "--short", "HEAD"]) {
        // `git status` prints nothing for a clean tree (then `git` gives None)
        Some(c) => match git(&dir, &["status", "--porcelain", "--untracked-files=no"]) {
            Some(_) => format!("{c}-dirty"),
            None => c,
        },
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=TIERKIT_BUILD_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    // The tracked top-level folders of the repository (cargo scans a folder recursively).
    if let Some(top) = git(&dir, &["rev-parse", "--show-toplevel"]) {
        let top = PathBuf::from(top);
        for d in git(&top, &["ls-tree", "-d", "--name-only", "HEAD"])
            .unwrap_or_default()
            .lines()
        {
            let p = top.join(d);
            if p.is_dir() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    let mut watched = vec![
        "HEAD".to_string(),
        "packed-refs".to_string(),
        "index".to_string(),
    ];
    watched.extend(git(&dir, &["symbolic-ref", "-q", "HEAD"]));
    for name in &watched {
        // Relative paths are relative to `dir`; only existing files (a missing one would make
        // cargo rerun the script on every build).
        if let Some(p) = git(&dir, &["rev-parse", "--git-path", name]).map(|p| dir.join(p)) {
            if p.is_file() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
}
