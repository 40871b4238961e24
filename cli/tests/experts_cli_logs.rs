//! `tierkit experts replay --trace` and `fit-seed --eplb-counts` on logs as engines write them:
//! a raw layer-major log with lost rows (made from the Mixtral logs of `../shared`, and from a
//! synthetic trace when they are absent), a llama.cpp CSV, a count dump keyed by layer strings.

mod common;

use std::path::{Path, PathBuf};

use common::{ok_stdout, tierkit};
use tierkit_sim::experts::trace::{rawlog, read_trace, synth, ReadOptions, Trace};

fn temp(name: &str) -> PathBuf {
    common::temp("cli-log-tests", name)
}

fn write_raw(t: &Trace, name: &str) -> (PathBuf, rawlog::RawLog) {
    let p = temp(name);
    let f = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
    let log = rawlog::write_raw_log(t, &rawlog::RawLogConfig::default(), f).unwrap();
    (p, log)
}

fn replay(path: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "experts",
        "replay",
        "--trace",
        path.to_str().unwrap(),
        "--policy",
        "cost-aware",
    ];
    args.extend_from_slice(extra);
    ok_stdout(&args)
}

#[test]
fn a_raw_log_with_lost_rows_replays_and_says_how_many() {
    let mut cfg = synth::SynthConfig::default_scenario();
    cfg.steps = 40;
    cfg.tokens_per_step = 1;
    cfg.phases.truncate(1);
    let t = synth::generate(&cfg).unwrap();
    let (p, log) = write_raw(&t, "synth_raw.jsonl");
    let out = replay(&p, &["--experts", &t.shape.experts_per_layer.to_string()]);
    let want = format!("read: {} (token, layer) rows missing", log.rows_dropped);
    assert!(out.contains(&want), "{want}\n{out}");
    assert!(out.contains("41 steps"), "{out}");
    let json: serde_json::Value = serde_json::from_str(&replay(
        &p,
        &[
            "--experts",
            &t.shape.experts_per_layer.to_string(),
            "--json",
        ],
    ))
    .unwrap();
    let read = &json["trace"]["source"]["files"]["read"];
    assert_eq!(read["rows"]["missing_rows"], log.rows_dropped, "{read}");
    assert_eq!(read["format"], "routes-jsonl");
}

#[test]
fn a_raw_log_made_from_the_mixtral_logs_replays() {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/moe/mixtral-decode");
    if !d.is_dir() {
        println!("SKIP Mixtral raw-log replay: ../shared/data/moe/mixtral-decode is absent");
        return;
    }
    let src = read_trace(&d.join("gsm8k_2_routing.jsonl"), &ReadOptions::default()).unwrap();
    let (p, log) = write_raw(&src, "mixtral_raw.jsonl");
    let out = replay(&p, &[]);
    let want = format!(
        "read: {} (token, layer) rows missing",
        log.rows_dropped + log.rows_absent
    );
    assert!(out.contains(&want), "{want}\n{out}");
    assert!(
        out.contains(&format!("{} steps, 32 layers", src.steps.len() + 1)),
        "{out}"
    );
}

#[test]
fn a_llama_cpp_csv_replays_and_a_keyed_count_dump_fits_a_seed() {
    let csv = temp("moe_trace.csv");
    let mut s = String::from("layer,expert\n");
    for step in 0..30u32 {
        for l in 0..4u32 {
            let a = (step * 3 + l) % 8;
            s += &format!("{l},{a}\n{l},{}\n", (a + 1) % 8);
        }
    }
    std::fs::write(&csv, s).unwrap();
    let out = replay(&csv, &[]);
    assert!(out.contains("read: read as routing-csv: 240 rows"), "{out}");
    assert!(
        out.contains("30 steps, 4 layers × 8 experts, top-2"),
        "{out}"
    );

    let dump = temp("usage.json");
    std::fs::write(
        &dump,
        r#"{"expert_usage_by_layer": {"1": {"0": 747, "1": 12, "2": 30}, "3": {"0": 5, "2": 90, "1": 1}}}"#,
    )
    .unwrap();
    let o = tierkit(&[
        "experts",
        "fit-seed",
        "--eplb-counts",
        dump.to_str().unwrap(),
        "--hot",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("renumbered in order: 0 ← \"1\", 1 ← \"3\""),
        "{err}"
    );
    // Replaying the dump names its keys and where counts are read.
    let o = tierkit(&["experts", "replay", "--trace", dump.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("expert_usage_by_layer") && err.contains("fit-seed --eplb-counts"),
        "{err}"
    );
}

#[test]
fn prefill_puts_one_prompt_step_in_front_of_each_segment() {
    let json = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "experts",
            "replay",
            "--steps",
            "60",
            "--shift-at",
            "30",
            "--tokens",
            "1",
            "--policy",
            "cost-aware,best-static",
            "--optimum",
            "never",
            "--json",
        ];
        args.extend_from_slice(extra);
        serde_json::from_str(&ok_stdout(&args)).unwrap()
    };
    let plain = json(&[]);
    let pre = json(&["--prefill", "40"]);
    assert_eq!(plain["trace"]["steps"], 60);
    assert_eq!(pre["trace"]["steps"], 62, "one prefill per segment");
    assert_eq!(plain["trace"]["shifts"], serde_json::json!([30]));
    assert_eq!(
        pre["trace"]["shifts"],
        serde_json::json!([31]),
        "the shift moves onto its prefill"
    );
    // Each prefill routes 40 tokens × top-k in every layer.
    let (lp, lq) = (
        plain["trace"]["lookups"].as_u64().unwrap(),
        pre["trace"]["lookups"].as_u64().unwrap(),
    );
    let shape = &plain["trace"]["shape"];
    let per_prefill = 40 * shape["top_k"].as_u64().unwrap() * shape["layers"].as_u64().unwrap();
    assert_eq!(lq - lp, 2 * per_prefill);
    assert!(pre["trace"]["name"]
        .as_str()
        .unwrap()
        .ends_with("+prefill40"));
    // Same seed, same trace.
    assert_eq!(json(&["--prefill", "40"])["summary"], pre["summary"]);
    // A prefill above the bound is a typed error, not a panic.
    let o = tierkit(&[
        "experts",
        "replay",
        "--steps",
        "20",
        "--prefill",
        "999999999",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--prefill 999999999") && err.contains("bound"),
        "{err}"
    );
}
