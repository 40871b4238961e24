//! A lower bound on every policy's host reads and stall, from the trace and the hot-slot count
//! alone: the scoreboard's `bound (any policy ≥)` row.
//!
//! **The model it holds in** (the scoreboard's, [`crate::experts::replay_with`]):
//! 1. every layer has exactly `H` = `hot_per_layer` hot slots, not shared between layers;
//! 2. a step's lookups are served by the map in force at the step's start: a copy lands at a step
//!    boundary and never serves the step during which it runs;
//! 3. a cold expert picked in a step is read in place once in that step (a grouped GEMM), costing
//!    `expert_bytes / read_gbps`;
//! 4. swap copies never lower a step's stall: under [`CopyMode::SharesLink`] (H200 PCIe) they add
//!    `max(0, copy_us − hide_us) + copies × copy_fixed_us ≥ 0`, under [`CopyMode::StopsStep`]
//!    (GB300 C2C) `copy_us ≥ 0`.
//!
//! Then in a step where `d` distinct experts of a layer are picked, at most `H` of them are hot,
//! so every map reads at least `max(0, d − H)` of them in place, and its cold lookups are at least
//! the picks of the `max(0, d − H)` least picked of them. Summed over layers, that is the step's
//! bound; its stall is [`LinkModel::stall_us`] of those reads with no copy, which by (4) is at
//! most any policy's stall of the step, copies or not, under either preset (the GB300 preset only
//! makes reads cheaper and copies dearer; the bound charges no copy, so it holds there too).
//!
//! What it ignores: copies (it is loose wherever swapping pays: at batch 1 with `d ≤ H` it is 0)
//! and anything outside the model, e.g. an engine that copies a cold expert into a spare slot and
//! computes from HBM within the same step (on PCIe a copy, 55 GB/s, is faster than an in-place
//! read, 47 GB/s).
//!
//! [`CopyMode::SharesLink`]: crate::experts::CopyMode::SharesLink
//! [`CopyMode::StopsStep`]: crate::experts::CopyMode::StopsStep
//! [`LinkModel::stall_us`]: crate::experts::LinkModel::stall_us

/// Per-step lower bound of cold lookups and distinct cold `(layer, expert)` pairs for maps with
/// `hot` slots per layer (see the module docs). Scratch sized once; no clearing between steps.
#[derive(Debug)]
pub(crate) struct LowerBound {
    hot: usize,
    /// Picks per expert in the current layer of the current step.
    picks: Vec<u64>,
    /// The experts picked in the current layer (each once).
    touched: Vec<u32>,
    /// Their pick counts, sorted (scratch).
    counts: Vec<u64>,
}

impl LowerBound {
    pub(crate) fn new(experts: u32, hot: u32) -> Self {
        LowerBound {
            hot: hot as usize,
            picks: vec![0; experts as usize],
            touched: Vec::new(),
            counts: Vec::new(),
        }
    }

    /// `(cold lookups, distinct cold pairs)` that every map with `hot` slots per layer has at
    /// least in a step with these picks per layer (ids checked by `validate_trace`).
    pub(crate) fn step(&mut self, layers: &[Vec<u32>]) -> (u64, u64) {
        let (mut lookups, mut unique) = (0u64, 0u64);
        for picks in layers {
            self.touched.clear();
            for &e in picks {
                let c = &mut self.picks[e as usize];
                if *c == 0 {
                    self.touched.push(e);
                }
                *c += 1;
            }
            let d = self.touched.len();
            if d > self.hot {
                let must = d - self.hot;
                self.counts.clear();
                self.counts
                    .extend(self.touched.iter().map(|&e| self.picks[e as usize]));
                self.counts.select_nth_unstable(must - 1);
                lookups += self.counts[..must].iter().sum::<u64>();
                unique += must as u64;
            }
            for &e in &self.touched {
                self.picks[e as usize] = 0;
            }
        }
        (lookups, unique)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_no_map_can_keep_hot() {
        let mut b = LowerBound::new(8, 2);
        // Layer 0: experts 0 (3 picks), 1 (1), 2 (2), 3 (1): 4 touched, 2 hot at most: the two
        // least picked (1 + 1) are cold whatever the map. Layer 1: 2 touched, nothing forced.
        let step = vec![vec![0, 0, 0, 1, 2, 2, 3], vec![5, 6, 5]];
        assert_eq!(b.step(&step), (2, 2));
        // Scratch is reset between steps.
        assert_eq!(b.step(&[vec![7], vec![]]), (0, 0));
        assert_eq!(b.step(&step), (2, 2));
        let mut none = LowerBound::new(8, 0);
        assert_eq!(none.step(&step), (10, 6));
    }
}
