//! Properties of the engine modes' LRU bank: its eviction order is deterministic (the order of
//! picks within a step moves nothing), and a bank of all experts in copy-on-miss pays only the
//! first touch of each expert. The same of the default's copy-on-miss bank (`DuelBank`), which
//! also never holds more than its slots and copies every miss.

use std::collections::BTreeSet;

use expert_residency::{ControllerConfig, Geometry, ResidencyMap, StepPicks};
use proptest::prelude::*;
use tierkit_sim::experts::modes::{BankScope, CpuChannel, DuelBank, EngineMode, LruBank, StepCost};
use tierkit_sim::experts::LinkModel;

/// Steps of `layers` layers, each layer 0–6 picks of ids below `experts`.
fn steps(layers: usize, experts: u32) -> impl Strategy<Value = Vec<Vec<Vec<u32>>>> {
    prop::collection::vec(
        prop::collection::vec(prop::collection::vec(0..experts, 0..=6), layers),
        1..40,
    )
}

/// `raw` cut to `layers` layers, ids taken modulo `experts`.
fn fit(raw: &[Vec<Vec<u32>>], layers: usize, experts: u32) -> Vec<Vec<Vec<u32>>> {
    raw.iter()
        .map(|st| {
            st[..layers]
                .iter()
                .map(|l| l.iter().map(|&e| e % experts).collect())
                .collect()
        })
        .collect()
}

fn replay(
    g: &Geometry,
    scope: BankScope,
    mode: EngineMode,
    boot: Option<&ResidencyMap>,
    steps: &[Vec<Vec<u32>>],
) -> (Vec<StepCost>, Vec<bool>) {
    let mut b = LruBank::new(
        g,
        scope,
        mode,
        boot,
        &LinkModel::h200_pcie(),
        &CpuChannel::h200(),
    )
    .unwrap();
    let costs = steps.iter().map(|s| b.step(s)).collect();
    let resident = (0..g.layers as usize)
        .flat_map(|l| (0..g.experts_per_layer).map(move |e| (l, e)))
        .map(|(l, e)| b.is_resident(l, e))
        .collect();
    (costs, resident)
}

const SCOPES: [BankScope; 2] = [BankScope::PerLayer, BankScope::Shared];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Reversing and rotating the picks of every layer of every step changes no cost and no
    /// resident expert, in every mode and scope.
    #[test]
    fn lru_tie_break_is_deterministic(
        layers in 1usize..=3,
        experts in 2u32..=8,
        hot_frac in 0.0f64..1.0,
        raw in steps(3, 8),
        rot in 0usize..6,
    ) {
        let hot = 1 + ((experts - 1) as f64 * hot_frac) as u32;
        let g = Geometry::new(layers as u32, experts, hot, 1 << 20).unwrap();
        let s = fit(&raw, layers, experts);
        let shuffled: Vec<Vec<Vec<u32>>> = s
            .iter()
            .map(|st| {
                st.iter()
                    .map(|l| {
                        let mut l: Vec<u32> = l.iter().rev().copied().collect();
                        if !l.is_empty() {
                            let r = rot % l.len();
                            l.rotate_left(r);
                        }
                        l
                    })
                    .collect()
            })
            .collect();
        let boot = ResidencyMap::first_k("t", g).unwrap();
        for scope in SCOPES {
            for mode in EngineMode::ALL {
                let a = replay(&g, scope, mode, Some(&boot), &s);
                let b = replay(&g, scope, mode, Some(&boot), &shuffled);
                prop_assert_eq!(&a, &b, "{:?} {:?}", scope, mode);
            }
        }
    }

    /// Copy-on-miss with a bank of every expert: from empty, one copy per (layer, expert) ever
    /// touched, at its first touch; booted full (first-K of all experts), none.
    #[test]
    fn a_bank_of_all_experts_pays_only_first_touches(
        layers in 1usize..=3,
        experts in 1u32..=8,
        raw in steps(3, 8),
    ) {
        let g = Geometry::new(layers as u32, experts, experts, 1 << 20).unwrap();
        let s = fit(&raw, layers, experts);
        let full = ResidencyMap::first_k("t", g).unwrap();
        for scope in SCOPES {
            let (costs, _) = replay(&g, scope, EngineMode::CopyOnMiss, None, &s);
            let mut seen = BTreeSet::new();
            for (st, c) in s.iter().zip(&costs) {
                let first = st
                    .iter()
                    .enumerate()
                    .flat_map(|(l, p)| p.iter().map(move |&e| (l, e)))
                    .filter(|&x| seen.insert(x))
                    .count() as u64;
                prop_assert_eq!(c.serving_copies, first);
                prop_assert_eq!(c.boundary_copies + c.reads + c.cpu, 0);
            }
            let (costs, _) = replay(&g, scope, EngineMode::CopyOnMiss, Some(&full), &s);
            prop_assert!(costs.iter().all(|c| c.serving_copies == 0 && c.stall_us == 0.0));
        }
    }

    /// The default's copy-on-miss bank: pick order within a step moves nothing; every miss is
    /// one serving copy and nothing else; a layer never holds more than its slots; booted with
    /// every expert it never copies.
    #[test]
    fn duel_bank_is_deterministic_and_bounded(
        layers in 1usize..=3,
        experts in 2u32..=8,
        hot_frac in 0.0f64..1.0,
        raw in steps(3, 8),
    ) {
        let hot = 1 + ((experts - 1) as f64 * hot_frac) as u32;
        let g = Geometry::new(layers as u32, experts, hot, 1 << 20).unwrap();
        let s = fit(&raw, layers, experts);
        let rev: Vec<Vec<Vec<u32>>> = s
            .iter()
            .map(|st| st.iter().map(|l| l.iter().rev().copied().collect()).collect())
            .collect();
        let run = |g: &Geometry, steps: &[Vec<Vec<u32>>]| {
            let boot = ResidencyMap::first_k("t", *g).unwrap();
            let mut b =
                DuelBank::new(g, &boot, ControllerConfig::default(), &LinkModel::h200_pcie())
                    .unwrap();
            let mut out = Vec::new();
            for st in steps {
                let c = b.step(&StepPicks { layers: st.clone() }).unwrap();
                let held: Vec<usize> = (0..g.layers as usize)
                    .map(|l| (0..g.experts_per_layer).filter(|&e| b.is_resident(l, e)).count())
                    .collect();
                out.push((c, held));
            }
            out
        };
        let a = run(&g, &s);
        prop_assert_eq!(&a, &run(&g, &rev));
        for (c, held) in &a {
            prop_assert!(held.iter().all(|&h| h <= hot as usize));
            prop_assert_eq!(c.boundary_copies + c.reads + c.cpu, 0);
            prop_assert!(c.serving_copies <= c.miss_picks);
        }
        let full = Geometry::new(layers as u32, experts, experts, 1 << 20).unwrap();
        prop_assert!(run(&full, &s).iter().all(|(c, _)| c.serving_copies == 0 && c.stall_us == 0.0));
    }
}
