//! `tierkit experts replay --mode`: the default is the in-place scoreboard as before; the other
//! modes print the modes table, whose rows name their mode; bad mode flags fail cleanly.

mod common;

use common::{fails_with, ok_stdout};

const TINY: &[&str] = &["--steps", "240", "--tokens", "4", "--seed", "5"];

fn replay(extra: &[&str]) -> String {
    let mut args = vec!["experts", "replay"];
    args.extend_from_slice(TINY);
    args.extend_from_slice(extra);
    ok_stdout(&args)
}

fn json(extra: &[&str]) -> serde_json::Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(extra);
    serde_json::from_str(&replay(&a)).unwrap()
}

#[test]
fn mode_flag_selects_the_table() {
    // No flag and --mode in-place: the scoreboard, byte for byte the same.
    let plain = replay(&[]);
    assert_eq!(plain, replay(&["--mode", "in-place"]));
    assert!(!plain.contains("| mode"), "{plain}");
    let board = json(&[]);
    assert!(board.get("summary").is_some() && board.get("rows").is_none());

    let one = json(&["--mode", "copy-on-miss"]);
    let rows = one["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    assert!(rows.iter().all(|r| r["mode"] == "copy-on-miss"));
    let labels: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["label"].as_str().unwrap(), r["bank"].as_str().unwrap()))
        .collect();
    assert_eq!(
        labels,
        [
            ("static", "per-layer"),
            ("seed", "per-layer"),
            ("cost-aware (default)", "per-layer"),
            ("recency (capped 4)", "per-layer"),
            ("lru", "per-layer"),
            ("lru", "shared"),
        ]
    );
    // Copy-on-miss reads nothing in place.
    assert!(rows.iter().all(|r| r["reads"] == 0));
    // Every row has its ratio to the copy-on-miss optimum of its bank (Belady's MIN), at least 1.
    let optima = one["optima"]["rows"].as_array().unwrap();
    assert_eq!(optima.len(), 2);
    for r in rows {
        let o = optima.iter().find(|o| o["bank"] == r["bank"]).unwrap();
        let want =
            r["stall_ms_per_step"].as_f64().unwrap() / o["stall_ms_per_step"].as_f64().unwrap();
        let got = r["vs_optimum"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-9 && got >= 1.0 - 1e-9, "{r}");
    }

    // (The in-place min-cost flows are the scoreboard's, tested there; a debug build takes a
    // minute on them here.)
    let all = json(&["--mode", "all", "--optimum", "never"]);
    let rows = all["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 24);
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    for (i, m) in ["in-place", "copy-on-miss", "read-or-copy", "cpu"]
        .iter()
        .enumerate()
    {
        assert!(
            modes[i * 6..(i + 1) * 6].iter().all(|x| x == m),
            "{modes:?}"
        );
    }
    // A fixed map's copy-on-miss stall over its in-place stall is one copy over one read, at
    // the link's prices as the JSON states them.
    let link = &all["options"]["link"];
    let price = |k: &str| link[k].as_f64().unwrap();
    let b = all["geometry"]["expert_bytes"].as_f64().unwrap();
    let want = (b / (price("copy_gbps") * 1e3) + price("copy_fixed_us"))
        / (b / (price("read_gbps") * 1e3));
    let fixed = |mode: &str| {
        rows.iter()
            .find(|r| r["mode"] == mode && r["label"] == "static")
            .unwrap()["stall_ms_per_step"]
            .as_f64()
            .unwrap()
    };
    let got = fixed("copy-on-miss") / fixed("in-place");
    assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    // The in-place rows of the fixed maps and the controllers are the scoreboard's.
    let summary = board["summary"].as_array().unwrap();
    for label in [
        "static",
        "seed",
        "cost-aware (default)",
        "recency (capped 4)",
    ] {
        let s = summary.iter().find(|r| r["label"] == label).unwrap();
        let m = &rows.iter().find(|r| r["label"] == label).unwrap();
        let (a, b) = (
            s["stall_ms_per_step"].as_f64().unwrap(),
            m["stall_ms_per_step"].as_f64().unwrap(),
        );
        assert!((a - b).abs() <= 1e-9 * a.max(1.0), "{label}: {a} vs {b}");
    }
    // A slower CPU makes the cpu rows slower, never faster.
    let slow = json(&["--mode", "cpu", "--cpu-gbps", "5"]);
    let fast = json(&["--mode", "cpu"]);
    for (s, f) in slow["rows"]
        .as_array()
        .unwrap()
        .iter()
        .zip(fast["rows"].as_array().unwrap())
    {
        assert!(s["stall_ms_per_step"].as_f64() >= f["stall_ms_per_step"].as_f64());
    }
    let text = replay(&["--mode", "read-or-copy", "--link", "gb300-c2c"]);
    assert!(
        text.contains("| mode") && text.contains("| read-or-copy"),
        "{text}"
    );
    assert!(text.contains("engine modes: read-or-copy"), "{text}");
    assert!(text.contains("lowest id"), "{text}");
    // On GB300 a read is cheaper than a copy: read-or-copy has no optimum, and says why.
    assert!(
        text.contains("offline optimum read-or-copy per-layer: not computed"),
        "{text}"
    );
    let never = replay(&["--mode", "copy-on-miss", "--optimum", "never"]);
    assert!(
        never.contains("--optimum never") && !never.contains(" offline optimum |"),
        "{never}"
    );
    let always = ok_stdout(&[
        "experts",
        "replay",
        "--steps",
        "40",
        "--tokens",
        "2",
        "--mode",
        "all",
        "--optimum",
        "always",
    ]);
    assert!(
        always.contains(" vs optimum |") && always.contains(" offline optimum |"),
        "{always}"
    );
}

