//! The `bound (any policy ≥)` row is a lower bound: on small random traces, no replayed policy's
//! stall, distinct cold pairs or cold lookups fall below it in any step, under either link preset.

use expert_residency::{ControllerConfig, Geometry};
use proptest::prelude::*;
use tierkit_sim::experts::scoreboard::{self, Policy};
use tierkit_sim::experts::trace::{StepPicks, Trace, TraceShape};
use tierkit_sim::experts::{
    replay_with, LinkModel, OracleWindow, PolicySpec, ReplayOptions, ReplayReport, StaticRank,
};

/// `steps` steps of `tokens` tokens, each picking `top_k` distinct experts per layer from `draws`
/// (a flat stream of raw numbers, reused cyclically), skewed to low ids by squaring.
fn trace(layers: u32, experts: u32, top_k: u32, tokens: u32, steps: usize, draws: &[u32]) -> Trace {
    let mut k = 0usize;
    let mut next = || {
        let x = draws[k % draws.len()];
        k += 1;
        x
    };
    let steps = (0..steps)
        .map(|_| StepPicks {
            layers: (0..layers)
                .map(|_| {
                    let mut picks = Vec::new();
                    for _ in 0..tokens {
                        let mut mine: Vec<u32> = Vec::new();
                        while mine.len() < top_k as usize {
                            let r = next() % (experts * experts);
                            // Square-root skew: low ids more often.
                            let e = (r as f64).sqrt() as u32 % experts;
                            let e = (0..experts)
                                .map(|d| (e + d) % experts)
                                .find(|c| !mine.contains(c))
                                .expect("top_k ≤ experts");
                            mine.push(e);
                        }
                        picks.extend(mine);
                    }
                    picks
                })
                .collect(),
        })
        .collect();
    Trace {
        name: "bound-prop".into(),
        shape: TraceShape {
            layers,
            experts_per_layer: experts,
            top_k,
        },
        steps,
        shifts: vec![],
    }
}

fn specs() -> Vec<PolicySpec> {
    let fast = |c: ControllerConfig| {
        PolicySpec::Controller(
            None,
            Box::new(ControllerConfig {
                drain_every: 1,
                ..c
            }),
        )
    };
    vec![
        PolicySpec::Static(None),
        PolicySpec::BestStatic(OracleWindow::Whole, StaticRank::Touched),
        PolicySpec::Lru(None),
        PolicySpec::Controller(None, Box::default()),
        fast(ControllerConfig {
            half_life_steps: 2.0,
            ..ControllerConfig::published_recipe()
        }),
        PolicySpec::Controller(None, Box::new(scoreboard::recency_config())),
        fast(ControllerConfig {
            max_swaps_per_layer: 8,
            max_swaps_per_step: 64,
            swap_budget_bytes_per_step: None,
            ..ControllerConfig::default()
        }),
    ]
}

