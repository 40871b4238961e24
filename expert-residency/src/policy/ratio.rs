//! The published GB300 recipe's policy: "EMA drain + ratio hysteresis".

use super::{
    keep_beatable, rank_cold, rank_hot, rank_least_hot, LayerHeat, SwapChoice, SwapPolicy,
};

/// The published policy, "EMA drain + ratio hysteresis" (the GB300 expert-residency recipe):
/// the busiest cold experts are paired with the least busy hot ones, busiest with least busy, and
/// a pair is a swap only if `cold ≥ ratio × hot`; the first pair that fails ends the list.
///
/// Ties: among equally busy cold experts the lower id comes first; among equally busy hot ones,
/// the lower id. A first short pass finds the least busy hot EMA, so only cold experts that can
/// pass the ratio are ranked at all: a steady-state drain does almost no work here.
#[derive(Clone, Debug)]
pub struct RatioPolicy {
    ratio: f64,
    cold: Vec<(f64, u32)>,
    hot: Vec<(f64, u32)>,
}

impl RatioPolicy {
    /// The ratio policy with hysteresis `ratio` (≥ 1, finite; the controller's config validates
    /// [`ControllerConfig::ratio`](crate::ControllerConfig::ratio)).
    ///
    /// Errors: [`ExpertError::InvalidConfig`](crate::ExpertError::InvalidConfig) for a ratio below 1 or not
    /// finite.
    pub fn new(ratio: f64) -> crate::Result<Self> {
        if !(ratio.is_finite() && ratio >= 1.0) {
            return Err(crate::ExpertError::InvalidConfig(format!(
                "ratio must be finite and ≥ 1, got {ratio}"
            )));
        }
        Ok(RatioPolicy {
            ratio,
            cold: Vec::new(),
            hot: Vec::new(),
        })
    }

    /// The hysteresis ratio.
    pub fn ratio(&self) -> f64 {
        self.ratio
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
        let mut p = RatioPolicy::new(1.5).unwrap();
        // Hot 0 (1.0), 1 (4.0); cold 2 (6.0), 3 (1.4), 4 (6.0).
        let heat = [1.0, 4.0, 6.0, 1.4, 6.0];
        let c = |incoming, outgoing| SwapChoice { incoming, outgoing };
        assert_eq!(plan(&mut p, &heat, &[0, 1], 4), vec![c(2, 0), c(4, 1)]);
        assert_eq!(plan(&mut p, &heat, &[0, 1], 1), vec![c(2, 0)]);
        // 1.4 < 1.5 × 1.0: a close call stays put.
        assert_eq!(plan(&mut p, &[1.0, 4.0, 0.0, 1.4, 0.0], &[0, 1], 4), vec![]);
        assert_eq!(plan(&mut p, &[0.0; 5], &[0, 1], 4), vec![]);
        assert!(RatioPolicy::new(0.9).is_err() && RatioPolicy::new(f64::NAN).is_err());
        assert_eq!((p.name(), p.ratio()), ("ratio", 1.5));
    }
}
