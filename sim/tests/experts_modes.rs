//! Properties of the engine modes' LRU bank: its eviction order is deterministic (the order of
//! picks within a step moves nothing), and a bank of all experts in copy-on-miss pays only the
//! first touch of each expert.

use std::collections::BTreeSet;

use expert_residency::{Geometry, ResidencyMap};
use proptest::prelude::*;
use tierkit_sim::experts::modes::{BankScope, CpuChannel, EngineMode, LruBank, StepCost};
use tierkit_sim::experts::LinkModel;

/// Steps of `layers` layers, each layer 0–6 picks of ids below `experts`.
fn steps(layers: usize, experts: u32) -> impl Strategy<Value = Vec<Vec<Vec<u32>>>> {
    prop::collection::vec(
        prop::collection::vec(prop::collection::vec(0..experts, 0..=6), layers),
        1..40,
    )
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
        let s: Vec<Vec<Vec<u32>>> = raw
            .iter()
            .map(|st| st[..layers].iter().map(|l| l.iter().map(|&e| e % experts).collect()).collect())
            .collect();
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
        let s: Vec<Vec<Vec<u32>>> = raw
            .iter()
            .map(|st| st[..layers].iter().map(|l| l.iter().map(|&e| e % experts).collect()).collect())
            .collect();
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
}
