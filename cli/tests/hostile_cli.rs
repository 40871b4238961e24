//! Hostile input to the `tierkit` binary, tried as a new user would: side-input files that are
//! huge, endless, empty, directories or JSON of the wrong shape; stdout on a full disk; counts far
//! beyond any use; degenerate runs; odd output names. Every case ends in one `error:` line and
//! exit 1 (or a warning), quickly, never a panic, an unbounded read or a run of hours.

mod common;

use std::path::{Path, PathBuf};

use common::{fails_with, fails_within, ok_stdout, tierkit, tierkit_to};

fn temp(name: &str) -> PathBuf {
    common::temp("hostile-cli-tests", name)
}

const TINY: &[&str] = &["--steps", "60", "--tokens", "2", "--seed", "5"];

/// `base` + the flag and file + TINY, as owned args.
fn with(base: &[&str], flag: &str, path: &Path) -> Vec<String> {
    let mut v: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    if !flag.is_empty() {
        v.push(flag.to_string());
    }
    v.push(path.display().to_string());
    v
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Every command that reads a side-input file, as (args before the path, flag, what a name in
/// its error looks like).
fn side_inputs() -> Vec<(Vec<&'static str>, &'static str)> {
    vec![
        (
            vec!["experts", "replay", "--steps", "60", "--tokens", "2"],
            "--config",
        ),
        (
            vec![
                "experts", "replay", "--steps", "60", "--tokens", "2", "--policy", "seed",
            ],
            "--seed-map",
        ),
        (vec!["experts", "fit-seed"], "--dump"),
        (vec!["experts", "fit-seed"], "--routing-counts"),
        (
            vec!["kv", "simulate", "--quiet", "--steps", "10"],
            "--time-from",
        ),
        (vec!["kv", "fit-time"], ""),
        (
            vec!["kv", "plot-bench", "--out", "/tmp/tierkit-hostile-x"],
            "",
        ),
    ]
}

fn flag_shown(flag: &str) -> &str {
    if flag.is_empty() {
        "report"
    } else {
        flag
    }
}

#[test]
fn side_input_files_are_bounded_and_name_their_flag() {
    // A sparse file of 5 GiB (no disk used): above every cap. The old loaders read it whole
    // (2.1 GB of memory for a 2 GB file); now each refuses it before reading.
    let huge = temp("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(5 << 30)
        .unwrap();
    let dir = temp("a-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let empty = temp("empty.json");
    std::fs::write(&empty, "").unwrap();
    let array = temp("array.json");
    std::fs::write(&array, "[1, 2]").unwrap();
    for (base, flag) in side_inputs() {
        let shown = flag_shown(flag);
        let args = with(&base, flag, &huge);
        fails_within(
            &refs(&args),
            &format!("{shown} {}: more than ", huge.display()),
            20,
        );
        let args = with(&base, flag, &dir);
        fails_within(
            &refs(&args),
            &format!("{shown} {}: is a directory", dir.display()),
            20,
        );
        let args = with(&base, flag, &empty);
        fails_within(&refs(&args), &format!("{shown} {}: ", empty.display()), 20);
        let args = with(&base, flag, &array);
        fails_within(&refs(&args), &format!("{shown} {}: ", array.display()), 20);
        // An endless stream: refused at its first byte (every loader parses as it reads).
        #[cfg(unix)]
        {
            let args = with(&base, flag, Path::new("/dev/zero"));
            fails_within(&refs(&args), &format!("{shown} /dev/zero: "), 20);
        }
    }
}

#[test]
fn configs_that_are_arrays_are_refused_not_bound_by_position() {
    // `[8, 100.0]` used to run as drain_every 8, half_life_steps 100, everything else default.
    let cfg = temp("array-config.json");
    std::fs::write(&cfg, "[8, 100.0]").unwrap();
    let mut args = vec!["experts", "replay", "--config", cfg.to_str().unwrap()];
    args.extend_from_slice(TINY);
    fails_with(
        &args,
        "invalid type: sequence, expected a controller config",
    );
    std::fs::write(&cfg, r#"{"shift_response": [2.0]}"#).unwrap();
    fails_with(
        &args,
        "expected a shift response as an object of named fields",
    );
    let map = temp("array-map.json");
    std::fs::write(&map, r#"["tierkit.expert-residency.rowmap", 1, "m"]"#).unwrap();
    let mut args = vec!["experts", "replay", "--seed-map", map.to_str().unwrap()];
    args.extend_from_slice(TINY);
    fails_with(&args, "expected a rowmap file as an object of named fields");
}

#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        println!("SKIP a_full_stdout_is_an_error_not_a_panic: no /dev/full");
        return;
    }
    let tkt = temp("full.tkt");
    let mut synth = vec!["experts", "synth", "--out", tkt.to_str().unwrap()];
    synth.extend_from_slice(TINY);
    ok_stdout(&synth);
    let report = temp("full-report.json");
    std::fs::write(
        &report,
        r#"{"runs": [{"placement": "elastic", "load": 1, "summary": {"tokens_per_s": 5},
            "steps": [{"batch": 1, "misses": 0, "step_us": 10}, {"batch": 2, "misses": 5,
            "step_us": 14}, {"batch": 3, "misses": 1, "step_us": 15}, {"batch": 5,
            "misses": 9, "step_us": 23}]}]}"#,
    )
    .unwrap();
    let t = tkt.to_str().unwrap();
    let r = report.to_str().unwrap();
    let prefix = temp("full-bench");
    let cases: Vec<Vec<&str>> = vec![
        [&["experts", "replay", "--policy", "static"][..], TINY].concat(),
        [
            &["experts", "replay", "--json", "--policy", "static"][..],
            TINY,
        ]
        .concat(),
        vec!["experts", "fit-seed", "--trace", t],
        vec!["experts", "inspect", "--trace", t],
        [&["experts", "synth", "--out", t][..], TINY].concat(),
        vec!["kv", "simulate", "--quiet", "--steps", "20"],
        vec![
            "kv",
            "calibrate",
            "--steps",
            "3",
            "--top-k",
            "8",
            "--history",
            "100",
        ],
        vec!["kv", "fit-time", r],
        vec!["kv", "plot-bench", r, "--out", prefix.to_str().unwrap()],
        vec!["--help"],
        vec!["kv", "simulate", "--help"],
        vec!["--version"],
    ];
    for args in cases {
        // Used to panic in `println!` with exit 101.
        let out = tierkit_to(
            &args,
            std::fs::OpenOptions::new().write(true).open(full).unwrap(),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.starts_with("error: cannot write to stdout: No space left on device"),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    }
}

#[test]
fn counts_where_the_work_grows_are_capped_naming_the_flag() {
    // Used to run ~10 h (and wrap the u32 pick counters).
    let mut args = vec!["experts", "replay", "--count-run-starts", "4294967295"];
    args.extend_from_slice(TINY);
    fails_within(
        &args,
        "--count-run-starts 4294967295: must be in [1, 256] picks per run start",
        10,
    );
    args[3] = "0";
    fails_within(&args, "--count-run-starts 0: must be in [1, 256]", 10);
    // Used never to end.
    fails_within(
        &[
            "kv",
            "simulate",
            "--quiet",
            "--steps",
            "9223372036854775807",
        ],
        "--steps 9223372036854775807: must be in [1, 1000000] decode steps",
        10,
    );
    fails_within(
        &["kv", "calibrate", "--steps", "4000000000"],
        "--steps 4000000000: must be in [3, 100000]",
        10,
    );
    let loads: Vec<String> = (1..=65).map(|i| i.to_string()).collect();
    fails_within(
        &["kv", "simulate", "--quiet", "--loads", &loads.join(",")],
        "--loads: 65 values, at most 64",
        10,
    );
}

#[test]
fn degenerate_runs_are_refused_or_warned() {
    // Used to print a table of zeros with exit 0.
    fails_within(
        &["kv", "simulate", "--quiet", "--steps", "0"],
        "--steps 0: must be in [1, 1000000]",
        10,
    );
    // Used to report 0% misses without a word: top-k 5000 of a 100-token history is all of it.
    fails_within(
        &["kv", "calibrate", "--top-k", "5000", "--history", "100"],
        "--top-k 5000 is not below --history 100: every step picks the whole history",
        10,
    );
    // Hot caches of 4 × 64 = 256 rows hold a 200-token history: measured, with a warning.
    let out = tierkit(&[
        "kv",
        "calibrate",
        "--top-k",
        "64",
        "--history",
        "200",
        "--steps",
        "6",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.starts_with("warning: hot caches of 256 rows or more hold the whole --history 200"),
        "{err}"
    );
}

#[test]
fn trace_flags_without_a_trace_are_warned_and_outputs_name_their_flag() {
    // `--layers 0` used to pass silently: the synthetic scenario has its own shape.
    let mut args = vec!["experts", "inspect", "--layers", "0", "--skip-steps", "3"];
    args.extend_from_slice(TINY);
    let out = tierkit(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.starts_with(
            "warning: --layers, --skip-steps only apply to --trace files; the synthetic \
             scenario ignores them"
        ),
        "{err}"
    );
    // Output files that cannot be written name their flag (no `format:` prefix).
    let tkt = temp("outs.tkt");
    let mut synth = vec!["experts", "synth", "--out", tkt.to_str().unwrap()];
    synth.extend_from_slice(TINY);
    ok_stdout(&synth);
    let dir = temp("outs-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    fails_with(
        &[
            "experts",
            "fit-seed",
            "--trace",
            tkt.to_str().unwrap(),
            "--out",
            d,
        ],
        &format!("--out {d}: Is a directory"),
    );
    synth[3] = d;
    fails_with(&synth, &format!("--out {d}: Is a directory"));
}

#[test]
fn plot_names_are_checked_before_the_run() {
    // A name without .png used to fail after the whole run with plotters' Rust debug text.
    for bad in ["cold-share", "cold-share.svg"] {
        let p = temp(bad);
        let mut args = vec!["experts", "replay", "--plot", p.to_str().unwrap()];
        args.extend_from_slice(TINY);
        fails_within(
            &args,
            &format!(
                "--plot {}: charts are written as PNG: give a FILE.png path",
                p.display()
            ),
            10,
        );
    }
    let mut args = vec!["experts", "replay", "--plot", "/nonexistent/dir/x.png"];
    args.extend_from_slice(TINY);
    fails_within(&args, "--plot /nonexistent/dir/x.png: directory", 10);

    // `--out dir/` used to write `dir/-tokens.png`; `--out x.png`, `x.png-tokens.png`.
    let report = temp("names-report.json");
    std::fs::write(
        &report,
        r#"{"runs": [{"placement": "elastic", "load": 1, "miss_bytes_per_step": 5,
            "summary": {"tokens_per_s": 5, "median_batch": 2}},
            {"placement": "elastic", "load": 2, "miss_bytes_per_step": 7,
            "summary": {"tokens_per_s": 9, "median_batch": 3}}]}"#,
    )
    .unwrap();
    let r = report.to_str().unwrap();
    let dir = temp("names-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let slash = format!("{}/", dir.display());
    for out in [slash.as_str(), dir.to_str().unwrap()] {
        fails_within(
            &["kv", "plot-bench", r, "--out", out],
            "a file name prefix is needed (the charts are PREFIX-<chart>.png)",
            10,
        );
        fails_within(
            &["kv", "simulate", "--quiet", "--loads", "1,2", "--plot", out],
            "a file name prefix is needed",
            10,
        );
    }
    let missing = format!("{}/", temp("no-such-dir").display());
    fails_within(
        &["kv", "plot-bench", r, "--out", &missing],
        "a file name prefix is needed",
        10,
    );
    let png = dir.join("bench.png");
    ok_stdout(&["kv", "plot-bench", r, "--out", png.to_str().unwrap()]);
    for chart in ["tokens", "batch", "misses"] {
        assert!(dir.join(format!("bench-{chart}.png")).is_file(), "{chart}");
    }
    assert!(!dir.join("bench.png-tokens.png").exists());
    assert!(!dir.join("-tokens.png").exists());
}

#[test]
fn a_missing_file_prints_its_cause_once() {
    // Used to print "error: /nonexistent: No such file ..." and "caused by: No such file ...".
    for args in [
        vec!["experts", "replay", "--trace", "/nonexistent/t.tkt"],
        vec![
            "experts",
            "fit-seed",
            "--eplb-counts",
            "/nonexistent/c.json",
        ],
        vec!["experts", "replay", "--config", "/nonexistent/c.json"],
    ] {
        let out = tierkit(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(
            err.matches("No such file or directory").count(),
            1,
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn report_files_are_bounded_together() {
    // Several reports read by one command hold at most 64 MiB together: two reports of 33 MiB
    // (a few bytes of JSON padded with spaces) are each under the cap, not together.
    let pad = " ".repeat(33 << 20);
    let a = temp("33mib-a.json");
    let b = temp("33mib-b.json");
    std::fs::write(&a, format!(r#"{{"runs": []}}{pad}"#)).unwrap();
    std::fs::write(&b, format!(r#"{{"runs":[]}}{pad}"#)).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    fails_within(
        &["kv", "fit-time", a, b],
        &format!("report {b}: the reports given hold more than 64 MiB together"),
        30,
    );
    fails_within(
        &[
            "kv",
            "simulate",
            "--quiet",
            "--time-from",
            a,
            "--time-from",
            b,
        ],
        &format!("--time-from {b}: the reports given hold more than 64 MiB together"),
        30,
    );
    // One alone is read (and has nothing to fit).
    fails_within(&["kv", "fit-time", a], "no placement could be fitted", 30);
    for p in [a, b] {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn degenerate_flags_are_refused_before_the_work() {
    // `--plot` with one load used to run everything, then print "plot skipped" on stdout, exit 0.
    let prefix = temp("one-load");
    fails_within(
        &[
            "kv",
            "simulate",
            "--quiet",
            "--loads",
            "1",
            "--plot",
            prefix.to_str().unwrap(),
        ],
        "need two loads or more",
        10,
    );
    // Each of calibrate's flags is bounded, their product was not (10^11 picks, days).
    fails_within(
        &[
            "kv",
            "calibrate",
            "--steps",
            "100000",
            "--top-k",
            "1048576",
            "--history",
            "16777216",
        ],
        "--steps 100000 × --top-k 1048576 = 104857600000 picks: at most 268435456",
        10,
    );
    // A write error of `experts synth --out` names the flag, as its other errors do.
    if Path::new("/dev/full").exists() {
        for fmt in ["binary", "json", "logger-jsonl"] {
            fails_within(
                &[
                    "experts",
                    "synth",
                    "--out",
                    "/dev/full",
                    "--format",
                    fmt,
                    "--steps",
                    "60",
                    "--tokens",
                    "2",
                ],
                "--out /dev/full: No space left on device",
                10,
            );
        }
    } else {
        println!("SKIP synth --out /dev/full: no /dev/full");
    }
    // A bad `--range` used to fail after the whole trace was read (its "read:" report first).
    let trace = temp("range-trace.jsonl");
    std::fs::write(
        &trace,
        "{\"problem_id\": 0, \"token_idx\": 0, \"layer\": 0, \"experts\": [1, 2]}\n\
         {\"problem_id\": 0, \"token_idx\": 1, \"layer\": 0, \"experts\": [3, 2]}\n",
    )
    .unwrap();
    let t = trace.to_str().unwrap();
    for (range, want) in [
        ("abc", "range \"abc\" is not START..END"),
        ("5..2", "empty range \"5..2\""),
    ] {
        fails_within(
            &[
                "experts", "fit-seed", "--trace", t, "--hot", "2", "--range", range,
            ],
            want,
            10,
        );
    }
}

#[test]
fn fit_seed_flags_that_counts_cannot_honour_are_refused() {
    // `--range` beside counts (no steps to select) was ignored, exit 0; `--routing-counts` with
    // `--layers 0` asked to "give --layers and --experts", which were given.
    let eplb = temp("range-eplb.json");
    std::fs::write(&eplb, "[[1, 2, 3], [4, 5, 6]]").unwrap();
    fails_with(
        &[
            "experts",
            "fit-seed",
            "--eplb-counts",
            eplb.to_str().unwrap(),
            "--range",
            "0..2",
        ],
        "--range selects steps of a trace (--trace); counts",
    );
    // Without --range the same counts fit.
    ok_stdout(&[
        "experts",
        "fit-seed",
        "--eplb-counts",
        eplb.to_str().unwrap(),
    ]);
    let rc = temp("zero-layers-routing.json");
    std::fs::write(
        &rc,
        r#"{"x": {"github": {"layers": [0], "topk_counts": [[1, 2, 3]]}}}"#,
    )
    .unwrap();
    for (l, e) in [("0", "3"), ("2", "0")] {
        fails_with(
            &[
                "experts",
                "fit-seed",
                "--routing-counts",
                rc.to_str().unwrap(),
                "--model",
                "x",
                "--layers",
                l,
                "--experts",
                e,
            ],
            "--layers and --experts must be at least 1",
        );
    }
    // And --experts 0 with engine counts: a shape error, not a panic (it indexed an empty table).
    fails_with(
        &[
            "experts",
            "fit-seed",
            "--eplb-counts",
            eplb.to_str().unwrap(),
            "--experts",
            "0",
        ],
        "0 logical experts per layer asked for (--experts); give at least 1",
    );
}
