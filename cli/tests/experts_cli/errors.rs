//! Bad input: clear errors for bad flags and files, typed errors for hostile sizes and values, a
//! closed stdout pipe.

use crate::common::{fails_with, ok_stdout, tierkit};
use crate::{temp, TINY};

#[test]
fn bad_inputs_fail_with_clear_errors() {
    let bad = temp("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"layer\": 0, \"topk_ids\": [1, 2]}\n{\"layer\": 0, \"topk_ids\": [1, 2\n",
    )
    .unwrap();
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec!["--trace".into(), bad.display().to_string()],
            format!("{}:2: malformed", bad.display()),
        ),
        (
            vec![
                "--trace".into(),
                bad.display().to_string(),
                "--format".into(),
                "logger-jsonl".into(),
                "--experts".into(),
                "2".into(),
            ],
            "expert id 2 out of range".into(),
        ),
        (
            vec!["--trace".into(), "/nonexistent/x.tkt".into()],
            "/nonexistent/x.tkt".into(),
        ),
        (
            vec!["--hot".into(), "65".into()],
            "hot_per_layer 65 exceeds".into(),
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["experts".to_string(), "replay".into()];
        args.extend(TINY.iter().map(|s| s.to_string()));
        args.extend(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = tierkit(&refs);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&want),
            "{args:?}: stderr {err:?} lacks {want:?}"
        );
    }
    // A truncated binary trace.
    let tkt = temp("trunc.tkt");
    let mut args = vec!["experts", "synth", "--out", tkt.to_str().unwrap()];
    args.extend_from_slice(TINY);
    ok_stdout(&args);
    let bytes = std::fs::read(&tkt).unwrap();
    std::fs::write(&tkt, &bytes[..bytes.len() / 2]).unwrap();
    let out = tierkit(&["experts", "replay", "--trace", tkt.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("truncated binary trace at byte offset"),
        "{err}"
    );
}

#[test]
fn hostile_sizes_and_values_are_typed_errors() {
    let tkt = temp("hostile.tkt");
    let out = tkt.to_str().unwrap();
    // Step and token counts that used to overflow or abort on allocation.
    fails_with(
        &[
            "experts",
            "synth",
            "--out",
            out,
            "--steps",
            "18446744073709551615",
        ],
        "exceed the limit",
    );
    fails_with(
        &["experts", "replay", "--steps", "1000000000"],
        "in-memory limit",
    );
    fails_with(
        &["experts", "inspect", "--tokens", "4294967295"],
        "tokens per step exceed",
    );
    // Unchecked floats and stand-in sizes, refused before any trace is generated.
    for v in ["NaN", "-1", "0", "inf"] {
        let arg = format!("--step-time-s={v}");
        fails_with(
            &["experts", "replay", &arg],
            "step_time_s must be finite and > 0",
        );
    }
    for v in ["18446744073709551615", "1152921504606846976", "10000000000"] {
        fails_with(
            &[
                "experts",
                "replay",
                "--policy",
                "adaptive",
                "--verify-bytes",
                v,
            ],
            "verify_bytes",
        );
    }
    // Config files: a huge window and an unknown (misspelt) field.
    let cfg = temp("win.json");
    std::fs::write(&cfg, r#"{"window_drains": 100000000}"#).unwrap();
    fails_with(
        &["experts", "replay", "--config", cfg.to_str().unwrap()],
        &format!(
            "{}: invalid config: window_drains must be in 1..=1024",
            cfg.display()
        ),
    );
    std::fs::write(&cfg, r#"{"drain_evry": 8}"#).unwrap();
    fails_with(
        &["experts", "replay", "--config", cfg.to_str().unwrap()],
        "unknown field `drain_evry`",
    );
    // Mixtral records with a huge layer or expert count from the options.
    let m = temp("m.jsonl");
    std::fs::write(
        &m,
        r#"{"problem_id": 0, "layer": 0, "experts": [1, 2], "token_idx": 0}"#,
    )
    .unwrap();
    for (flag, v) in [("--layers", "1000000000"), ("--experts", "4000000000")] {
        fails_with(
            &[
                "experts",
                "inspect",
                "--trace",
                m.to_str().unwrap(),
                flag,
                v,
            ],
            "exceed the limit",
        );
    }
    // A logger line listing one expert twice in a token.
    std::fs::write(&m, "{\"layer\": 0, \"topk_ids\": [3, 3]}\n").unwrap();
    fails_with(
        &["experts", "inspect", "--trace", m.to_str().unwrap()],
        &format!("{}:1: expert 3 appears twice", m.display()),
    );
    // fit-seed from routing counts at a huge shape.
    let rc = temp("rc.json");
    std::fs::write(
        &rc,
        r#"{"m": {"d": {"layers": [0], "topk_counts": [{"0": 1, "1": 2}]}}}"#,
    )
    .unwrap();
    let rcs = rc.to_str().unwrap();
    fails_with(
        &[
            "experts",
            "fit-seed",
            "--routing-counts",
            rcs,
            "--model",
            "m",
            "--domain",
            "d",
            "--layers",
            "100000",
            "--experts",
            "100000",
        ],
        &format!("{}: too large: profile d:", rc.display()),
    );
    // A counter dump whose counts are short.
    let dump = temp("dump.json");
    std::fs::write(
        &dump,
        r#"{"name": "s", "layers": 2, "experts_per_layer": 4, "counts": [1, 2]}"#,
    )
    .unwrap();
    fails_with(
        &["experts", "fit-seed", "--dump", dump.to_str().unwrap()],
        &format!("{}: length mismatch", dump.display()),
    );
}

/// `tierkit ... | head`: a reader that closes the pipe early ends the command by SIGPIPE, as for
/// other command-line tools, never with a panic message.
#[cfg(unix)]
#[test]
fn a_closed_stdout_pipe_ends_the_command_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_tierkit"))
        .args([
            "experts",
            "replay",
            "--steps",
            "600",
            "--policy",
            "static,lru",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tierkit runs");
    let mut first = [0u8; 16];
    child
        .stdout
        .take()
        .expect("stdout")
        .read_exact(&mut first)
        .expect("some output");
    // the read end is dropped here, like `head -c 16`
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{:?} {err}",
        out.status
    );
}
