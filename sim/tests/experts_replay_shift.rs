//! Replays of a synthetic domain-shift trace built here (Zipf-like popularity per domain, shift at
//! a known step): adaptive ends close to the oracle for the new domain, a seed map fitted on the
//! old domain ends worse, and the shift response at least halves T90.

use expert_residency::{fit_seed_map, ControllerConfig, ExpertError, Geometry};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tierkit_sim::experts::trace::{StepPicks, Trace, TraceShape};
use tierkit_sim::experts::{
    replay, replay_with, OracleWindow, PolicySpec, ReplayOptions, StaticRank,
};

const LAYERS: u32 = 4;
const EXPERTS: u32 = 64;
const TOP_K: u32 = 8;
const HOT: u32 = 16;
const TOKENS: usize = 16;

/// Cumulative Zipf(s) weights over experts permuted per layer (one permutation per domain).
fn domain(rng: &mut ChaCha8Rng, s: f64) -> Vec<Vec<f64>> {
    (0..LAYERS)
        .map(|_| {
            let mut perm: Vec<usize> = (0..EXPERTS as usize).collect();
            perm.shuffle(rng);
            let mut w = vec![0.0; EXPERTS as usize];
            for (rank, &e) in perm.iter().enumerate() {
                w[e] = 1.0 / ((rank + 1) as f64).powf(s);
            }
            let mut acc = 0.0;
            w.iter()
                .map(|x| {
                    acc += x;
                    acc
                })
                .collect()
        })
        .collect()
}

fn sample_topk(rng: &mut ChaCha8Rng, cdf: &[f64], out: &mut Vec<u32>) {
    let total = *cdf.last().unwrap();
    let start = out.len();
    while out.len() - start < TOP_K as usize {
        let x = rng.random::<f64>() * total;
        let e = cdf.partition_point(|&c| c < x) as u32;
        if !out[start..].contains(&e) {
            out.push(e);
        }
    }
}

fn shift_trace(steps: usize, shift: usize, seed: u64) -> Trace {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let a = domain(&mut rng, 1.1);
    let b = domain(&mut rng, 1.1);
    let steps = (0..steps)
        .map(|t| {
            let d = if t < shift { &a } else { &b };
            StepPicks {
                layers: d
                    .iter()
                    .map(|cdf| {
                        let mut picks = Vec::with_capacity(TOKENS * TOP_K as usize);
                        for _ in 0..TOKENS {
                            sample_topk(&mut rng, cdf, &mut picks);
                        }
                        picks
                    })
                    .collect(),
            }
        })
        .collect();
    Trace {
        name: format!("zipf-shift-{seed}"),
        shape: TraceShape {
            layers: LAYERS,
            experts_per_layer: EXPERTS,
            top_k: TOP_K,
        },
        steps,
        shifts: vec![shift as u64],
    }
}

fn geometry() -> Geometry {
    Geometry::new(LAYERS, EXPERTS, HOT, 1 << 20).unwrap()
}

#[test]
fn adaptive_tracks_the_shift_and_beats_the_old_seed() {
    let (n, shift) = (9000, 2000);
    let trace = shift_trace(n, shift, 11);
    let g = geometry();
    let cfg = ControllerConfig::published_recipe();
    let opts = ReplayOptions {
        step_time_s: Some(0.025),
        ..ReplayOptions::default()
    };
    let old = tierkit_sim::experts::counter_dump(&trace, 0..shift).unwrap();
    let seed_map = fit_seed_map("zipf", &g, &old).unwrap();
    let run = |p: &PolicySpec| replay_with(&trace, &g, p, &cfg, &opts).unwrap();
    let oracle = run(&PolicySpec::BestStatic(
        OracleWindow::AfterLastShift,
        StaticRank::Picks,
    ));
    let adaptive = run(&PolicySpec::Adaptive(None));
    let boosted = run(&PolicySpec::AdaptiveShiftResponse(None));
    let seeded = run(&PolicySpec::Seed(seed_map.clone()));
    let uniform = run(&PolicySpec::Static(None));
    let lru = run(&PolicySpec::Lru(None));
    for r in [&oracle, &adaptive, &boosted, &seeded, &uniform, &lru] {
        println!(
            "{:<24} steady {:.4} overall {:.4} t90 {:?} swaps {:?} max/step {} mean/step {:.3}",
            r.policy,
            r.steady_state.cold_share,
            r.cold_share_overall,
            r.shifts[0].steps,
            r.swaps,
            r.max_swaps_per_step,
            r.mean_swaps_per_step
        );
    }
    let o = oracle.steady_state.cold_share;
    // Adaptive's steady state after the shift is within 1.05× of the oracle for the new domain.
    assert!(
        adaptive.steady_state.cold_share <= 1.05 * o,
        "adaptive vs oracle"
    );
    // The seed fitted on the old domain is worse than adaptive after the shift.
    assert!(seeded.steady_state.cold_share > 1.2 * adaptive.steady_state.cold_share);
    // T90 is defined and reported in steps and seconds.
    let t_seed = adaptive.shifts[0].steps.expect("adaptive settles");
    assert!(t_seed > 0);
    assert!(adaptive.shifts[0].seconds.is_some());
    // Shift response: at least halves T90, same steady state, caps kept.
    let t_boost = boosted.shifts[0].steps.expect("boosted settles");
    assert!(2 * t_boost <= t_seed, "T90 {t_boost} vs {t_seed}");
    assert!(boosted.steady_state.cold_share <= 1.05 * o);
    assert!(boosted.shift_detections >= 1);
    for r in [&adaptive, &boosted] {
        assert!(r.max_swaps_per_step <= cfg.max_swaps_per_step);
        assert_eq!(r.swaps.rejected, 0);
        assert!(r.swaps.applied > 0);
    }
    // Static policies never swap.
    assert_eq!(
        seeded.swaps.applied + uniform.swaps.applied + oracle.swaps.applied,
        0
    );
}

