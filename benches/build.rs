//! Records the commit the benchmark binaries are built from: `TIERKIT_BUILD_COMMIT` is
//! `git rev-parse --short HEAD` of this checkout at build time, or `unknown` when git or the
//! repository is missing (a source copy, a machine without git). It never fails the build.
//! Uncommitted changes are not marked. The script reruns when HEAD moves (HEAD, the branch's ref,
//! packed refs).

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
    let commit = git(&dir, &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TIERKIT_BUILD_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
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
