//! Test-only reference versions of the ranking functions and of the cost-aware and ratio
//! policies, written the straightforward way (a plain insertion sort in a `Vec`, the least busy hot
//! experts in a second pass, `hot_min` by a fold): what the tuned code in `mod.rs`, `cost.rs` and
//! `ratio.rs` must decide entry for entry. A test drives a controller with each on the same
//! random traffic and compares every step's report.

use super::{LayerHeat, SwapChoice, SwapPolicy};
use crate::config::ShiftResponse;
use crate::{Controller, ControllerConfig, Geometry, NullExecutor, PickCounters, ResidencyMap};
use crate::{CostConfig, PolicyConfig, RatioConfig, StepPicks};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The busiest cold experts with heat ≥ `needed` and > `floor`, descending (ties: lower id
/// first), at most `cap`, appended to `out` (empty): `rank_cold`'s contract.
pub(super) fn rank_cold_ref(
    out: &mut Vec<(f64, u32)>,
    vals: &[f64],
    table: &[i32],
    needed: f64,
    mut floor: f64,
    cap: usize,
) {
    for (e, (&v, &slot)) in vals.iter().zip(table).enumerate() {
        if slot >= 0 || v <= floor || v < needed {
            continue;
        }
        let mut i = if out.len() < cap {
            out.push((v, e as u32));
            out.len() - 1
        } else {
            out[cap - 1] = (v, e as u32);
            cap - 1
        };
        while i > 0 && out[i - 1].0 < out[i].0 {
            out.swap(i - 1, i);
            i -= 1;
        }
        if out.len() == cap {
            floor = out[cap - 1].0;
        }
    }
}

/// The least busy hot experts `beatable` accepts, ascending by (heat, id), at most `cap`,
/// appended to `out` (empty): `rank_hot`'s contract.
pub(super) fn rank_hot_ref(
    out: &mut Vec<(f64, u32)>,
    vals: &[f64],
    hot_experts: &[u32],
    cap: usize,
    beatable: impl Fn(f64) -> bool,
) {
    for &e in hot_experts {
        let x = (vals[e as usize], e);
        if !beatable(x.0) {
            continue;
        }
        let mut i = if out.len() < cap {
            out.push(x);
            out.len() - 1
        } else if x < out[cap - 1] {
            out[cap - 1] = x;
            cap - 1
        } else {
            continue;
        };
        while i > 0 && out[i] < out[i - 1] {
            out.swap(i - 1, i);
            i -= 1;
        }
    }
}

/// The least hot heat of the layer, NaN left out (+∞ if none).
fn hot_min(vals: &[f64], hot: &[u32]) -> f64 {
    hot.iter()
        .map(|&e| vals[e as usize])
        .fold(f64::INFINITY, f64::min)
}

/// [`crate::CostPolicy`]'s rule, plainly.
#[derive(Debug)]
struct RefCost(CostConfig);

impl SwapPolicy for RefCost {
    fn name(&self) -> &str {
        "cost-ref"
    }

    fn plan(&mut self, layer: &LayerHeat<'_>, out: &mut Vec<SwapChoice>) {
        let (vals, row) = (layer.touch, layer.row);
        let cap = layer.max_swaps as usize;
        if cap == 0 || vals.len() != row.table().len() || !layer.half_life_steps.is_finite() {
            return;
        }
        let f = (-1.0 / layer.half_life_steps.max(1e-9)).exp2();
        let var = |t: f64| {
            let tau = (t * (1.0 - f)).clamp(0.0, 1.0);
            tau * (1.0 - tau) * (1.0 / (1.0 - f * f).max(1e-12))
        };
        let price = self.0.payback * self.0.link.copy_in_reads(layer.expert_bytes);
        let m = hot_min(vals, row.hot_experts());
        if !m.is_finite() {
            return;
        }
        let (mut cold, mut hot) = (Vec::new(), Vec::new());
        rank_cold_ref(
            &mut cold,
            vals,
            row.table(),
            m + price,
            f64::NEG_INFINITY,
            cap,
        );
        let Some(&(cold_max, _)) = cold.first() else {
            return;
        };
        rank_hot_ref(&mut hot, vals, row.hot_experts(), cap, |h| {
            h + price <= cold_max
        });
        for (&(cv, incoming), &(hv, outgoing)) in cold.iter().zip(&hot) {
            if cv - hv < price + self.0.z * (var(cv) + var(hv)).sqrt() {
                break;
            }
            out.push(SwapChoice { incoming, outgoing });
        }
    }
}

/// [`crate::RatioPolicy`]'s rule, plainly.
#[derive(Debug)]
struct RefRatio(f64);

impl SwapPolicy for RefRatio {
    fn name(&self) -> &str {
        "ratio-ref"
    }

    fn uses_touch(&self) -> bool {
        false
    }

    fn plan(&mut self, layer: &LayerHeat<'_>, out: &mut Vec<SwapChoice>) {
        let (vals, row) = (layer.heat, layer.row);
        let cap = layer.max_swaps as usize;
        if cap == 0 || vals.len() != row.table().len() {
            return;
        }
        let m = hot_min(vals, row.hot_experts());
        let (mut cold, mut hot) = (Vec::new(), Vec::new());
        rank_cold_ref(&mut cold, vals, row.table(), self.0 * m, 0.0, cap);
        let Some(&(cold_max, _)) = cold.first() else {
            return;
        };
        let ratio = self.0;
        rank_hot_ref(&mut hot, vals, row.hot_experts(), cap, |h| {
            h * ratio <= cold_max
        });
        for (&(cv, incoming), &(hv, outgoing)) in cold.iter().zip(&hot) {
            if cv < ratio * hv {
                break;
            }
            out.push(SwapChoice { incoming, outgoing });
        }
    }
}

/// One random step's picks: `tokens` tokens × top-`k` over a popularity that drifts with `t`
/// (a Zipf-like rank rotated by `t / 150`, turned over at step 1,500), now and then a prefill
/// burst of 200 tokens.
fn random_step(rng: &mut ChaCha8Rng, g: &Geometry, t: usize, tokens: usize, k: usize) -> StepPicks {
    let e = g.experts_per_layer as usize;
    let burst = rng.random_range(0..400) == 0;
    let tokens = if burst { 200 } else { tokens };
    let layers = (0..g.layers as usize)
        .map(|l| {
            // A slow drift, and a domain shift (half the ranking turned over) at step 1,500.
            let shift = t / 150 + l * 7 + if t >= 1500 { e / 2 } else { 0 };
            let mut ids = Vec::with_capacity(tokens * k);
            for _ in 0..tokens {
                let mut picked = Vec::with_capacity(k);
                while picked.len() < k {
                    // Rank r with weight ~ 1 / (r + 1): an exponent of a uniform draw.
                    let u: f64 = rng.random_range(0.0..1.0);
                    let r = ((e as f64 + 1.0).powf(u) - 1.0) as usize % e;
                    let x = ((r + shift) % e) as u32;
                    if !picked.contains(&x) {
                        picked.push(x);
                    }
                }
                ids.extend(picked);
            }
            ids
        })
        .collect();
    StepPicks { layers }
}

/// Runs `steps` random steps through a controller with `cfg`'s own policy and one with `reference`
/// (same config otherwise), asserting the same report (bit for bit, through `Debug`) and map at
/// every step; returns the swaps applied and the largest per-layer cap a drain ran under.
fn same_decisions(cfg: ControllerConfig, reference: Box<dyn SwapPolicy>, seed: u64) -> (u64, u32) {
    // 45 experts: not a multiple of the ranking's chunk of 8, so its tail is exercised too.
    let g = Geometry::new(3, 45, 11, 1 << 20).unwrap();
    let map = ResidencyMap::first_k("t", g).unwrap();
    let mut fast = Controller::new(map.clone(), cfg.clone()).unwrap();
    let mut plain = Controller::with_policy(map, cfg, reference).unwrap();
    let (cf, cp) = (
        PickCounters::new(&g).unwrap(),
        PickCounters::new(&g).unwrap(),
    );
    let (mut xf, mut xp) = (NullExecutor::new(), NullExecutor::new());
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut applied, mut top_cap) = (0, 0);
    for t in 0..3000 {
        // Batch and top-k change every 500 steps: batch 1 to 48, top-1 to top-8.
        let tokens = [1, 4, 48, 1, 16, 2][t / 500 % 6];
        let k = [2, 8, 1, 4, 6, 3][t / 500 % 6];
        let picks = random_step(&mut rng, &g, t, tokens, k);
        cf.record_step(&picks).unwrap();
        cp.record_step(&picks).unwrap();
        let (a, b) = (
            fast.step(&cf, &mut xf).unwrap(),
            plain.step(&cp, &mut xp).unwrap(),
        );
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "step {t}, seed {seed}");
        assert_eq!(fast.queued(), plain.queued(), "step {t}, seed {seed}");
        assert_eq!(fast.map().hot_sets(), plain.map().hot_sets(), "step {t}");
        applied += a.applied as u64;
        top_cap = top_cap.max(a.drain.map_or(0, |d| d.max_swaps_per_layer));
    }
    (applied, top_cap)
}

