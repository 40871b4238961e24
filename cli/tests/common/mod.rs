//! Helpers shared by the CLI integration tests: run the `tierkit` binary, expect success or a
//! clean failure, and make per-process temporary paths.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `tierkit args`, killing it after 60 s (a hang must fail the test, not stall CI).
pub fn tierkit(args: &[&str]) -> Output {
    run(args, Stdio::piped())
}

/// Runs `tierkit args` with stdout sent to `stdout` (e.g. `/dev/full`), killing it after 60 s.
pub fn tierkit_to(args: &[&str], stdout: std::fs::File) -> Output {
    run(args, stdout.into())
}

fn run(args: &[&str], stdout: Stdio) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tierkit"))
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("tierkit runs");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().expect("kill");
            panic!("tierkit {args:?} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// Runs `tierkit args`, asserts success and returns its stdout.
pub fn ok_stdout(args: &[&str]) -> String {
    let out = tierkit(args);
    assert!(
        out.status.success(),
        "tierkit {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Asserts a clean failure: exit code 1, no panic, one `error: ` line containing `want`.
pub fn fails_with(args: &[&str], want: &str) {
    let out = tierkit(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "tierkit {args:?}: {err}");
    assert!(
        !err.contains("panicked"),
        "tierkit {args:?} panicked: {err}"
    );
    assert!(err.starts_with("error: "), "tierkit {args:?}: {err}");
    assert!(
        err.contains(want),
        "tierkit {args:?}: want {want:?} in {err:?}"
    );
}

/// `name` in a per-process temporary directory `tierkit-{suite}-{pid}` (created).
pub fn temp(suite: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tierkit-{suite}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// [`fails_with`], and within `secs` seconds (refused before the work, not after it).
pub fn fails_within(args: &[&str], want: &str, secs: u64) {
    let start = Instant::now();
    fails_with(args, want);
    assert!(
        start.elapsed() < Duration::from_secs(secs),
        "tierkit {args:?} took {:?}",
        start.elapsed()
    );
}