fn check(bound: &ReplayReport, r: &ReplayReport, what: &str) {
    assert_eq!(bound.bytes.per_step.len(), r.bytes.per_step.len());
    for (i, (b, p)) in bound
        .bytes
        .per_step
        .iter()
        .zip(&r.bytes.per_step)
        .enumerate()
    {
        assert!(
            p.cold_unique_pairs >= b.cold_unique_pairs,
            "{what} step {i}: {} distinct cold pairs < bound {}",
            p.cold_unique_pairs,
            b.cold_unique_pairs
        );
        assert!(
            p.stall_us >= b.stall_us - 1e-9 * b.stall_us.abs(),
            "{what} step {i}: stall {} µs < bound {} µs",
            p.stall_us,
            b.stall_us
        );
        assert_eq!(b.swap_copies, 0);
    }
    // Cold lookups per step (window of one step: shares of the same lookups).
    for (i, (b, p)) in bound
        .cold_share_windows
        .iter()
        .zip(&r.cold_share_windows)
        .enumerate()
    {
        assert!(
            p + 1e-12 >= *b,
            "{what} step {i}: cold share {p} < bound {b}"
        );
    }
    assert!(r.bytes.mean_stall_us_per_step >= bound.bytes.mean_stall_us_per_step * (1.0 - 1e-12));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn no_policy_is_below_the_bound(
        layers in 1u32..=3,
        experts in 2u32..=10,
        hot_frac in 0.0f64..1.0,
        top_k_frac in 0.0f64..1.0,
        tokens in 1u32..=6,
        steps in 1usize..=40,
        draws in proptest::collection::vec(any::<u32>(), 1..64),
        gb300 in any::<bool>(),
        hide_us in prop_oneof![Just(0.0), 0.0f64..20.0],
    ) {
        let hot = 1 + ((experts - 1) as f64 * hot_frac) as u32;
        let top_k = 1 + ((experts.min(4) - 1) as f64 * top_k_frac) as u32;
        let t = trace(layers, experts, top_k, tokens, steps, &draws);
        let g = Geometry::new(layers, experts, hot, 1 << 20).unwrap();
        let link = if gb300 {
            LinkModel::gb300_c2c()
        } else {
            LinkModel { hide_us, ..LinkModel::h200_pcie() }
        };
        let opts = ReplayOptions {
            window_steps: 1,
            per_step_bytes: true,
            link,
            ..ReplayOptions::default()
        };
        let cfg = ControllerConfig::default();
        let bound = replay_with(&t, &g, &PolicySpec::Bound, &cfg, &opts).unwrap();
        prop_assert_eq!(bound.boot.as_str(), "any");
        for spec in specs() {
            let r = replay_with(&t, &g, &spec, &cfg, &opts).unwrap();
            check(&bound, &r, &format!("{spec:?}"));
        }
    }
}

/// On a batched step the bound is what every map must read; on the scoreboard it is the last
/// row, and the policy rows are not below it.
#[test]
fn the_scoreboard_row_bounds_every_policy() {
    // 1 layer × 6 experts, 2 hot; step 0 touches 5 experts (3 must be cold: the three least
    // picked, 1 pick each), step 1 touches 2 (nothing forced).
    let t = Trace {
        name: "b".into(),
        shape: TraceShape {
            layers: 1,
            experts_per_layer: 6,
            top_k: 2,
        },
        steps: vec![
            StepPicks {
                layers: vec![vec![0, 1, 0, 1, 2, 3, 4, 0]],
            },
            StepPicks {
                layers: vec![vec![5, 4]],
            },
        ],
        shifts: vec![],
    };
    let g = Geometry::new(1, 6, 2, 47_000).unwrap();
    let opts = ReplayOptions {
        window_steps: 1,
        per_step_bytes: true,
        ..ReplayOptions::default()
    };
    let cfg = ControllerConfig::default();
    let b = replay_with(&t, &g, &PolicySpec::Bound, &cfg, &opts).unwrap();
    assert_eq!(b.bytes.per_step[0].cold_unique_pairs, 3);
    assert_eq!(b.bytes.per_step[1].cold_unique_pairs, 0);
    // 3 reads of 47,000 bytes at 47 GB/s: 3 µs, no copy.
    assert!((b.bytes.per_step[0].stall_us - 3.0).abs() < 1e-9);
    assert!((b.cold_share_windows[0] - 3.0 / 8.0).abs() < 1e-12);
    let (seed, _) = scoreboard::default_seed_map(&t, &g).unwrap();
    let specs = scoreboard::policy_specs(&Policy::ALL, &t, &seed);
    assert_eq!(specs.last().unwrap().0, scoreboard::BOUND_LABEL);
    let runs = scoreboard::run_policies(&t, &g, &cfg, &opts, &specs, &|_| {}).unwrap();
    let rows = scoreboard::summarize(&runs);
    let bound = rows.last().unwrap();
    assert_eq!(bound.label, scoreboard::BOUND_LABEL);
    for r in &rows {
        assert!(
            r.stall_ms_per_step >= bound.stall_ms_per_step,
            "{}: {} < {}",
            r.label,
            r.stall_ms_per_step,
            bound.stall_ms_per_step
        );
    }
    assert!(scoreboard::render(&rows).contains("bound (any policy ≥)"));
}
