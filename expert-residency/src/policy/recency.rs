//! A capped recency policy: LRU on the drained touches, at most N swaps per step.

use super::{LayerHeat, SwapChoice, SwapPolicy};

/// The recency policy's config (`RecencyPolicy`, `{"kind": "recency"}` in a controller config's
/// `policy`). It has no knobs of its own: its cap N is the controller's
/// (`max_swaps_per_layer`, `max_swaps_per_step`); an unknown field is an error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
#[serde(deny_unknown_fields)]
pub struct RecencyConfig {}

named_fields!(RecencyConfig, "a recency policy config");

/// Capped LRU (after the classic least-recently-used cache; ARC's recency list without its
/// frequency list): at each drain the most recently touched cold experts replace the least
/// recently touched hot ones, as long as the incoming expert was touched more recently than the
/// outgoing one; ties in recency go to the busier expert ([`LayerHeat::touch`]), then the lower
/// id. At most [`LayerHeat::max_swaps`] per layer per drain, and the controller begins at most
/// `max_swaps_per_step` per step: that is the cap N that makes it usable on a real link, where
/// uncapped LRU (every miss admitted) copies an expert per miss.
///
/// Recency is [`LayerHeat::last_touch`], the step of the last drain whose interval touched the
/// expert, so its resolution is the drain cadence. For comparison, and for traffic where recency
/// wins (strong token-to-token reuse, weak skew); it ignores what a copy costs.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecencyPolicy {
    cold: Vec<(u64, f64, u32)>,
    hot: Vec<(u64, f64, u32)>,
}

impl RecencyPolicy {
    /// A capped recency policy (the cap is the controller's).
    pub fn new() -> Self {
        Self::default()
    }
}

/// `a` ranks before `b` among cold candidates: more recent, then busier, then lower id.
fn newer(a: &(u64, f64, u32), b: &(u64, f64, u32)) -> bool {
    (a.0, a.1) > (b.0, b.1) || (a.0 == b.0 && a.1 == b.1 && a.2 < b.2)
}

impl SwapPolicy for RecencyPolicy {
    fn name(&self) -> &str {
        "recency"
    }

    fn plan(&mut self, layer: &LayerHeat<'_>, out: &mut Vec<SwapChoice>) {
        let row = layer.row;
        let n = row.table().len();
        let cap = layer.max_swaps as usize;
        self.cold.clear();
        self.hot.clear();
        if cap == 0 || layer.last_touch.len() != n || layer.touch.len() != n {
            return;
        }
        let key = |e: usize| {
            let t = layer.touch[e];
            (
                layer.last_touch[e],
                if t.is_finite() { t } else { 0.0 },
                e as u32,
            )
        };
        let oldest_hot = row
            .hot_experts()
            .iter()
            .map(|&e| layer.last_touch[e as usize])
            .min()
            .unwrap_or(u64::MAX);
        // Cold experts touched after the oldest hot one, most recent first.
        for (e, &slot) in row.table().iter().enumerate() {
            if slot >= 0 || layer.last_touch[e] == 0 || layer.last_touch[e] <= oldest_hot {
                continue;
            }
            let x = key(e);
            if self.cold.len() == cap && !newer(&x, &self.cold[cap - 1]) {
                continue;
            }
            if self.cold.len() == cap {
                self.cold.pop();
            }
            let i = self
                .cold
                .iter()
                .position(|c| newer(&x, c))
                .unwrap_or(self.cold.len());
            self.cold.insert(i, x);
        }
        // Hot experts, least recent first.
        for &e in row.hot_experts() {
            let x = key(e as usize);
            if self.hot.len() == cap && !newer(&self.hot[cap - 1], &x) {
                continue;
            }
            if self.hot.len() == cap {
                self.hot.pop();
            }
            let i = self
                .hot
                .iter()
                .position(|h| newer(h, &x))
                .unwrap_or(self.hot.len());
            self.hot.insert(i, x);
        }
        for (c, h) in self.cold.iter().zip(&self.hot) {
            if c.0 <= h.0 {
                break;
            }
            out.push(SwapChoice {
                incoming: c.2,
                outgoing: h.2,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RowMap;

    #[test]
    fn most_recent_cold_replace_least_recent_hot() {
        let mut p = RecencyPolicy::new();
        let row = RowMap::from_hot(5, &[0, 1]).unwrap();
        let touch = [1.0, 1.0, 1.0, 2.0, 0.0];
        let last = [3, 9, 10, 10, 0];
        let mut out = Vec::new();
        let heat = LayerHeat {
            layer: 0,
            heat: &touch,
            touch: &touch,
            last_touch: &last,
            step: 10,
            half_life_steps: 8.0,
            expert_bytes: 1,
            row: &row,
            max_swaps: 4,
            max_swaps_per_step: 4,
        };
        p.plan(&heat, &mut out);
        let c = |incoming, outgoing| SwapChoice { incoming, outgoing };
        // 3 (step 10, busier) replaces 0 (step 3); 2 (step 10) replaces 1 (step 9).
        assert_eq!(out, vec![c(3, 0), c(2, 1)]);
        out.clear();
        p.plan(
            &LayerHeat {
                max_swaps: 1,
                ..heat
            },
            &mut out,
        );
        assert_eq!(out, vec![c(3, 0)]);
        out.clear();
        // Nothing newer than the hot set: no swap.
        let last = [10, 10, 9, 3, 0];
        p.plan(
            &LayerHeat {
                last_touch: &last,
                ..heat
            },
            &mut out,
        );
        assert!(out.is_empty());
        assert_eq!(p.name(), "recency");
    }
}
