//! The published GB300 recipe's policy: "EMA drain + ratio hysteresis".

use super::{
    keep_beatable, rank_cold, rank_hot, rank_least_hot, LayerHeat, SwapChoice, SwapPolicy,
};
use crate::error::bad;
use crate::error::Result;

/// The ratio policy's config (`RatioPolicy`, `{"kind": "ratio", "ratio": 1.5}` in a controller
/// config's `policy`). A missing field takes its default; an unknown field is an error.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
#[serde(default, deny_unknown_fields)]
pub struct RatioConfig {
    /// A cold expert replaces a hot one only if its EMA is at least `ratio` times the hot one's
    /// (≥ 1, finite): hysteresis against churn. Default 1.5 (the published recipe's).
    pub ratio: f64,
}

named_fields!(RatioConfig, "a ratio policy config");

impl Default for RatioConfig {
    fn default() -> Self {
        RatioConfig { ratio: 1.5 }
    }
}

impl RatioConfig {
    /// Checks the ratio (the one check of the ratio policy's config: `RatioPolicy::new` runs
    /// it).
    ///
    /// Errors: [`crate::ExpertError::InvalidConfig`] for a ratio below 1 or not finite.
    pub fn validate(&self) -> Result<()> {
        if !(self.ratio.is_finite() && self.ratio >= 1.0) {
            return Err(bad(format!(
                "ratio must be finite and ≥ 1, got {}",
                self.ratio
            )));
        }
        Ok(())
    }
}

/// The published policy, "EMA drain + ratio hysteresis" (the GB300 expert-residency recipe):
/// the busiest cold experts are paired with the least busy hot ones, busiest with least busy, and
/// a pair is a swap only if `cold ≥ ratio × hot`; the first pair that fails ends the list.
///
/// Ties: among equally busy cold experts the lower id comes first; among equally busy hot ones,
/// the lower id. A first short pass finds the least busy hot EMA, so only cold experts that can
/// pass the ratio are ranked at all: a steady-state drain does almost no work here.
#[derive(Clone, Debug)]
pub(crate) struct RatioPolicy {
    ratio: f64,
    cold: Vec<(f64, u32)>,
    hot: Vec<(f64, u32)>,
}

impl RatioPolicy {
    /// The ratio policy with the hysteresis of `cfg`, validated here, once.
    ///
    /// Errors: [`crate::ExpertError::InvalidConfig`] for a ratio below 1 or not finite
    /// ([`RatioConfig::validate`]).
    pub fn new(cfg: RatioConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(RatioPolicy {
            ratio: cfg.ratio,
            cold: Vec::new(),
            hot: Vec::new(),
        })
    }
}

impl SwapPolicy for RatioPolicy {
    fn name(&self) -> &str {
        "ratio"
    }

    fn uses_touch(&self) -> bool {
        false
    }

    fn plan(&mut self, layer: &LayerHeat<'_>, out: &mut Vec<SwapChoice>) {
        let (vals, row) = (layer.heat, layer.row);
        let cap = layer.max_swaps as usize;
        self.cold.clear();
        self.hot.clear();
        if cap == 0 || vals.len() != row.table().len() {
            return;
        }
        // Only a cold expert at least `ratio` × the least busy hot one can swap in: find that
        // bound first (one short pass), so that in steady state the scans below insert nothing.
        // (The ratio is finite and ≥ 1, so "beatable" below is monotone in the heat and the same
        // pass ranks the least busy hot experts; see `rank_least_hot`.)
        let (hot_min, one_pass) = rank_least_hot(&mut self.hot, vals, row.hot_experts(), cap);
        // Heat ≤ 0 never swaps in (floor 0).
        rank_cold(
            &mut self.cold,
            vals,
            row.table(),
            self.ratio * hot_min,
            0.0,
            cap,
        );
        let Some(&(cold_max, _)) = self.cold.first() else {
            self.hot.clear();
            return;
        };
        let ratio = self.ratio;
        let beatable = |h: f64| h * ratio <= cold_max;
        if one_pass {
            keep_beatable(&mut self.hot, beatable);
        } else {
            self.hot.clear();
            rank_hot(&mut self.hot, vals, row.hot_experts(), cap, beatable);
        }
        for (&(cv, incoming), &(hv, outgoing)) in self.cold.iter().zip(&self.hot) {
            if cv < self.ratio * hv {
                break;
            }
            out.push(SwapChoice { incoming, outgoing });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(p: &mut RatioPolicy, heat: &[f64], hot: &[u32], cap: u32) -> Vec<SwapChoice> {
        let row = crate::RowMap::from_hot(heat.len() as u32, hot).unwrap();
        let mut out = Vec::new();
        let last = vec![0; heat.len()];
        p.plan(
            &LayerHeat {
                layer: 0,
                heat,
                touch: heat,
                last_touch: &last,
                step: 0,
                half_life_steps: 500.0,
                expert_bytes: 1 << 20,
                row: &row,
                max_swaps: cap,
                max_swaps_per_step: 8,
            },
            &mut out,
        );
        out
    }

    #[test]
    fn pairs_busiest_cold_with_least_busy_hot_under_the_ratio() {
        let mut p = RatioPolicy::new(RatioConfig::default()).unwrap();
        // Hot 0 (1.0), 1 (4.0); cold 2 (6.0), 3 (1.4), 4 (6.0).
        let heat = [1.0, 4.0, 6.0, 1.4, 6.0];
        let c = |incoming, outgoing| SwapChoice { incoming, outgoing };
        assert_eq!(plan(&mut p, &heat, &[0, 1], 4), vec![c(2, 0), c(4, 1)]);
        assert_eq!(plan(&mut p, &heat, &[0, 1], 1), vec![c(2, 0)]);
        // 1.4 < 1.5 × 1.0: a close call stays put.
        assert_eq!(plan(&mut p, &[1.0, 4.0, 0.0, 1.4, 0.0], &[0, 1], 4), vec![]);
        assert_eq!(plan(&mut p, &[0.0; 5], &[0, 1], 4), vec![]);
        let ratio = |ratio| RatioPolicy::new(RatioConfig { ratio });
        assert!(ratio(0.9).is_err() && ratio(f64::NAN).is_err());
        assert_eq!((p.name(), p.ratio), ("ratio", 1.5));
    }
}
