//! Replays the default synthetic scenario (OLMoE-1B-7B shape: 16 layers × 64 experts, top-8,
//! 16 hot per layer; 32 decode tokens per step, github → book shift at step 3,000 of 9,000,
//! calibrated to the OLMoE routing counts) through every policy and prints the scoreboard.
//!
//! ```text
//! cargo run --release -p expert-residency --example replay_default [-- --json report.json] \
//!     [--telemetry drains.jsonl]
//! ```
//! T90 seconds assume a 20 ms decode step. `--json` writes every report (deterministic bytes);
//! `--telemetry` writes the per-drain JSON lines of the adaptive + shift-response run.

use expert_residency::trace::synth::{generate, SynthConfig};
use expert_residency::{
    replay_with, seed, ControllerConfig, CounterDump, Geometry, OracleWindow, PolicySpec,
    ReplayOptions, ReplayReport,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let json_out = arg("--json");
    let telemetry_out = arg("--telemetry");
    let scenario = SynthConfig::default_scenario();
    let trace = generate(&scenario)?;
    let s = trace.shape;
    let g = Geometry::new(s.layers, s.experts_per_layer, 16, 6 << 20)?;
    let shift = *trace.shifts.first().ok_or("scenario without shift")? as usize;
    let old = CounterDump::from_trace(&trace, 0..shift)?;
    let seed_map = seed::fit("olmoe-1b-7b", &g, &old)?;
    let opts = ReplayOptions {
        step_time_s: Some(0.020),
        telemetry: telemetry_out.is_some(),
        ..ReplayOptions::default()
    };
    let cfg = ControllerConfig::default();
    let policies = [
        PolicySpec::Oracle(OracleWindow::AfterLastShift),
        PolicySpec::Static(None),
        PolicySpec::Seed(seed_map),
        PolicySpec::Lru(None),
        PolicySpec::Adaptive(None),
        PolicySpec::AdaptiveShiftResponse(None),
    ];
    let reports: Vec<ReplayReport> = policies
        .iter()
        .map(|p| replay_with(&trace, &g, p, &cfg, &opts))
        .collect::<Result<_, _>>()?;
    let oracle = reports[0].steady_state.cold_share;
    println!(
        "scenario {} ({} steps, shift at {shift}, {} lookups); steady state = mean of steps {}..{}",
        trace.name,
        reports[0].steps,
        reports[0].lookups,
        reports[0].steady_state.from_step,
        reports[0].steady_state.to_step
    );
    println!(
        "{:<24} {:>8} {:>8} {:>9} {:>10} {:>8} {:>10} {:>8} {:>9} {:>6}",
        "policy",
        "steady",
        "×oracle",
        "overall",
        "T90 steps",
        "T90 s",
        "applied",
        "max/step",
        "mean/step",
        "detect"
    );
    for r in &reports {
        let t = &r.shifts[0];
        println!(
            "{:<24} {:>8.4} {:>8.3} {:>9.4} {:>10} {:>8} {:>10} {:>8} {:>9.4} {:>6}",
            r.policy,
            r.steady_state.cold_share,
            r.steady_state.cold_share / oracle,
            r.cold_share_overall,
            t.steps.map_or("-".into(), |x| x.to_string()),
            t.seconds.map_or("-".into(), |x| format!("{x:.1}")),
            r.swaps.applied,
            r.max_swaps_per_step,
            r.mean_swaps_per_step,
            r.shift_detections
        );
    }
    if let Some(path) = telemetry_out {
        let last = reports.last().expect("six policies");
        std::fs::write(&path, last.telemetry_json_lines())?;
        println!("wrote {path} ({} drains)", last.telemetry.len());
    }
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_string_pretty(&reports)?)?;
        println!("wrote {path}");
    }
    Ok(())
}
