//! Runs the `tierkit` binary on tiny scenarios and checks its JSON, determinism, files and errors.

mod common;

use std::path::PathBuf;

use common::{fails_with, ok_stdout, tierkit};

fn temp(name: &str) -> PathBuf {
    common::temp("cli-tests", name)
}

const TINY: &[&str] = &["--steps", "240", "--tokens", "4", "--seed", "5"];

fn replay_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["experts", "replay", "--json"];
    args.extend_from_slice(TINY);
    args.extend_from_slice(extra);
    serde_json::from_str(&ok_stdout(&args)).unwrap()
}

/// `--config` reads the controller JSON of both shapes: the flat shape written before the
/// per-policy configs (the policy a name, its knobs at the top level) and the policy object
/// (`{"kind": "ratio", ...}`); both give the same replay. A file mixing them fails, naming the
/// new shape.
#[test]
fn config_files_of_both_shapes_are_read() {
    let flat = temp("flat.json");
    std::fs::write(
        &flat,
        r#"{"policy": "ratio", "ratio": 1.25, "adaptive": null, "drain_every": 8}"#,
    )
    .unwrap();
    let new = temp("new.json");
    std::fs::write(
        &new,
        r#"{"policy": {"kind": "ratio", "ratio": 1.25}, "adaptive": null, "drain_every": 8}"#,
    )
    .unwrap();
    let a = replay_json(&["--policy", "adaptive", "--config", flat.to_str().unwrap()]);
    let b = replay_json(&["--policy", "adaptive", "--config", new.to_str().unwrap()]);
    assert_eq!(
        a["controller"]["policy"],
        serde_json::json!({"kind": "ratio", "ratio": 1.25})
    );
    assert_eq!(a["controller"]["drain_every"], 8);
    assert_eq!(
        (&a["controller"], &a["runs"]),
        (&b["controller"], &b["runs"])
    );
    let mixed = temp("mixed.json");
    std::fs::write(&mixed, r#"{"policy": {"kind": "ratio"}, "ratio": 1.25}"#).unwrap();
    fails_with(
        &["experts", "replay", "--config", mixed.to_str().unwrap()],
        r#"{"policy": {"kind": "ratio", "ratio": 1.5}}"#,
    );
}

#[test]
fn replay_default_scenario_json_has_every_policy_and_is_deterministic() {
    let mut args = vec!["experts", "replay", "--json", "--drain-every", "8"];
    args.extend_from_slice(TINY);
    let a = ok_stdout(&args);
    let b = ok_stdout(&args);
    assert_eq!(a, b, "same seed must give byte-identical JSON");
    let v: serde_json::Value = serde_json::from_str(&a).unwrap();
    assert_eq!(v["trace"]["steps"], 240);
    assert_eq!(v["trace"]["shifts"], serde_json::json!([80]));
    assert_eq!(v["geometry"]["hot_per_layer"], 16);
    assert_eq!(v["controller"]["drain_every"], 8);
    let labels: Vec<&str> = v["summary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        [
            "static",
            "seed",
            "cost-aware (default)",
            "ratio (published defaults)",
            "ratio (best tuning)",
            "recency (capped 4)",
            "lru (uncapped)",
            "static by picks",
            "static by picks after shift",
            "best static",
            "best static after shift",
            "offline optimum"
        ]
    );
    for r in v["summary"].as_array().unwrap() {
        let c = r["steady_state_cold_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&c), "{r}");
        assert_eq!(r["t90_steps"].as_array().unwrap().len(), 1);
    }
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 12);
    // The offline optimum is no policy's: no row's stall is below it, and every row's ratio to it
    // is shown.
    let stall = |i: usize| v["summary"][i]["stall_ms_per_step"].as_f64().unwrap();
    assert_eq!(runs[11]["report"]["policy"], "offline-optimum");
    assert!((0..11).all(|i| stall(i) >= stall(11)), "{}", v["summary"]);
    let vs_opt = |i: usize| v["summary"][i]["stall_vs_optimum"].as_f64().unwrap();
    assert!(vs_opt(11) == 1.0 && (0..11).all(|i| vs_opt(i) >= 1.0));
    // The best static map (by steps touched) stalls no more than the map ranked by picks.
    assert!(
        stall(9) <= stall(7) && stall(10) <= stall(8),
        "{}",
        v["summary"]
    );
    assert_eq!(runs[0]["report"]["lookups"], 240 * 4 * 8 * 16);
    // The cost-aware row ignores --drain-every (no flags apply to it): its own config.
    assert_eq!(runs[2]["report"]["config"]["policy"]["kind"], "cost");
    assert_eq!(runs[3]["report"]["config"]["drain_every"], 64);
    // The maps in hindsight after the shift are the best fixed maps for the new domain: by
    // picks for the cold share, by steps touched for the stall.
    let s = |i: usize| v["summary"][i]["steady_state_cold_share"].as_f64().unwrap();
    assert!(s(8) <= s(0) && s(8) <= s(1));
    let st = |i: usize| v["summary"][i]["stall_vs_best_static"].as_f64().unwrap();
    assert!(st(10) == 1.0 && st(0) >= 1.0 && st(1) >= 1.0);
    let other_seed = {
        let mut args = vec!["experts", "replay", "--json", "--drain-every", "8"];
        args.extend_from_slice(&["--steps", "240", "--tokens", "4", "--seed", "6"]);
        ok_stdout(&args)
    };
    assert_ne!(a, other_seed);
}

