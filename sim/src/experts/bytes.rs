//! The byte-true scoreboard: what a replayed policy puts on the host link, per step.
//!
//! Per step, with the map in force at the step's start:
//! - **host read bytes** = unique cold `(layer, expert)` pairs picked in the step × `expert_bytes`
//!   (a grouped GEMM reads a cold expert in place once per step however many tokens picked it);
//! - **swap bytes** = swap copies × `expert_bytes`, a copy being a net change of a layer's hot
//!   set at the step's end boundary (adaptive: the swaps the executor committed there, from
//!   [`expert_residency::StepReport::applied`]; LRU: the experts hot after the step's admissions
//!   that were not hot before it, so an expert admitted and evicted within one step costs none);
//! - **stall** = [`LinkModel::stall_us`] of the two.

use crate::experts::link::LinkModel;

/// One step's bytes on the link.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepBytes {
    /// Distinct cold `(layer, expert)` pairs picked in the step.
    pub cold_unique_pairs: u64,
    /// Bytes read in place from host memory on the critical path (`cold_unique_pairs ×
    /// expert_bytes`).
    pub host_read_bytes: u64,
    /// Swap copies whose bytes moved for this step's end boundary (net hot-set changes).
    pub swap_copies: u64,
    /// Bytes copied host → HBM by those swaps (`swap_copies × expert_bytes`).
    pub swap_bytes: u64,
    /// Modelled stall of the step under the replay's link, µs.
    pub stall_us: f64,
}

/// Bytes on the host link over a replay (see the module docs); serde, deterministic.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ByteReport {
    /// The link the stall was modelled with.
    pub link: LinkModel,
    /// Bytes of one expert (the geometry's).
    pub expert_bytes: u64,
    /// Distinct cold `(layer, expert)` pairs, summed over steps.
    pub cold_unique_pairs: u64,
    /// Bytes read in place from host memory, all steps (saturating).
    pub host_read_bytes: u64,
    /// Swap copies (net hot-set changes), all steps.
    pub swap_copies: u64,
    /// Bytes copied host → HBM by swaps, all steps (saturating).
    pub swap_bytes: u64,
    /// `host_read_bytes + swap_bytes` (saturating).
    pub total_bytes: u64,
    /// Modelled stall, all steps, µs.
    pub stall_us: f64,
    /// `stall_us / steps`, µs.
    pub mean_stall_us_per_step: f64,
    /// Mean host read + swap bytes per step over the steady-state tail
    /// ([`crate::experts::SteadyState`]'s steps).
    pub steady_bytes_per_step: f64,
    /// Mean modelled stall per step over the steady-state tail, µs.
    pub steady_stall_us_per_step: f64,
    /// Host read bytes per bucket of `window_steps` steps.
    pub host_read_bytes_windows: Vec<u64>,
    /// Swap bytes per bucket of `window_steps` steps.
    pub swap_bytes_windows: Vec<u64>,
    /// Modelled stall per bucket of `window_steps` steps (sum over its steps), µs.
    pub stall_us_windows: Vec<f64>,
    /// Every step's bytes, if [`crate::experts::ReplayOptions::per_step_bytes`] asked for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_step: Vec<StepBytes>,
}

/// Counts distinct cold experts per layer in a step (an epoch-stamped scratch row, no clearing).
#[derive(Debug)]
pub(crate) struct UniqueCold {
    seen: Vec<u64>,
    epoch: u64,
}

impl UniqueCold {
    pub(crate) fn new(experts: u32) -> Self {
        UniqueCold {
            seen: vec![0; experts as usize],
            epoch: 0,
        }
    }

    /// `(cold lookups, distinct cold experts)` of one step, `is_cold(layer, expert)` telling
    /// which are cold (ids are checked by `validate_trace` before any replay).
    pub(crate) fn count(
        &mut self,
        layers: &[Vec<u32>],
        is_cold: impl Fn(usize, usize) -> bool,
    ) -> (u64, u64) {
        let (mut lookups, mut unique) = (0u64, 0u64);
        for (l, picks) in layers.iter().enumerate() {
            self.epoch += 1;
            for &e in picks {
                let e = e as usize;
                if is_cold(l, e) {
                    lookups += 1;
                    if self.seen[e] != self.epoch {
                        self.seen[e] = self.epoch;
                        unique += 1;
                    }
                }
            }
        }
        (lookups, unique)
    }
}

/// Accumulates [`StepBytes`] step by step and folds them into a [`ByteReport`].
#[derive(Debug)]
pub(crate) struct ByteTally {
    link: LinkModel,
    expert_bytes: u64,
    steps: Vec<StepBytes>,
}

impl ByteTally {
    pub(crate) fn new(link: &LinkModel, expert_bytes: u64, steps: usize) -> Self {
        ByteTally {
            link: link.clone(),
            expert_bytes,
            steps: Vec::with_capacity(steps),
        }
    }

    /// Records one step: its distinct cold pairs and the swap copies of its end boundary.
    pub(crate) fn push(&mut self, cold_unique_pairs: u64, swap_copies: u64) {
        let host_read_bytes = cold_unique_pairs.saturating_mul(self.expert_bytes);
        let swap_bytes = swap_copies.saturating_mul(self.expert_bytes);
        self.steps.push(StepBytes {
            cold_unique_pairs,
            host_read_bytes,
            swap_copies,
            swap_bytes,
            stall_us: self.link.stall_us(host_read_bytes, swap_copies, swap_bytes),
        });
    }

    /// The report: totals, `window`-step buckets, means over `steady` (a step range).
    pub(crate) fn finish(
        self,
        window: usize,
        steady: std::ops::Range<usize>,
        keep_steps: bool,
    ) -> ByteReport {
        let s = &self.steps;
        let sum_u = |f: fn(&StepBytes) -> u64, xs: &[StepBytes]| {
            xs.iter().fold(0u64, |a, x| a.saturating_add(f(x)))
        };
        let sum_stall = |xs: &[StepBytes]| xs.iter().map(|x| x.stall_us).sum::<f64>();
        let per_step = |v: f64, n: usize| if n == 0 { 0.0 } else { v / n as f64 };
        let w = window.max(1);
        let host_read_bytes = sum_u(|x| x.host_read_bytes, s);
        let swap_bytes = sum_u(|x| x.swap_bytes, s);
        let stall_us = sum_stall(s);
        let tail = s.get(steady).unwrap_or(&[]);
        let tail_bytes = tail
            .iter()
            .map(|x| x.host_read_bytes as f64 + x.swap_bytes as f64)
            .sum::<f64>();
        ByteReport {
            expert_bytes: self.expert_bytes,
            cold_unique_pairs: sum_u(|x| x.cold_unique_pairs, s),
            host_read_bytes,
            swap_copies: sum_u(|x| x.swap_copies, s),
            swap_bytes,
            total_bytes: host_read_bytes.saturating_add(swap_bytes),
            stall_us,
            mean_stall_us_per_step: per_step(stall_us, s.len()),
            steady_bytes_per_step: per_step(tail_bytes, tail.len()),
            steady_stall_us_per_step: per_step(sum_stall(tail), tail.len()),
            host_read_bytes_windows: s
                .chunks(w)
                .map(|c| sum_u(|x| x.host_read_bytes, c))
                .collect(),
            swap_bytes_windows: s.chunks(w).map(|c| sum_u(|x| x.swap_bytes, c)).collect(),
            stall_us_windows: s.chunks(w).map(sum_stall).collect(),
            per_step: if keep_steps { self.steps } else { Vec::new() },
            link: self.link,
        }
    }
}
