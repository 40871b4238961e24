//! The acceptance replay on the default synthetic scenario (OLMoE-1B-7B shape, 16 hot of
//! 64 experts per layer, github → book at step 3,000 of 9,000; generator in `trace::synth`).
//! 37 M lookups per policy: run in release (`cargo test --release -p expert-residency --test
//! default_scenario`); ignored in debug builds. `examples/replay_default.rs` prints the table.

use expert_residency::{fit_seed_map, ControllerConfig, Geometry};
use tierkit_sim::experts::trace::synth::{generate, SynthConfig};
use tierkit_sim::experts::{replay_with, OracleWindow, PolicySpec, ReplayOptions, StaticRank};

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "37 M lookups per policy: run with --release"
)]
fn default_scenario_meets_the_bar() {
    let trace = generate(&SynthConfig::default_scenario()).unwrap();
    let s = trace.shape;
    let g = Geometry::new(s.layers, s.experts_per_layer, 16, 6 << 20).unwrap();
    let shift = trace.shifts[0] as usize;
    let seed_map = fit_seed_map(
        "olmoe",
        &g,
        &tierkit_sim::experts::counter_dump(&trace, 0..shift).unwrap(),
    )
    .unwrap();
    let cfg = ControllerConfig::published_recipe();
    let opts = ReplayOptions::default();
    let run = |p: PolicySpec| replay_with(&trace, &g, &p, &cfg, &opts).unwrap();
    let oracle = run(PolicySpec::BestStatic(
        OracleWindow::AfterLastShift,
        StaticRank::Picks,
    ));
    let adaptive = run(PolicySpec::Adaptive(None));
    let boosted = run(PolicySpec::AdaptiveShiftResponse(None));
    let seeded = run(PolicySpec::Seed(seed_map));
    let o = oracle.steady_state.cold_share;
    println!(
        "oracle {o:.4} adaptive {:.4} (T90 {:?}) shift-response {:.4} (T90 {:?}) seed {:.4}",
        adaptive.steady_state.cold_share,
        adaptive.shifts[0].steps,
        boosted.steady_state.cold_share,
        boosted.shifts[0].steps,
        seeded.steady_state.cold_share
    );
    assert!(adaptive.steady_state.cold_share <= 1.05 * o);
    assert!(seeded.steady_state.cold_share > adaptive.steady_state.cold_share);
    let t_seed = adaptive.shifts[0].steps.unwrap();
    let t_boost = boosted.shifts[0].steps.unwrap();
    assert!(2 * t_boost <= t_seed);
    assert!(boosted.steady_state.cold_share <= 1.05 * o);
    assert!(boosted.max_swaps_per_step <= cfg.max_swaps_per_step);
    assert!(adaptive.max_swaps_per_step <= cfg.max_swaps_per_step);
}
