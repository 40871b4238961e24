//! `experts replay`: the controller config, the JSON report and its determinism, the table and
//! plot, the byte, link, boot and optimum flags.

use crate::common::{fails_with, ok_stdout, tierkit};
use crate::{replay_json, temp, TINY};

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
