//! Traces in and out: `synth` files, `inspect`, `fit-seed` (trace, routing counts, engine
//! counts), per-layer vLLM logs, the real Mixtral traces (under ../shared).

use std::path::PathBuf;

use crate::common::{fails_with, ok_stdout, tierkit};
use crate::{replay_json, temp, TINY};

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
