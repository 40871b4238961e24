//! The engine modes ([`EngineMode`]) and one step's cost in a mode ([`StepCost`]): a leaf of
//! [`super`] (it needs only the link's and the modes' prices), so the scoreboard's replay can use
//! [`super::LruBank`] without a module circle.

use super::price;
use crate::experts::link::LinkModel;

/// How an engine serves a cold expert (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineMode {
    /// Read in place over the link; copies at step boundaries (the scoreboard's model).
    InPlace,
    /// Copied into HBM on a miss and computed there in the same step.
    CopyOnMiss,
    /// Read in place or copied, whichever the link prices lower given the expected reuse.
    ReadOrCopy,
    /// Split between the link (in place) and the host CPU, in parallel.
    Cpu,
}

impl EngineMode {
    /// Every mode, in table order.
    pub const ALL: [EngineMode; 4] = [
        EngineMode::InPlace,
        EngineMode::CopyOnMiss,
        EngineMode::ReadOrCopy,
        EngineMode::Cpu,
    ];

    /// `in-place`, `copy-on-miss`, `read-or-copy`, `cpu`.
    pub fn name(self) -> &'static str {
        match self {
            EngineMode::InPlace => "in-place",
            EngineMode::CopyOnMiss => "copy-on-miss",
            EngineMode::ReadOrCopy => "read-or-copy",
            EngineMode::Cpu => "cpu",
        }
    }
}

/// One step's work and stall in a mode (counts of experts; µs).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepCost {
    /// Picks of the step.
    pub picks: u64,
    /// Picks of experts not in HBM when their layer ran.
    pub miss_picks: u64,
    /// Cold experts read in place over the link.
    pub reads: u64,
    /// Misses copied into HBM to serve the step (critical path).
    pub serving_copies: u64,
    /// Copies at the step's end boundary (a policy's swaps, an in-place LRU's admissions).
    pub boundary_copies: u64,
    /// Cold experts computed by the CPU.
    pub cpu: u64,
    /// [`EngineMode::Cpu`]: the layers' link/CPU times summed, µs.
    pub split_us: f64,
    /// Modelled stall of the step, µs.
    pub stall_us: f64,
}

impl StepCost {
    /// Sets `stall_us`: the reads (`cpu` mode: the split times), the serving copies, the boundary
    /// copies, all on one link priced by `link`, experts of `b` bytes.
    pub(crate) fn finish(&mut self, mode: EngineMode, link: &LinkModel, b: u64) {
        let reads = match mode {
            EngineMode::Cpu => self.split_us,
            _ => link.cost.read_us(self.reads.saturating_mul(b)),
        };
        self.stall_us = reads
            + price::serving_copies_us(link, self.serving_copies, b)
            + price::boundary_copies_us(link, self.boundary_copies, b);
    }
}
