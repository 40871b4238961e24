//! The cost-aware policy (tierkit's default): a swap must pay for its copy in host bytes saved.

use super::{
    keep_beatable, rank_cold, rank_hot, rank_least_hot, LayerHeat, SwapChoice, SwapPolicy,
};
use crate::error::bad;
use crate::error::Result;
use crate::link::LinkCost;

/// The cost-aware policy's config (`CostPolicy`, `{"kind": "cost", ...}` in a controller
/// config's `policy`): its margins and the link prices it prices swaps with. Missing fields take
/// their defaults; an unknown field is an error.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
#[serde(default, deny_unknown_fields)]
pub struct CostConfig {
    /// A swap must save at least `payback ×` its copy cost (≥ 1, finite): a margin for the
    /// future not repeating the past. Default 1.5.
    pub payback: f64,
    /// Sampling-noise margin in standard deviations of the touched-step heat difference (≥ 0,
    /// finite): a swap must also clear `z · √(var_in + var_out)` touched steps. Default 1
    /// (picked on the Mixtral decode traces: z 0 churns, z 2 is slow; `docs/experts.md`).
    pub z: f64,
    /// What the host link charges for an in-place read and for a swap copy. Default
    /// [`LinkCost::h200_pcie`].
    pub link: LinkCost,
}

named_fields!(CostConfig, "a cost policy config");

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            payback: 1.5,
            z: 1.0,
            link: LinkCost::h200_pcie(),
        }
    }
}

impl CostConfig {
    /// Checks every field (the one check of the cost-aware policy's config: `CostPolicy::new`
    /// runs it).
    ///
    /// Errors: [`crate::ExpertError::InvalidConfig`] naming the field (`cost.payback`,
    /// `cost.z`, `link.*`).
    pub fn validate(&self) -> Result<()> {
        if !(self.payback.is_finite() && self.payback >= 1.0) {
            return Err(bad(format!(
                "cost.payback must be finite and ≥ 1, got {}",
                self.payback
            )));
        }
        if !(self.z.is_finite() && self.z >= 0.0) {
            return Err(bad(format!(
                "cost.z must be finite and ≥ 0, got {}",
                self.z
            )));
        }
        self.link.validate()
    }
}

/// Swaps a cold expert in when the host reads it is expected to save over its expected residency
/// exceed what its copy costs on the link (tierkit's default policy; the idea is the published
/// GB300 recipe's remark that a swap pays only when the same expert is then used again, many
/// times, made into the decision rule).
///
/// **Heat in touched steps.** A grouped GEMM reads a cold expert in place once per step however
/// many tokens picked it, so the policy ranks experts by [`LayerHeat::touch`]: the EMA of the
/// steps in which each expert was picked at all. The controller estimates them from each drain's
/// pick deltas, which works the same for host counters and GPU-drained snapshots: over an
/// interval of `n` steps an expert with `d` picks has `λ = d / n` picks per step; with `T` tokens
/// per step (each token picks an expert at most once: estimated as `max(1, max_e λ_e)`, exact at
/// batch 1), its probability of being touched in a step is `τ = 1 − (1 − λ/T)^T` (= `λ` at
/// batch 1, → `1 − e^{−λ}` at large batches), and `n·τ` touched steps are folded into the EMA.
///
/// **Benefit and cost.** With half-life `H` steps the EMA's decay per step is `f = 2^{−1/H}`,
/// an expert touched at rate `ρ` per step has heat `t ≈ ρ / (1 − f)`, and the heat's memory,
/// `1 / (1 − f) ≈ H / ln 2` steps, is taken as the expected residency `R` of a swapped-in expert.
/// The host reads saved by swapping `incoming` for `outgoing` over `R` are then `(ρ_in − ρ_out) ×
/// R = t_in − t_out` reads of `expert_bytes`, and the copy costs `copy_us / read_us` reads
/// (`LinkCost::copy_in_reads`: 0.86 on the H200 PCIe link). A pair is a swap iff
///
/// `t_in − t_out ≥ payback × copy_us / read_us + z × √(v_in + v_out)`,
///
/// where `v = τ(1 − τ) / (1 − f²)` is the variance of an EMA of Bernoulli(τ) touches (τ estimated
/// as `t (1 − f)`, clamped to `[0, 1]`): the sampling-noise margin. On a batched decode where most
/// experts are touched every step the heat differences stay small and the policy rarely swaps;
/// at batch 1 a clearly busier expert pays for itself within a few half-lives.
///
/// Pairs are formed as in `RatioPolicy`: the busiest cold experts with the least busy
/// hot ones, busiest with least busy, stopping at the first pair that does not pay, at most
/// [`LayerHeat::max_swaps`]. A first short pass finds the least busy hot heat, so only cold
/// experts that can pay are ranked at all.
#[derive(Clone, Debug)]
pub(crate) struct CostPolicy {
    cfg: CostConfig,
    cold: Vec<(f64, u32)>,
    hot: Vec<(f64, u32)>,
}

impl CostPolicy {
    /// The cost-aware policy with `cfg` (its margins and link prices), validated here, once.
    ///
    /// Errors: [`crate::ExpertError::InvalidConfig`] for a field out of range
    /// ([`CostConfig::validate`]).
    pub fn new(cfg: CostConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(CostPolicy {
            cfg,
            cold: Vec::new(),
            hot: Vec::new(),
        })
    }
}

/// Variance of an EMA (decay `f` per step) of Bernoulli touches whose heat is `t`.
fn heat_var(t: f64, one_minus_f: f64, inv_var_den: f64) -> f64 {
    let tau = (t * one_minus_f).clamp(0.0, 1.0);
    tau * (1.0 - tau) * inv_var_den
}

impl SwapPolicy for CostPolicy {
    fn name(&self) -> &str {
        "cost"
    }