#[test]
fn bad_mode_flags_fail_cleanly() {
    let base = ["experts", "replay", "--steps", "50"];
    let with = |extra: &[&'static str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        a
    };
    fails_with(&with(&["--mode", "cpu", "--cpu-gbps", "0"]), "cpu_gbps");
    fails_with(
        &with(&["--mode", "cpu", "--cpu-together", "1.5"]),
        "together",
    );
    fails_with(&with(&["--cpu-gbps", "10"]), "--mode cpu or all");
    fails_with(
        &with(&["--mode", "copy-on-miss", "--plot", "x.png"]),
        "--plot applies to the in-place scoreboard",
    );
    fails_with(
        &with(&["--mode", "all", "--policy", "lru"]),
        "--policy applies",
    );
    // The CPU prices beside a mode without a CPU channel were ignored, exit 0.
    for mode in ["copy-on-miss", "read-or-copy"] {
        fails_with(
            &with(&["--mode", mode, "--cpu-gbps", "3"]),
            &format!("not with --mode {mode} (it has no CPU channel)"),
        );
    }
}

#[test]
fn optimum_always_where_the_link_forbids_it_fails_before_the_run() {
    // --optimum always promises the optimum or a failure; on a link hiding copy time it is not
    // computable. A modes table printed "not computed" and exited 0; the scoreboard failed only
    // after replaying every other policy.
    let base = [
        "experts",
        "replay",
        "--steps",
        "50",
        "--hide-us",
        "5",
        "--optimum",
        "always",
    ];
    for extra in [
        &["--mode", "all"][..],
        &["--mode", "copy-on-miss"],
        &["--policy", "static,offline-optimum"],
    ] {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        fails_with(
            &a,
            "--optimum always: invalid config: the offline optimum needs a stall linear in copies",
        );
    }
    // Where no optimum is asked for, or the link's copies stop the step, it runs.
    let mut a = base.to_vec();
    a.extend_from_slice(&["--tokens", "4", "--policy", "static"]);
    ok_stdout(&a);
    let mut a = base.to_vec();
    a.extend_from_slice(&["--tokens", "4", "--mode", "cpu"]);
    ok_stdout(&a);
}
