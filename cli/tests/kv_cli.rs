//! Runs `tierkit kv ...` on tiny inputs: bad input gives one clear error line and a non-zero exit
//! (never a panic, hang or abort); a tiny valid run writes its JSON and plots.

mod common;

use std::path::PathBuf;

use common::{fails_with, ok_stdout, tierkit};

fn temp(name: &str) -> PathBuf {
    common::temp("kv-cli-tests", name)
}

const QUIET: &str = "--quiet";

#[test]
fn simulate_rejects_bad_numbers_with_typed_errors() {
    let cases: &[(&[&str], &str)] = &[
        // Item 1: used to hang forever.
        (&["--max-batch", "0"], "--max-batch 0: must be >= 1"),
        // Item 2: used to divide by zero.
        (&["--page-rows", "0"], "--page-rows 0: must be >= 1"),
        // Item 3: hot + tail wrapped to 0 (index out of bounds); a 16 GB hot cache.
        (
            &[
                "--top-k",
                "32",
                "--hot-rows",
                "64",
                "--tail-rows",
                "4294967232",
            ],
            "--tail-rows 4294967232: --hot-rows + --tail-rows must fit in u32",
        ),
        (
            &["--hot-rows", "4294967295", "--tail-rows", "1"],
            "--hot-rows 4294967295: must be in [--top-k, 16777216] rows",
        ),
        // `--top-k` huge: used to abort building the selection vector.
        (
            &["--top-k", "2147483680"],
            "--top-k 2147483680: must be in [1, 1048576] picks",
        ),
        (
            &["--top-k", "0"],
            "--top-k 0: must be in [1, 1048576] picks",
        ),
        (
            &["--top-k", "64", "--hot-rows", "8"],
            "--top-k 64 is above --hot-rows 8",
        ),
        // Item 13: NaN, negative and zero floats.
        (&["--loads", "NaN,-1,0"], "--loads NaN"),
        (&["--loads=1,-1"], "--loads -1"),
        (&["--loads", "0"], "--loads 0"),
        (&["--budget-gib", "NaN"], "--budget-gib NaN"),
        (&["--budget-gib=-2"], "--budget-gib -2"),
        (&["--step-base-us", "NaN"], "--step-base-us NaN"),
        (&["--step-base-us", "0"], "--step-base-us 0"),
        (
            &["--step-per-request-us", "inf"],
            "--step-per-request-us inf",
        ),
        (
            &["--kv-bytes-per-token", "0"],
            "--kv-bytes-per-token 0: must be >= 1",
        ),
        (&["--chunk-pages", "0"], "--chunk-pages 0: must be >= 1"),
        (&["--requests", "0"], "--requests must be >= 1"),
        // A 2^31-row hot cache in a valid arena (28 GB of CLOCK state per request).
        (
            &[
                "--hot-rows",
                "2000000000",
                "--budget-gib",
                "1.9",
                "--kv-bytes-per-token",
                "1",
            ],
            "--hot-rows 2000000000: must be in [--top-k, 16777216] rows",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["kv", "simulate", QUIET];
        args.extend_from_slice(extra);
        fails_with(&args, want);
    }
}

/// Runs `kv simulate extra`, expects `want` and that it failed within `secs` (before allocating).
fn fails_fast(extra: &[&str], want: &str, secs: u64) {
    let mut args = vec!["kv", "simulate", QUIET];
    args.extend_from_slice(extra);
    common::fails_within(&args, want, secs);
}

#[test]
fn simulate_refuses_geometries_that_would_allocate_gigabytes() {
    // Used to allocate until "cannot allocate 7929170392 bytes" after a minute (no flag named).
    let pages = "raise --page-rows or --kv-bytes-per-token, or lower --budget-gib";
    for (k, pr) in [("13", "1"), ("24", "1"), ("100", "1"), ("13", "2")] {
        fails_fast(
            &["--kv-bytes-per-token", k, "--page-rows", pr],
            "above --max-memory-gib 4: ",
            10,
        );
        fails_fast(&["--kv-bytes-per-token", k, "--page-rows", pr], pages, 10);
    }
    // 127 sessions of a 16-million-row hot cache in a 1.9 GiB arena of 1-byte tokens.
    fails_fast(
        &[
            "--kv-bytes-per-token",
            "1",
            "--budget-gib",
            "1.9",
            "--hot-rows",
            "16000000",
        ],
        "127 sessions at once (as many as --budget-gib 1.9 holds) of --hot-rows 16000000 rows",
        10,
    );
    // One more row than int32 indices reach: named by its flags with the largest budget.
    fails_fast(
        &["--kv-bytes-per-token", "12", "--page-rows", "1"],
        "--budget-gib 24 holds 2147483648 token rows of --kv-bytes-per-token 12 B; the simulated arena takes at most 2^31 - 1 rows: --budget-gib at most 23.999",
        10,
    );
    fails_fast(
        &["--budget-gib", "1e-9"],
        "--budget-gib 1e-9 holds 0 pages (0 token rows of --kv-bytes-per-token 40016 B), fewer than one session's --hot-rows 4096 + --tail-rows 64 (65 pages of --page-rows 64): --budget-gib at least 0.156",
        10,
    );
    // No budget holds a page of more than 2^31 - 1 rows; no budget up to 1e9 GiB holds 2^64-byte tokens.
    fails_fast(
        &["--page-rows", "4294967295"],
        "(1 pages of --page-rows 4294967295) take 4294967295 rows, above the simulated arena's 2^31 - 1: lower --page-rows",
        10,
    );
    fails_fast(
        &["--kv-bytes-per-token", "18446744073709551615"],
        "--kv-bytes-per-token at most 6194664",
        10,
    );
    // The session limit named is the binding one: the batch cap, or the whole trace.
    fails_fast(
        &[
            "--top-k",
            "1048576",
            "--kv-bytes-per-token",
            "1",
            "--budget-gib",
            "1.9",
        ],
        "256 sessions at once (--max-batch 256) of --hot-rows 2097152 rows",
        10,
    );
    // The bound is a flag: a lower one refuses the default scenario, a higher one lets it run.
    fails_fast(
        &["--max-memory-gib", "0.001"],
        "above --max-memory-gib 0.001",
        10,
    );
    fails_fast(
        &["--max-memory-gib", "0"],
        "--max-memory-gib 0: must be in (0, ∞) GiB",
        10,
    );
    let out = ok_stdout(&[
        "kv",
        "simulate",
        QUIET,
        "--requests",
        "20",
        "--steps",
        "5",
        "--kv-bytes-per-token",
        "100",
        "--page-rows",
        "1",
        "--budget-gib",
        "0.01",
        "--hot-rows",
        "4096",
        "--max-memory-gib",
        "8",
    ]);
    assert!(out.contains("pages of 1 rows"), "{out}");
}

#[test]
fn simulate_names_the_flag_and_range_of_values_that_would_overflow() {
    // Used to read "a duration of inf µs" / "arena rows must fit in int32 row indices".
    let us = "must be in [0, 1e9] µs";
    for (extra, want) in [
        (
            ["--step-base-us", "1e308"],
            "--step-base-us 1e308: must be in (0, 1e9] µs".to_string(),
        ),
        (
            ["--step-per-request-us", "1e308"],
            format!("--step-per-request-us 1e308: {us}"),
        ),
        (
            ["--step-per-miss-us", "2e9"],
            format!("--step-per-miss-us 2e9: {us}"),
        ),
        (
            ["--budget-gib", "1e308"],
            "--budget-gib 1e308: must be in (0, 1e9] GiB".to_string(),
        ),
        (
            ["--budget-gib", "1e7"],
            "--budget-gib 1e7 holds 268328124750 token rows of --kv-bytes-per-token 40016 B; the simulated arena takes at most 2^31 - 1 rows: --budget-gib at most 80031.999"
                .to_string(),
        ),
        (
            ["--admission-gbps", "1e-300"],
            "--admission-gbps 1e-300: must be in [0.001, ∞) GB/s (or 0: free)".to_string(),
        ),
    ] {
        fails_fast(&extra, &want, 10);
    }
}

#[test]
fn calibrate_rejects_overflowing_arguments() {
    // Item 8: steps + steps / 3 wrapped and printed a 0.0% miss rate with exit 0.
    fails_with(
        &[
            "kv",
            "calibrate",
            "--steps",
            "3221225472",
            "--top-k",
            "64",
            "--history",
            "1000",
        ],
        "--steps 3221225472",
    );
    for k in ["0", "4294967295", "1073741824"] {
        fails_with(
            &["kv", "calibrate", "--top-k", k],
            &format!("--top-k {k}: must be in [1, 1048576] picks"),
        );
    }
    fails_with(
        &["kv", "calibrate", "--history", "4294967295"],
        "history 4294967295",
    );
    fails_with(&["kv", "calibrate", "--history", "0"], "history 0");
    // Fewer than 3 steps: no warm-up step, the cold first step (all misses) would be measured.
    for steps in ["0", "1", "2"] {
        fails_with(
            &["kv", "calibrate", "--steps", steps],
            &format!("--steps {steps}: must be >= 3 (the warm-up is a third of --steps"),
        );
    }
    let out = ok_stdout(&[
        "kv",
        "calibrate",
        "--steps",
        "3",
        "--top-k",
        "64",
        "--history",
        "1000",
    ]);
    assert!(out.contains("miss rate (measured)"), "{out}");
}

#[test]
fn trace_and_output_errors_name_the_file() {
    let empty = temp("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let e = empty.to_str().unwrap();
    fails_with(
        &["kv", "simulate", QUIET, "--trace", e],
        &format!("{e}: no request"),
    );
    let dir = temp("a-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    fails_with(
        &["kv", "simulate", QUIET, "--trace", d],
        &format!("{d}: is a directory"),
    );
    let bad = temp("bad.jsonl");
    std::fs::write(&bad, "{\"timestamp\": 1}\n").unwrap();
    let b = bad.to_str().unwrap();
    fails_with(
        &["kv", "simulate", QUIET, "--trace", b],
        &format!("{b}: line 1"),
    );
    // An endless input: used to abort after allocating 8 GB on one unbounded line.
    #[cfg(unix)]
    fails_with(
        &["kv", "simulate", QUIET, "--trace", "/dev/zero"],
        "/dev/zero: line 1: longer than 1048576 bytes",
    );
    let missing = temp("missing.jsonl");
    let m = missing.to_str().unwrap();
    fails_with(&["kv", "simulate", QUIET, "--trace", m], m);
    // Outputs are checked before the simulation runs, without Rust debug text.
    for flag in ["--json", "--plot"] {
        let out = temp("no-such-dir/out");
        let o = out.to_str().unwrap();
        fails_with(
            &["kv", "simulate", QUIET, "--loads", "1,2", flag, o],
            &format!("{flag} {o}: directory"),
        );
        fails_with(
            &["kv", "simulate", QUIET, flag, d],
            &format!("{flag} {d}: is a directory"),
        );
    }
}

#[test]
fn tiny_valid_run_writes_json_and_plots() {
    let trace = temp("tiny.jsonl");
    let lines: String = (0..6)
        .map(|i| {
            format!(
                "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": 5}}\n",
                i * 20,
                40 + 30 * i
            )
        })
        .collect();
    std::fs::write(&trace, lines).unwrap();
    let json = temp("tiny.json");
    let plot = temp("tiny");
    let args = [
        "kv",
        "simulate",
        QUIET,
        "--trace",
        trace.to_str().unwrap(),
        "--budget-gib",
        "0.0001",
        "--kv-bytes-per-token",
        "100",
        "--top-k",
        "8",
        "--hot-rows",
        "16",
        "--tail-rows",
        "4",
        "--page-rows",
        "4",
        "--steps",
        "40",
        "--loads",
        "1,2",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ];
    let out = tierkit(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let reports = reports.as_array().unwrap();
    assert_eq!(reports.len(), 2);
    for rep in reports {
        let placements = rep["placements"].as_array().unwrap();
        assert_eq!(placements.len(), 5);
        assert_eq!(placements[3]["placement"], "VllmHybrid");
        assert_eq!(placements[4]["placement"], "SglangDemote");
        assert_eq!(placements[0]["completed"], 6, "{rep}");
        assert_eq!(placements[0]["misses_per_step"], 0.0);
    }
    for suffix in ["-sessions.png", "-misses.png"] {
        let mut p = plot.as_os_str().to_owned();
        p.push(suffix);
        let bytes = std::fs::read(PathBuf::from(p)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }
    let cal = tierkit(&[
        "kv",
        "calibrate",
        "--top-k",
        "16",
        "--history",
        "2000",
        "--steps",
        "9",
    ]);
    assert!(
        cal.status.success(),
        "{}",
        String::from_utf8_lossy(&cal.stderr)
    );
    assert!(String::from_utf8_lossy(&cal.stdout).contains("| 64 "));
}

#[test]
fn fit_time_recovers_the_step_model_of_a_benchmark_report_and_refuses_bad_files() {
    // A kv_serving_bench-shaped report whose steps follow 11,000 + 50 × batch + 0.9 × misses µs.
    let steps = |misses_per_req: u64| {
        (1..30u64)
            .map(|b| {
                let m = b * misses_per_req + (b % 7) * 300;
                format!(
                    r#"{{"batch": {b}, "misses": {m}, "step_us": {}}}"#,
                    11_000.0 + 50.0 * b as f64 + 0.9 * m as f64
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let report = format!(
        r#"{{"runs": [{{"placement": "fully resident", "steps": [{}]}}, {{"placement": "elastic", "steps": [{}]}}]}}"#,
        steps(0),
        steps(40)
    );
    let path = temp("fit-time.json");
    std::fs::write(&path, report).unwrap();
    let out = tierkit(&["kv", "fit-time", path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let elastic = text
        .lines()
        .find(|l| l.trim_start().starts_with("elastic:"))
        .unwrap();
    assert!(
        elastic.contains("--step-base-us 11000")
            && elastic.contains("--step-per-request-us 50.0")
            && elastic.contains("--step-per-miss-us 0.900"),
        "{elastic}"
    );
    let bad = temp("fit-time-bad.json");
    std::fs::write(&bad, r#"{"runs": 3}"#).unwrap();
    fails_with(
        &["kv", "fit-time", bad.to_str().unwrap()],
        "no `runs` array",
    );
    fails_with(
        &["kv", "fit-time", "/dev/zero"],
        "report /dev/zero: not a kv_serving_bench JSON report: expected value at line 1 column 1",
    );
}

#[test]
fn simulate_takes_each_placements_time_model_from_a_benchmark_report() {
    // Steps of each placement on its own line; the resident runs copied 4.95e9 bytes in 100 ms.
    let steps = |base: f64, per_req: f64, per_miss: f64, misses_per_req: u64| {
        (1..30u64)
            .map(|b| {
                let m = b * misses_per_req + (b % 7) * 300;
                format!(
                    r#"{{"batch": {b}, "misses": {m}, "step_us": {}}}"#,
                    base + per_req * b as f64 + per_miss * m as f64
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let run = |placement: &str, extra: &str, st: String| {
        format!(r#"{{"placement": "{placement}", {extra} "steps": [{st}]}}"#)
    };
    let report = format!(
        r#"{{"runs": [{}, {}, {}]}}"#,
        run(
            "fully resident",
            r#""admission_bytes": 4950000000, "admission_copy_ms": 100.0,"#,
            steps(10_000.0, 70.0, 0.0, 0)
        ),
        run("fixed hot cache", "", steps(11_600.0, 38.0, 1.1, 40)),
        run("elastic", "", steps(11_100.0, 59.0, 1.0, 30)),
    );
    let path = temp("time-from.json");
    std::fs::write(&path, report).unwrap();
    let fit = tierkit(&["kv", "fit-time", path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&fit.stdout);
    assert!(
        fit.status.success() && text.contains("--admission-gbps 49.5"),
        "{text}"
    );
    let json = temp("time-from-sim.json");
    let out = tierkit(&[
        "kv",
        "simulate",
        "--steps",
        "60",
        "--time-from",
        path.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        QUIET,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("elastic decode tokens/s"), "{text}");
    assert!(
        text.contains("TTFT p50 / p90 (ms, common)") && text.contains("sglang-demote"),
        "{text}"
    );
    assert!(
        text.contains("step time of vllm-hybrid (fitted to") && text.contains("elastic's fit"),
        "{text}"
    );
    let rep: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cfg = &rep[0]["config"];
    let base = |p: &str| cfg["placement_time"][p]["step_base_us"].as_f64().unwrap();
    assert!((base("resident") - 10_000.0).abs() < 1.0, "{cfg}");
    assert!((base("fixed") - 11_600.0).abs() < 1.0, "{cfg}");
    assert!((base("elastic") - 11_100.0).abs() < 1.0, "{cfg}");
    // No runs of their own: the engines' designs take elastic's model (same pool and resolver).
    assert!(cfg["placement_time"]["vllm"].is_null(), "{cfg}");
    assert!(cfg["placement_time"]["sglang"].is_null(), "{cfg}");
    assert!(
        (cfg["admission_gbps"].as_f64().unwrap() - 49.5).abs() < 1e-9,
        "{cfg}"
    );
    // With runs of their own they take their own fit; --placements runs a subset, in order.
    let own = temp("time-from-own.json");
    std::fs::write(
        &own,
        format!(
            r#"{{"runs": [{}, {}, {}, {}]}}"#,
            run(
                "fully resident",
                r#""admission_bytes": 4950000000, "admission_copy_ms": 100.0,"#,
                steps(10_000.0, 70.0, 0.0, 0)
            ),
            run("fixed hot cache", "", steps(11_600.0, 38.0, 1.1, 40)),
            run("elastic", "", steps(11_100.0, 59.0, 1.0, 30)),
            run("sglang-demote", "", steps(12_100.0, 50.0, 1.2, 20)),
        ),
    )
    .unwrap();
    let json2 = temp("time-from-own-sim.json");
    let out = tierkit(&[
        "kv",
        "simulate",
        "--steps",
        "30",
        "--placements",
        "sglang-demote,elastic",
        "--time-from",
        own.to_str().unwrap(),
        "--json",
        json2.to_str().unwrap(),
        QUIET,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: serde_json::Value = serde_json::from_slice(&std::fs::read(&json2).unwrap()).unwrap();
    let sg = &rep[0]["config"]["placement_time"]["sglang"]["step_base_us"];
    assert!((sg.as_f64().unwrap() - 12_100.0).abs() < 1.0, "{rep}");
    let ran: Vec<&str> = rep[0]["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["placement"].as_str().unwrap())
        .collect();
    assert_eq!(ran, ["Elastic", "SglangDemote"]);
    for (bad, want) in [
        ("elastic,elastic", "elastic given twice"),
        ("vllm", "unknown placement \"vllm\""),
    ] {
        fails_with(
            &["kv", "simulate", "--placements", bad, "--steps", "5", QUIET],
            want,
        );
    }
    // A report without one placement's runs cannot give its model; a bad rate is refused.
    let partial = temp("time-from-partial.json");
    std::fs::write(
        &partial,
        format!(
            r#"{{"runs": [{}]}}"#,
            run("elastic", "", steps(11_100.0, 59.0, 1.0, 30))
        ),
    )
    .unwrap();
    fails_with(
        &[
            "kv",
            "simulate",
            "--time-from",
            partial.to_str().unwrap(),
            QUIET,
        ],
        "no `fully resident` runs to fit",
    );
    fails_with(
        &["kv", "simulate", "--admission-gbps=-3", QUIET],
        "--admission-gbps -3: must be in [0.001, ∞) GB/s (or 0: free)",
    );
    // The fitted models replace the --step-* flags: giving both is a usage error (exit 2).
    let both = tierkit(&[
        "kv",
        "simulate",
        "--time-from",
        path.to_str().unwrap(),
        "--step-base-us",
        "5",
        QUIET,
    ]);
    let err = String::from_utf8_lossy(&both.stderr);
    assert_eq!(both.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn plot_bench_draws_three_charts_of_a_benchmark_report() {
    let run = |placement: &str, load: f64, tps: f64| {
        format!(
            r#"{{"placement": "{placement}", "load": {load}, "miss_bytes_per_step": {}, "summary": {{"tokens_per_s": {tps}, "median_batch": {}}}, "steps": []}}"#,
            tps * 1e4,
            (load * 3.0) as u32
        )
    };
    let runs: Vec<String> = [0.5, 4.0, 16.0]
        .iter()
        .flat_map(|&l| {
            [
                run("fully resident", l, 100.0 * l),
                run("elastic", l, 120.0 * l),
            ]
        })
        .collect();
    let path = temp("plot-bench.json");
    std::fs::write(&path, format!(r#"{{"runs": [{}]}}"#, runs.join(","))).unwrap();
    let prefix = temp("plot-bench");
    ok_stdout(&[
        "kv",
        "plot-bench",
        path.to_str().unwrap(),
        "--out",
        prefix.to_str().unwrap(),
    ]);
    assert_pngs(&prefix, false);
    let empty = temp("plot-bench-empty.json");
    std::fs::write(&empty, r#"{"runs": [{"placement": "elastic"}]}"#).unwrap();
    fails_with(
        &[
            "kv",
            "plot-bench",
            empty.to_str().unwrap(),
            "--out",
            prefix.to_str().unwrap(),
        ],
        "no run has the fields",
    );
}

#[test]
fn the_shipped_h200_serving_report_gives_the_documented_fits() {
    // docs/kv-serving-h200.json: the kv_serving_bench --short report the docs' fitted
    // simulations use (docs/kv.md, "Each placement's own step model").
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/kv-serving-h200.json");
    let text = ok_stdout(&["kv", "fit-time", path]);
    for want in [
        "--step-base-us 10688 --step-per-request-us 69.3",
        "--step-base-us 11641 --step-per-request-us 38.3 --step-per-miss-us 1.105",
        "--step-base-us 11128 --step-per-request-us 59.3 --step-per-miss-us 1.009",
        "--admission-gbps 49.5",
        // Written before reports recorded their build commit.
        "kv_serving_bench built from commit unknown",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
    // Every shipped report still reads (plot-bench pools them as fit-time does).
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs");
    for entry in std::fs::read_dir(docs).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("kv-serving-h200") && name.ends_with(".json") {
            let text = ok_stdout(&["kv", "fit-time", p.to_str().unwrap()]);
            assert!(text.contains("built from commit unknown"), "{name}: {text}");
        }
    }
}

#[test]
fn several_reports_pool_their_steps_per_placement() {
    // docs/kv-serving-h200-cap112-load64.json: the H200 run at equal 1,000-step horizons with the
    // elastic batch capped at 112 (docs/kv.md). Pooled with the short-mode report, the fits are
    // those the docs quote, and `--time-from a,b` names both reports.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/");
    let (a, b) = (
        format!("{dir}kv-serving-h200.json"),
        format!("{dir}kv-serving-h200-cap112-load64.json"),
    );
    let text = ok_stdout(&["kv", "fit-time", &b]);
    assert!(
        text.contains("elastic:   1000 steps  --step-base-us 13103"),
        "{text}"
    );
    let text = ok_stdout(&["kv", "fit-time", &a, &b]);
    for want in [
        "fully resident:   2569 steps  --step-base-us 11000 --step-per-request-us 65.7",
        "--step-base-us 11563 --step-per-request-us 36.5 --step-per-miss-us 1.129",
        "elastic:   2124 steps  --step-base-us 11539 --step-per-request-us 30.8 --step-per-miss-us 1.107",
        "--admission-gbps 48.9",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
    assert!(
        text.contains(&format!("--time-from {a} --time-from {b}")),
        "{text}"
    );
    // the same report twice would count its steps double: refused
    fails_with(&["kv", "fit-time", &b, &b], "given twice");
    // plot-bench draws the three loads' reports together (docs/kv-gpu-cap112-*.png).
    let loads: Vec<String> = ["0.5", "16", "64"]
        .iter()
        .map(|l| format!("{dir}kv-serving-h200-cap112-load{l}.json"))
        .collect();
    let prefix = std::env::temp_dir().join(format!("tierkit-cap112-{}", std::process::id()));
    let mut args = vec!["kv", "plot-bench"];
    args.extend(loads.iter().map(String::as_str));
    args.extend(["--out", prefix.to_str().unwrap()]);
    ok_stdout(&args);
    assert_pngs(&prefix, true);
    // A missing second report fails, naming it.
    fails_with(
        &["kv", "fit-time", &a, "/nonexistent.json"],
        "/nonexistent.json",
    );
}

#[test]
fn simulate_refuses_caps_and_loads_it_cannot_honour() {
    let short = |extra: &[&str], want: &str| {
        let mut args = vec!["kv", "simulate", "--requests", "20", "--steps", "5"];
        args.extend_from_slice(extra);
        fails_with(&args, want);
    };
    short(
        &["--max-batch", "10", "--elastic-max-batch", "11"],
        "--elastic-max-batch 11 is above --max-batch 10",
    );
    short(&["--loads", "1,2,1"], "--loads: 1 given twice");
    short(&["--loads", "1e-18"], "would come after 1e15 ms");
}

#[test]
fn fit_time_fails_when_nothing_could_be_fitted() {
    // every step's batch has the wrong type: nothing fits; the run says so and fails
    let path = temp("fit-time-nothing.json");
    std::fs::write(
        &path,
        r#"{"runs": [{"placement": "elastic", "steps": [
            {"batch": "2", "misses": 1, "step_us": 10.0},
            {"batch": "3", "misses": 1, "step_us": 12.0}]}]}"#,
    )
    .unwrap();
    let out = tierkit(&["kv", "fit-time", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("2 step records left out"), "{err}");
    assert!(err.contains("no placement could be fitted"), "{err}");
}

/// The three charts of `kv plot-bench --out PREFIX` exist and are PNG files (removed after the
/// check when `remove`).
fn assert_pngs(prefix: &std::path::Path, remove: bool) {
    for suffix in ["-tokens.png", "-batch.png", "-misses.png"] {
        let mut p = prefix.as_os_str().to_owned();
        p.push(suffix);
        let bytes = std::fs::read(&p).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{suffix} is a PNG");
        if remove {
            std::fs::remove_file(&p).unwrap();
        }
    }
}
