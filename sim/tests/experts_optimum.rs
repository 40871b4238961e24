//! The `offline optimum` row is the least stall: on small random traces no replayed policy's
//! stall over the whole trace is below it, under either link preset, and the best static map
//! (by steps touched) stalls no more than any other static map in hindsight.

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
        name: "optimum-prop".into(),
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
        PolicySpec::BestStatic(OracleWindow::Whole, StaticRank::Picks),
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

fn stall(r: &ReplayReport) -> f64 {
    r.bytes.stall_us
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn no_policy_is_below_the_optimum(
        layers in 1u32..=3,
        experts in 2u32..=10,
        hot_frac in 0.0f64..1.0,
        top_k_frac in 0.0f64..1.0,
        tokens in 1u32..=6,
        steps in 1usize..=40,
        draws in proptest::collection::vec(any::<u32>(), 1..64),
        gb300 in any::<bool>(),
    ) {
        let hot = 1 + ((experts - 1) as f64 * hot_frac) as u32;
        let top_k = 1 + ((experts.min(4) - 1) as f64 * top_k_frac) as u32;
        let t = trace(layers, experts, top_k, tokens, steps, &draws);
        let g = Geometry::new(layers, experts, hot, 1 << 20).unwrap();
        let link = if gb300 { LinkModel::gb300_c2c() } else { LinkModel::h200_pcie() };
        let opts = ReplayOptions {
            window_steps: 1,
            per_step_bytes: true,
            link,
            ..ReplayOptions::default()
        };
        let cfg = ControllerConfig::default();
        let opt = replay_with(&t, &g, &PolicySpec::OfflineOptimum, &cfg, &opts).unwrap();
        prop_assert_eq!(opt.boot.as_str(), "optimal");
        // Its copies are its swaps, priced like every row's.
        prop_assert_eq!(opt.bytes.swap_copies, opt.swaps.applied);
        let tol = 1e-9 * stall(&opt).max(1.0);
        let mut stalls = Vec::new();
        for spec in specs() {
            let r = replay_with(&t, &g, &spec, &cfg, &opts).unwrap();
            prop_assert!(
                stall(&r) >= stall(&opt) - tol,
                "{:?}: stall {} µs < optimum {} µs", spec, stall(&r), stall(&opt)
            );
            stalls.push(stall(&r));
        }
        // static (first-K) ≥ best static ≤ static by picks.
        prop_assert!(stalls[1] <= stalls[0] + tol && stalls[1] <= stalls[2] + tol, "{stalls:?}");
    }
}

/// The optimum prefetches in hindsight and is the last row of the scoreboard; every row's stall
/// over it is shown, and it needs a stall linear in copies.
#[test]
fn the_scoreboard_row_is_the_least_stall() {
    // 1 layer × 4 experts, 1 hot: expert 0 for three steps, then expert 1 for four.
    let steps = [0u32, 0, 0, 1, 1, 1, 1]
        .iter()
        .map(|&e| StepPicks {
            layers: vec![vec![e, e]],
        })
        .collect();
    let t = Trace {
        name: "o".into(),
        shape: TraceShape {
            layers: 1,
            experts_per_layer: 4,
            top_k: 1,
        },
        steps,
        shifts: vec![],
    };
    let g = Geometry::new(1, 4, 1, 1 << 20).unwrap();
    let opts = ReplayOptions {
        window_steps: 1,
        per_step_bytes: true,
        ..ReplayOptions::default()
    };
    let cfg = ControllerConfig::default();
    let o = replay_with(&t, &g, &PolicySpec::OfflineOptimum, &cfg, &opts).unwrap();
    // 1 MiB experts: a read 22.3 µs, a copy 45.3 µs. 0 hot from the start; 1 copied in during
    // step 2, serving steps 3..7: no read, one copy.
    assert_eq!(o.bytes.cold_unique_pairs, 0);
    assert_eq!(o.bytes.per_step[2].swap_copies, 1);
    assert_eq!(o.cold_share_overall, 0.0);
    let copy = opts.link.stall_us(0, 1, 1 << 20);
    assert!((o.bytes.stall_us - copy).abs() < 1e-9);
    let (seed, _) = scoreboard::default_seed_map(&t, &g).unwrap();
    let specs = scoreboard::policy_specs(&Policy::ALL, &t, &seed);
    assert_eq!(specs.last().unwrap().0, scoreboard::OPTIMUM_LABEL);
    let runs = scoreboard::run_policies(&t, &g, &cfg, &opts, &specs, &|_| {}).unwrap();
    let rows = scoreboard::summarize(&runs);
    let opt = rows.last().unwrap();
    assert_eq!(opt.label, scoreboard::OPTIMUM_LABEL);
    assert_eq!(opt.stall_vs_optimum, Some(1.0));
    for r in &rows {
        assert!(r.stall_ms_per_step >= opt.stall_ms_per_step, "{}", r.label);
        assert!(r.stall_vs_optimum.unwrap() >= 1.0, "{}", r.label);
    }
    let table = scoreboard::render(&rows);
    assert!(table.contains("offline optimum") && table.contains("stall vs optimum"));
    // hide_us > 0 makes the stall nonlinear in copies: the optimum is refused, by name.
    let hidden = ReplayOptions {
        link: LinkModel {
            hide_us: 5.0,
            ..LinkModel::h200_pcie()
        },
        ..opts
    };
    let e = replay_with(&t, &g, &PolicySpec::OfflineOptimum, &cfg, &hidden).unwrap_err();
    assert!(e.to_string().contains("hide_us"), "{e}");
}