#[test]
fn synth_file_replays_like_the_built_in_generator_and_fit_seed_writes_a_map() {
    let tkt = temp("tiny.tkt");
    let mut args = vec!["experts", "synth", "--json", "--out", tkt.to_str().unwrap()];
    args.extend_from_slice(TINY);
    let s: serde_json::Value = serde_json::from_str(&ok_stdout(&args)).unwrap();
    assert_eq!(s["steps"], 240);
    assert!(s["mean_reuse"].as_f64().unwrap() > 0.25);
    let from_file = replay_json(&[
        "--trace",
        tkt.to_str().unwrap(),
        "--policy",
        "adaptive,best-static",
    ]);
    let built_in = replay_json(&["--policy", "adaptive,best-static"]);
    assert_eq!(from_file["summary"], built_in["summary"]);
    assert_eq!(from_file["summary"].as_array().unwrap().len(), 3);

    // Logger JSONL and JSON outputs read back to the same replay.
    for ext in ["jsonl", "json"] {
        let p = temp(&format!("tiny.{ext}"));
        let mut args = vec!["experts", "synth", "--json", "--out", p.to_str().unwrap()];
        args.extend_from_slice(TINY);
        ok_stdout(&args);
        let r = replay_json(&[
            "--trace",
            p.to_str().unwrap(),
            "--policy",
            "adaptive,best-static",
        ]);
        // A single logger/JSON file carries its shifts only in JSON; compare the adaptive row.
        assert_eq!(
            r["summary"][0]["cold_share"], built_in["summary"][0]["cold_share"],
            "{ext}"
        );
    }

    let map = temp("seed.json");
    let out = ok_stdout(&[
        "experts",
        "fit-seed",
        "--trace",
        tkt.to_str().unwrap(),
        "--range",
        "0..80",
        "--hot",
        "16",
        "--out",
        map.to_str().unwrap(),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["coverage"]["overall"].as_f64().unwrap() > 0.25);
    let seeded = replay_json(&["--policy", "seed", "--seed-map", map.to_str().unwrap()]);
    let default_seed = replay_json(&["--policy", "seed"]);
    assert_eq!(
        seeded["summary"][0]["cold_share"],
        default_seed["summary"][0]["cold_share"]
    );
}

#[test]
fn table_output_and_plot() {
    let png = temp("plot.png");
    let mut args = vec!["experts", "replay", "--plot", png.to_str().unwrap()];
    args.extend_from_slice(TINY);
    let out = ok_stdout(&args);
    assert!(out.contains("| policy"), "{out}");
    assert!(
        out.contains("cost-aware (default)") && out.contains("ratio (best tuning), in hindsight")
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    // The stall chart lands beside the cold-share chart.
    let stall = std::fs::read(png.with_file_name("plot-stall.png")).unwrap();
    assert_eq!(&stall[1..4], b"PNG");
    assert!(out.contains("plot-stall.png"), "{out}");
}

#[test]
fn replay_bytes_link_and_boot_flags() {
    let v = replay_json(&[
        "--policy",
        "static,adaptive,lru,best-static",
        "--drain-every",
        "8",
    ]);
    assert_eq!(v["link"]["name"], "h200-pcie");
    assert_eq!(v["boot"], "first-k");
    let rows = v["summary"].as_array().unwrap();
    for r in rows {
        assert_eq!(r["link"], "h200-pcie");
        let (h, s, t) = (
            r["host_read_gb"].as_f64().unwrap(),
            r["swap_gb"].as_f64().unwrap(),
            r["total_gb"].as_f64().unwrap(),
        );
        assert!(h > 0.0 && (h + s - t).abs() < 1e-9, "{r}");
        assert!(r["stall_ms_per_step"].as_f64().unwrap() > 0.0);
    }
    // Fixed maps copy nothing; LRU copies; the reference row's ratios are 1.
    assert_eq!(rows[0]["swap_gb"], 0.0);
    assert!(rows[2]["swap_gb"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[4]["label"], "best static after shift");
    assert_eq!(rows[4]["bytes_vs_best_static"], 1.0);
    assert_eq!(rows[4]["stall_vs_best_static"], 1.0);
    let b = &v["runs"][2]["report"]["bytes"];
    assert_eq!(b["host_read_bytes_windows"].as_array().unwrap().len(), 4);
    assert_eq!(b["stall_us_windows"].as_array().unwrap().len(), 4);
    assert!(b.get("per_step").is_none());
    assert_eq!(
        b["swap_bytes"].as_u64().unwrap(),
        b["swap_copies"].as_u64().unwrap() * v["geometry"]["expert_bytes"].as_u64().unwrap()
    );

    // GB300 C2C: same bytes, less stall.
    let g = replay_json(&[
        "--policy",
        "static,adaptive,lru,best-static",
        "--drain-every",
        "8",
        "--link",
        "gb300-c2c",
    ]);
    assert_eq!(g["link"]["copy_mode"], "stops-step");
    for (a, b) in rows.iter().zip(g["summary"].as_array().unwrap()) {
        assert_eq!(a["total_gb"], b["total_gb"]);
        assert!(b["stall_ms_per_step"].as_f64() < a["stall_ms_per_step"].as_f64());
    }
    // Per-step bytes on request (a short run: the test helper reads stdout at exit).
    let p: serde_json::Value = serde_json::from_str(&ok_stdout(&[
        "experts",
        "replay",
        "--json",
        "--steps",
        "24",
        "--tokens",
        "4",
        "--policy",
        "lru",
        "--bytes-per-step",
    ]))
    .unwrap();
    let steps = p["runs"][0]["report"]["bytes"]["per_step"]
        .as_array()
        .unwrap();
    assert_eq!(steps.len(), 24);
    assert!(steps[0]["cold_unique_pairs"].as_u64().unwrap() > 0);
    // Hiding copy time behind the step lowers LRU's stall only.
    let hid = replay_json(&["--policy", "static,lru", "--hide-us", "100000"]);
    let plain = replay_json(&["--policy", "static,lru"]);
    let stall = |v: &serde_json::Value, i: usize| v["summary"][i]["stall_ms_per_step"].as_f64();
    assert_eq!(stall(&hid, 0), stall(&plain, 0));
    assert!(stall(&hid, 1) < stall(&plain, 1));

    // --boot seed: adaptive and LRU start from the seed map, and the rows say so.
    let s = replay_json(&["--policy", "seed,adaptive,lru", "--boot", "seed"]);
    for r in s["summary"].as_array().unwrap() {
        assert_eq!(r["boot"], "seed", "{r}");
    }
    assert_eq!(s["boot"], "seed");
    let out = ok_stdout(&[
        "experts",
        "replay",
        "--steps",
        "240",
        "--tokens",
        "4",
        "--seed",
        "5",
        "--boot",
        "seed",
        "--link",
        "gb300-c2c",
        "--wide",
    ]);
    assert!(
        out.contains("boot from the seed map") && out.contains("link gb300-c2c"),
        "{out}"
    );
    assert!(
        out.contains("stall ms/step") && out.contains("copies stop the step"),
        "{out}"
    );
    // Without --wide the table has eight columns within 120 characters, and the header states
    // the default's adapted cadence, not the fixed drain interval it does not use.
    let out = ok_stdout(&["experts", "replay", "--steps", "240", "--tokens", "4"]);
    let table: Vec<&str> = out.lines().filter(|l| l.starts_with('|')).collect();
    assert!(table.len() > 3, "{out}");
    for l in &table {
        assert!(l.chars().count() <= 120, "{} wide: {l}", l.chars().count());
    }
    assert!(table[0].contains("stall vs best") && !table[0].contains("host GB read"));
    assert!(out.contains("cadence adapted to the traffic"), "{out}");
    assert!(!out.contains("drain every 64 steps"), "{out}");

    for (flag, v, want) in [
        ("--link", "nvlink", "invalid value 'nvlink'"),
        ("--boot", "oracle", "invalid value 'oracle'"),
    ] {
        let out = tierkit(&["experts", "replay", flag, v]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
    }
    fails_with(
        &["experts", "replay", "--hide-us=-1"],
        "hide_us must be finite and ≥ 0",
    );

    // The run-start experiment feeds the controller rows other counts; static rows are unchanged.
    let rs = replay_json(&["--policy", "static,adaptive", "--count-run-starts", "2"]);
    assert_eq!(stall(&rs, 0), stall(&plain, 0));
    let picks = replay_json(&["--policy", "static,adaptive"]);
    assert_eq!(rs["count_run_starts"], 2);
    assert!(picks.get("count_run_starts").is_none());
    assert_ne!(
        rs["summary"][1]["swaps_applied"],
        picks["summary"][1]["swaps_applied"]
    );
    fails_with(
        &["experts", "replay", "--count-run-starts", "0"],
        "--count-run-starts 0: must be in [1, 256]",
    );
}

#[test]
fn inspect_skew_averages_over_layers_with_picks() {
    // Two layers, layer 1 never picked: the busiest quarter (1 of 4) of layer 0 takes every pick.
    let p = temp("one-layer.jsonl");
    let mut lines = vec![
        r#"{"tierkit_trace": 1, "layers": 2, "experts_per_layer": 4, "top_k": 1}"#.to_string(),
    ];
    for step in 0..4 {
        lines.push(format!(
            r#"{{"step": {step}, "layer": 0, "topk_ids": [1]}}"#
        ));
    }
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok_stdout(&[
        "experts",
        "inspect",
        "--json",
        "--trace",
        p.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(v["top_quarter_share_per_segment"], serde_json::json!([1.0]));
}

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
fn real_mixtral_traces_replay_all_policies() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/moe/mixtral-decode");
    if !dir.is_dir() {
        println!("SKIP real Mixtral replay: {} is absent", dir.display());
        return;
    }
    let out = ok_stdout(&[
        "experts",
        "replay",
        "--trace",
        dir.to_str().unwrap(),
        "--hot",
        "4",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["shape"]["experts_per_layer"], 8);
    assert_eq!(v["trace"]["steps"], 585);
    assert_eq!(v["summary"].as_array().unwrap().len(), 12);
    // Bytes: LRU has the lowest cold share but moves the most bytes (every cold read at batch 1
    // is followed by a full copy), 1.5× the first-K map's and more.
    let gb = |i: usize| v["summary"][i]["total_gb"].as_f64().unwrap();
    let cold = |i: usize| v["summary"][i]["cold_share"].as_f64().unwrap();
    assert_eq!(v["summary"][6]["label"], "lru (uncapped)");
    assert!((0..11).all(|i| i == 6 || cold(6) < cold(i)));
    assert_eq!(v["summary"][9]["label"], "best static");
    assert!(
        gb(6) > 1.5 * gb(0) && gb(6) > 1.8 * gb(9),
        "{} {} {}",
        gb(6),
        gb(0),
        gb(9)
    );
    // The best static map (by steps touched) reads no more than the map ranked by picks.
    assert!(gb(9) <= gb(7) && gb(10) <= gb(8));
    assert_eq!(v["summary"][6]["swap_gb"], v["summary"][6]["host_read_gb"]);
    // The cost-aware default with no flags: stall within 1.10× the best static map in
    // hindsight, under 0.6× uncapped LRU's, better than its boot map (first-K).
    let stall = |i: usize| v["summary"][i]["stall_ms_per_step"].as_f64().unwrap();
    assert_eq!(v["summary"][2]["label"], "cost-aware (default)");
    assert!(stall(2) <= 1.10 * stall(9), "{} vs {}", stall(2), stall(9));
    assert!(stall(2) <= 0.6 * stall(6), "{} vs {}", stall(2), stall(6));
    assert!(stall(2) < stall(0));
}

#[test]
fn fit_seed_from_real_routing_counts() {
    let counts = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/moe/olmoe/routing-counts.json");
    if !counts.is_file() {
        println!(
            "SKIP fit-seed from routing counts: {} is absent",
            counts.display()
        );
        return;
    }
    let map = temp("olmoe-github-seed.json");
    let out = ok_stdout(&[
        "experts",
        "fit-seed",
        "--routing-counts",
        counts.to_str().unwrap(),
        "--model",
        "olmoe",
        "--domain",
        "github",
        "--hot",
        "16",
        "--out",
        map.to_str().unwrap(),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["geometry"]["layers"], 16);
    // The busiest quarter of github's experts takes well over a quarter of the picks.
    let hot = v["coverage"]["overall"].as_f64().unwrap();
    assert!(hot > 0.5 && hot < 0.8, "{hot}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&map).unwrap()).unwrap();
    assert_eq!(saved["hot"].as_array().unwrap().len(), 16);
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

#[test]
fn short_synth_runs_files_and_messages() {
    // `--steps 1` and `--steps 2` used to fail on the default shift at step 0.
    for steps in ["1", "2"] {
        let p = temp(&format!("short{steps}.tkt"));
        let s = ok_stdout(&[
            "experts",
            "synth",
            "--out",
            p.to_str().unwrap(),
            "--steps",
            steps,
            "--tokens",
            "2",
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["steps"].as_u64().unwrap().to_string(), steps);
    }
    // A bad --out fails naming the path (the file is opened before generating).
    fails_with(
        &[
            "experts",
            "synth",
            "--out",
            "/nonexistent/dir/x.tkt",
            "--steps",
            "10",
        ],
        "/nonexistent/dir/x.tkt: No such file or directory",
    );
    // A seed map that does not parse names its file.
    let seed = temp("seed-bad.json");
    std::fs::write(&seed, "not json").unwrap();
    let mut args = vec!["experts", "replay", "--seed-map", seed.to_str().unwrap()];
    args.extend_from_slice(TINY);
    fails_with(
        &args,
        &format!("--seed-map {}: expected ident at line 1", seed.display()),
    );
    // Plot errors read as text and name the file (checked before the run).
    let mut args = vec!["experts", "replay", "--plot", "/nonexistent/dir/x.png"];
    args.extend_from_slice(TINY);
    fails_with(
        &args,
        "--plot /nonexistent/dir/x.png: directory /nonexistent/dir does not exist",
    );
    let out = tierkit(&args);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("Os {"));
}

/// A vLLM routing-logger file of `layer` (16 experts, top-2): meta line, a 4,096-row dummy pass
/// of identical rows, a 10-row prefill and 3 decode passes of 2 rows. Real rows pick only
/// experts 0..4, the busiest quarter.
fn vllm_layer_log(layer: u32) -> String {
    let route = |row: u32, a: u32, b: u32| {
        format!("{{\"type\":\"route\",\"req_id\":\"r0\",\"token_idx\":{row},\"layer\":{layer},\"topk_ids\":[{a},{b}],\"topk_weights\":[0.5,0.5]}}\n")
    };
    let mut s = "{\"type\":\"meta\",\"num_experts\":16,\"top_k\":2}\n".to_string();
    for row in 0..4096 {
        s += &route(row, 14, 15);
    }
    for row in 0..10 {
        s += &route(row, row % 4, (row + 1) % 4);
    }
    s += "{\"type\":\"timing\",\"ms\":3}\n";
    for pass in 0..3 {
        for row in 0..2 {
            s += &route(row, (pass + row) % 4, (pass + row + 2) % 4);
        }
    }
    s
}

/// Runs `fit-seed ARGS --out TEMP/map --json`: the printed summary and the written map.
fn fit_seed_json(args: &[&str], map: &str) -> (serde_json::Value, serde_json::Value) {
    let map = temp(map);
    let mut all = vec!["experts", "fit-seed"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--out", map.to_str().unwrap(), "--json"]);
    let summary = serde_json::from_str(&ok_stdout(&all)).unwrap();
    let saved = serde_json::from_str(&std::fs::read_to_string(&map).unwrap()).unwrap();
    (summary, saved)
}

#[test]
fn per_layer_vllm_logs_inspect_as_one_trace_and_eplb_counts_fit_a_seed() {
    let dir = temp("vllm-logs");
    std::fs::create_dir_all(&dir).unwrap();
    for l in [0, 1, 3] {
        std::fs::write(dir.join(format!("moe_layer{l}.jsonl")), vllm_layer_log(l)).unwrap();
    }
    let d = dir.to_str().unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&ok_stdout(&["experts", "inspect", "--json", "--trace", d])).unwrap();
    assert_eq!(v["shape"]["layers"], 4);
    assert_eq!(
        v["steps"], 4,
        "prefill + 3 decode passes; the dummy pass dropped"
    );
    assert_eq!(v["shifts"], serde_json::json!([]));
    // Layer 2 was not logged: the skew averages over the three logged layers only.
    assert_eq!(v["top_quarter_share_per_segment"], serde_json::json!([1.0]));
    let keep: serde_json::Value = serde_json::from_str(&ok_stdout(&[
        "experts",
        "inspect",
        "--json",
        "--trace",
        d,
        "--keep-dummy-passes",
    ]))
    .unwrap();
    assert_eq!(keep["steps"], 5);
    // A seed map fitted on the logs serves all of the real picks, not the dummy experts.
    let (s, _) = fit_seed_json(&["--trace", d, "--hot", "4"], "vllm-seed.json");
    assert_eq!(s["geometry"]["layers"], 4);
    assert_eq!(s["coverage"]["overall"], 1.0);

    // vLLM EPLB window: 2 passes × 2 layers × 5 physical experts (4 logical + 1 redundant copy).
    let counts = temp("eplb.json");
    std::fs::write(
        &counts,
        r#"{"expert_load_window": [[[9, 1, 0, 0, 1], [0, 0, 7, 1, 0]], [[8, 0, 1, 0, 2], [0, 1, 6, 0, 0]]]}"#,
    )
    .unwrap();
    let c = counts.to_str().unwrap();
    let (s, map) = fit_seed_json(
        &["--eplb-counts", c, "--experts", "4", "--hot", "1"],
        "eplb-seed.json",
    );
    assert_eq!(s["geometry"]["experts_per_layer"], 4);
    assert_eq!(map["hot"], serde_json::json!([[0], [2]]));
    // A torch pickle says how to convert it.
    let pt = temp("dump.pt");
    std::fs::write(&pt, b"PK\x03\x04rest").unwrap();
    fails_with(
        &["experts", "fit-seed", "--eplb-counts", pt.to_str().unwrap()],
        "torch.load",
    );
    // /dev/zero as a trace fails at once with the file named.
    if std::path::Path::new("/dev/zero").exists() {
        for format in ["auto", "routes-jsonl", "binary", "json"] {
            fails_with(
                &[
                    "experts",
                    "inspect",
                    "--trace",
                    "/dev/zero",
                    "--format",
                    format,
                ],
                "/dev/zero",
            );
        }
    }
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

#[test]
fn optimum_flag_and_fit_seed_ranking() {
    let labels = |v: &serde_json::Value| -> Vec<String> {
        v["summary"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["label"].as_str().unwrap().to_string())
            .collect()
    };
    let opt = "offline optimum".to_string();
    // auto: a small trace gets the row; never: no row, and no ratio to it.
    let auto = replay_json(&["--policy", "static,offline-optimum"]);
    assert_eq!(labels(&auto), ["static", "offline optimum"]);
    let never = replay_json(&["--policy", "static,offline-optimum", "--optimum", "never"]);
    assert!(!labels(&never).contains(&opt));
    assert!(never["summary"][0]["stall_vs_optimum"].is_null());
    // A hidden copy time makes the stall nonlinear in copies: auto skips the row and says why;
    // always fails with a message naming hide_us.
    let mut args = vec!["experts", "replay", "--policy", "static,offline-optimum"];
    args.extend_from_slice(TINY);
    args.extend_from_slice(&["--hide-us", "50"]);
    let out = ok_stdout(&args);
    assert!(
        out.contains("offline optimum not computed") && !out.contains("| offline optimum"),
        "{out}"
    );
    args.extend_from_slice(&["--optimum", "always"]);
    fails_with(&args, "hide_us");

    // fit-seed ranks a trace by steps touched unless told otherwise; counts have picks only.
    let tkt = temp("rank.tkt");
    let mut args = vec!["experts", "synth", "--out", tkt.to_str().unwrap()];
    args.extend_from_slice(TINY);
    ok_stdout(&args);
    let fit = |rank: &str| {
        let out = temp(&format!("rank-{rank}.json"));
        let mut a = vec![
            "experts",
            "fit-seed",
            "--trace",
            tkt.to_str().unwrap(),
            "--hot",
            "16",
        ];
        if !rank.is_empty() {
            a.extend_from_slice(&["--rank", rank]);
        }
        a.extend_from_slice(&["--out", out.to_str().unwrap()]);
        ok_stdout(&a);
        let map: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
        map["hot"].clone()
    };
    let (default, touched, picks) = (fit(""), fit("touched"), fit("picks"));
    assert_eq!(default, touched);
    // At 4 tokens per step experts are picked several times in a step: the hot sets differ.
    assert_ne!(touched, picks);
    assert_eq!(touched.as_array().unwrap().len(), 16);
    fails_with(
        &[
            "experts",
            "fit-seed",
            "--dump",
            tkt.to_str().unwrap(),
            "--rank",
            "touched",
        ],
        "--rank touched needs steps",
    );
}