    fn plan(&mut self, layer: &LayerHeat<'_>, out: &mut Vec<SwapChoice>) {
        let (vals, row) = (layer.touch, layer.row);
        let cap = layer.max_swaps as usize;
        self.cold.clear();
        self.hot.clear();
        if cap == 0 || vals.len() != row.table().len() || !layer.half_life_steps.is_finite() {
            return;
        }
        let f = (-1.0 / layer.half_life_steps.max(1e-9)).exp2();
        let one_minus_f = 1.0 - f;
        let inv_var_den = 1.0 / (1.0 - f * f).max(1e-12);
        let price = self.cfg.payback * self.cfg.link.copy_in_reads(layer.expert_bytes);
        let z = self.cfg.z;
        // Only a cold expert at least `price` touched steps hotter than the least busy hot one
        // can pay: find that bound first (one short pass over the hot set, which also ranks the
        // least busy hot experts when the "beatable" test below is monotone in the heat).
        let (hot_min, one_pass) = if price.is_finite() {
            rank_least_hot(&mut self.hot, vals, row.hot_experts(), cap)
        } else {
            let m = row
                .hot_experts()
                .iter()
                .map(|&e| vals[e as usize])
                .fold(f64::INFINITY, f64::min);
            (m, false)
        };
        if !hot_min.is_finite() {
            self.hot.clear();
            return;
        }
        let needed = hot_min + price;
        rank_cold(
            &mut self.cold,
            vals,
            row.table(),
            needed,
            f64::NEG_INFINITY,
            cap,
        );
        let Some(&(cold_max, _)) = self.cold.first() else {
            self.hot.clear();
            return;
        };
        // The least busy hot experts that the busiest cold one can beat.
        let beatable = |h: f64| h + price <= cold_max;
        if one_pass {
            keep_beatable(&mut self.hot, beatable);
        } else {
            self.hot.clear();
            rank_hot(&mut self.hot, vals, row.hot_experts(), cap, beatable);
        }
        for (&(cv, incoming), &(hv, outgoing)) in self.cold.iter().zip(&self.hot) {
            let noise = z
                * (heat_var(cv, one_minus_f, inv_var_den) + heat_var(hv, one_minus_f, inv_var_den))
                    .sqrt();
            if cv - hv < price + noise {
                break;
            }
            out.push(SwapChoice { incoming, outgoing });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RowMap;

    fn plan(p: &mut CostPolicy, touch: &[f64], hot: &[u32], hl: f64, bytes: u64) -> Vec<u32> {
        let row = RowMap::from_hot(touch.len() as u32, hot).unwrap();
        let last = vec![0; touch.len()];
        let mut out = Vec::new();
        p.plan(
            &LayerHeat {
                layer: 0,
                heat: touch,
                touch,
                last_touch: &last,
                step: 100,
                half_life_steps: hl,
                expert_bytes: bytes,
                row: &row,
                max_swaps: 4,
                max_swaps_per_step: 8,
            },
            &mut out,
        );
        out.iter().map(|c| c.incoming * 100 + c.outgoing).collect()
    }

    #[test]
    fn swaps_only_what_pays_for_its_copy() {
        let cost = |payback: f64, z: f64| CostConfig {
            payback,
            z,
            link: LinkCost::h200_pcie(),
        };
        let mut p = CostPolicy::new(cost(1.0, 0.0)).unwrap();
        let mb = 352_321_536; // a Mixtral expert: a copy costs 0.86 reads on PCIe
                              // Hot 0 (1.0), 1 (5.0); cold 2 (2.0: +1.0 over expert 0, pays), 3 (1.5: +0.5, does not).
        assert_eq!(
            plan(&mut p, &[1.0, 5.0, 2.0, 1.5], &[0, 1], 16.0, mb),
            vec![200]
        );
        assert_eq!(
            plan(&mut p, &[1.0, 5.0, 1.5, 1.5], &[0, 1], 16.0, mb),
            Vec::<u32>::new()
        );
        // A payback margin of 2 needs 1.72 touched steps more.
        let mut p2 = CostPolicy::new(cost(2.0, 0.0)).unwrap();
        assert_eq!(
            plan(&mut p2, &[1.0, 5.0, 2.0, 1.5], &[0, 1], 16.0, mb),
            Vec::<u32>::new()
        );
        assert_eq!(
            plan(&mut p2, &[1.0, 5.0, 3.0, 9.0], &[0, 1], 16.0, mb),
            vec![300]
        );
        // The noise margin stops swaps between experts whose heat differs by sampling noise.
        let mut pz = CostPolicy::new(cost(1.0, 4.0)).unwrap();
        assert_eq!(
            plan(&mut pz, &[4.0, 9.0, 6.0, 0.0], &[0, 1], 16.0, mb),
            Vec::<u32>::new()
        );
        assert_eq!(
            plan(&mut pz, &[0.0, 9.0, 12.0, 0.0], &[0, 1], 16.0, mb),
            vec![200]
        );
        // Nothing on all-zero or non-finite heat; bad knobs are typed errors.
        assert_eq!(
            plan(&mut p, &[0.0; 4], &[0, 1], 16.0, mb),
            Vec::<u32>::new()
        );
        assert_eq!(
            plan(&mut p, &[1.0, 5.0, 2.0, 1.5], &[0, 1], f64::NAN, mb),
            Vec::<u32>::new()
        );
        assert!(CostPolicy::new(cost(0.5, 0.0)).is_err());
        let bad = LinkCost {
            read_gbps: 0.0,
            ..LinkCost::h200_pcie()
        };
        assert!(CostPolicy::new(CostConfig {
            link: bad,
            ..CostConfig::default()
        })
        .is_err());
        assert_eq!(p.name(), "cost");
    }
}