#[test]
fn same_seed_same_json_and_bytes_verified() {
    let trace = shift_trace(1500, 600, 5);
    let g = geometry();
    let cfg = ControllerConfig::with_shift_response();
    let opts = ReplayOptions {
        telemetry: true,
        verify_bytes: Some(16),
        ..ReplayOptions::default()
    };
    let p = PolicySpec::AdaptiveShiftResponse(None);
    let a = replay_with(&trace, &g, &p, &cfg, &opts).unwrap();
    let b = replay_with(&shift_trace(1500, 600, 5), &g, &p, &cfg, &opts).unwrap();
    let (ja, jb) = (
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap(),
    );
    assert_eq!(ja, jb);
    assert_eq!(a.telemetry_json_lines(), b.telemetry_json_lines());
    assert_eq!(a.telemetry.len(), 1500 / 64);
    assert!(a.verified_moves.unwrap() >= a.swaps.applied);
    assert!(a.swaps.applied > 0);
}

#[test]
fn bad_traces_are_typed_errors() {
    let g = geometry();
    let cfg = ControllerConfig::published_recipe();
    let p = PolicySpec::Adaptive(None);
    let mut t = shift_trace(10, 5, 1);
    t.steps[3].layers[2][0] = EXPERTS;
    assert!(matches!(
        replay(&t, &g, &p, &cfg),
        Err(ExpertError::ExpertOutOfRange { .. })
    ));
    let mut t = shift_trace(10, 5, 1);
    t.shape.top_k = EXPERTS + 1;
    assert!(matches!(
        replay(&t, &g, &p, &cfg),
        Err(ExpertError::TopKTooWide { .. })
    ));
    let mut t = shift_trace(10, 5, 1);
    t.steps.clear();
    assert!(matches!(
        replay(&t, &g, &p, &cfg),
        Err(ExpertError::EmptyTrace(_))
    ));
    let mut t = shift_trace(10, 5, 1);
    t.steps
        .iter_mut()
        .for_each(|s| s.layers.iter_mut().for_each(|l| l.clear()));
    assert!(matches!(
        replay(&t, &g, &p, &cfg),
        Err(ExpertError::EmptyTrace(_))
    ));
    let t = shift_trace(10, 5, 1);
    let other = Geometry::new(LAYERS, EXPERTS + 1, HOT, 1).unwrap();
    assert!(matches!(
        replay(&t, &other, &p, &cfg),
        Err(ExpertError::GeometryMismatch { .. })
    ));
    let wrong_map = expert_residency::ResidencyMap::first_k(
        "x",
        Geometry::new(LAYERS, EXPERTS, HOT + 1, 1 << 20).unwrap(),
    )
    .unwrap();
    assert!(matches!(
        replay(&t, &g, &PolicySpec::Seed(wrong_map), &cfg),
        Err(ExpertError::GeometryMismatch { .. })
    ));
    assert!(matches!(
        Geometry::new(LAYERS, EXPERTS, EXPERTS + 1, 1),
        Err(ExpertError::HotExceedsExperts { .. })
    ));
}

#[test]
fn shift_response_stays_quiet_without_a_shift() {
    let trace = shift_trace(4000, 4000, 3);
    assert_eq!(trace.shifts, vec![4000]); // outside the trace: no shift inside
    let g = geometry();
    let cfg = ControllerConfig::published_recipe();
    let plain = replay(&trace, &g, &PolicySpec::Adaptive(None), &cfg).unwrap();
    let boosted = replay(&trace, &g, &PolicySpec::AdaptiveShiftResponse(None), &cfg).unwrap();
    assert!(plain.shifts.is_empty());
    // Adaptation from the uniform boot map lowers the cold share: no jump to detect.
    assert_eq!(boosted.shift_detections, 0);
    assert_eq!(
        boosted.steady_state.cold_share,
        plain.steady_state.cold_share
    );
}