#[test]
fn tuned_policies_decide_as_the_plain_ones_on_random_traffic() {
    for seed in 0..3 {
        // The default (cost-aware, adaptive cadence, shift response), with per-layer caps 1, 2
        // (the lists in registers) and 3 (in the buffer).
        for cap in [1, 2, 3] {
            let cfg = ControllerConfig {
                max_swaps_per_layer: cap,
                ..ControllerConfig::default()
            };
            let PolicyConfig::Cost(c) = cfg.policy.clone() else {
                panic!("the default policy is the cost-aware one");
            };
            let (applied, _) = same_decisions(cfg, Box::new(RefCost(c)), seed);
            assert!(
                applied > 0,
                "cost, cap {cap}, seed {seed}: the traffic must swap"
            );
        }
        // The published ratio recipe, and the cost policy on a fixed cadence with the boost
        // (cap 8 while boosted).
        let recipe = ControllerConfig::published_recipe();
        let PolicyConfig::Ratio(RatioConfig { ratio }) = recipe.policy.clone() else {
            panic!("the published recipe is the ratio policy");
        };
        assert!(same_decisions(recipe, Box::new(RefRatio(ratio)), seed).0 > 0);
        let fixed = ControllerConfig {
            adaptive: None,
            drain_every: 16,
            shift_response: Some(ShiftResponse::default()),
            ..ControllerConfig::default()
        };
        let (applied, top_cap) =
            same_decisions(fixed, Box::new(RefCost(CostConfig::default())), seed);
        assert!(applied > 0);
        assert_eq!(
            top_cap, 8,
            "seed {seed}: the shift response's boost must run"
        );
    }
}
