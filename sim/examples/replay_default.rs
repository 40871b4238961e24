//! Replays the default synthetic scenario (OLMoE-1B-7B shape: 16 layers × 64 experts, top-8,
//! 16 hot per layer; 32 decode tokens per step, github → book shift at step 3,000 of 9,000,
//! calibrated to the OLMoE routing counts) through every policy and prints the scoreboard that
//! `tierkit experts replay` prints.
//!
//! ```text
//! cargo run --release -p tierkit-sim --example replay_default [-- --json report.json] \
//!     [--telemetry drains.jsonl] [--link h200-pcie|gb300-c2c]
//! ```
//! T90 seconds assume a 20 ms decode step. The byte columns price host reads and swap copies
//! under the H200 PCIe link (`--link gb300-c2c` for the published GB300 C2C figures). `--json`
//! writes every report (deterministic bytes); `--telemetry` writes the per-drain JSON lines of
//! the cost-aware default run.

use expert_residency::{ControllerConfig, Geometry};
use tierkit_sim::experts::scoreboard::{self, Policy};
use tierkit_sim::experts::trace::synth::{generate, SynthConfig};
use tierkit_sim::experts::{LinkModel, ReplayOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let json_out = arg("--json");
    let telemetry_out = arg("--telemetry");
    let link = match arg("--link") {
        Some(name) => LinkModel::preset(&name)?,
        None => LinkModel::h200_pcie(),
    };
    let trace = generate(&SynthConfig::default_scenario())?;
    let s = trace.shape;
    // OLMoE-1B-7B experts: 3 matrices of 2048 × 1024 in bf16 (12 MiB), as `tierkit experts replay`.
    let g = Geometry::new(s.layers, s.experts_per_layer, 16, 3 * 2048 * 1024 * 2)?;
    let (seed_map, seed_note) = scoreboard::default_seed_map(&trace, &g)?;
    let opts = ReplayOptions {
        step_time_s: Some(0.020),
        telemetry: telemetry_out.is_some(),
        link,
        ..ReplayOptions::default()
    };
    let cfg = ControllerConfig::default();
    let specs = scoreboard::policy_specs(&Policy::ALL, &trace, &seed_map);
    let runs = scoreboard::run_policies(&trace, &g, &cfg, &opts, &specs, &|_| {})?;
    println!(
        "scenario {} ({} steps, shifts at {:?}, {} lookups); seed map {seed_note}",
        trace.name,
        trace.steps.len(),
        trace.shifts,
        trace.lookups()
    );
    println!("{}", scoreboard::render(&scoreboard::summarize(&runs)));
    println!("{}", scoreboard::legend(&opts, &trace));
    for r in &runs {
        if let Some(t) = r.report.shifts.first().and_then(|t| t.seconds) {
            if r.report.swaps.applied > 0 {
                println!("{}: T90 {t:.1} s at 20 ms per step", r.label);
            }
        }
    }
    if let Some(path) = telemetry_out {
        let run = runs
            .iter()
            .find(|r| r.label == "cost-aware (default)")
            .ok_or("no cost-aware (default) run")?;
        std::fs::write(&path, run.report.telemetry_json_lines())?;
        println!("wrote {path} ({} drains)", run.report.telemetry.len());
    }
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_string_pretty(&runs)?)?;
        println!("wrote {path}");
    }
    Ok(())
}
