//! The expert-residency lab: routing traces ([`trace`]), replays of traces through every policy
//! ([`replay()`]), the static maps in hindsight ([`best_static_map`]) and LRU references, the
//! exact offline optimum of the stall ([`PolicySpec::OfflineOptimum`]), T90, the bytes on the
//! host link ([`ByteReport`], priced by a [`LinkModel`]), and the one scoreboard ([`scoreboard`])
//! that the CLI and the examples print.

mod bytes;
mod check;
mod hindsight;
mod link;
pub mod modes;
mod optimum;
mod replay;
pub mod scoreboard;
mod t90;
pub mod trace;

use expert_residency::{CounterDump, ExpertError, Result};

pub use bytes::{ByteReport, StepBytes};
pub use check::validate_trace;
pub use hindsight::{best_static_map, touched_dump, OracleWindow, StaticRank};
pub use link::{CopyMode, LinkModel, LINK_PRESETS};
pub use optimum::{check_optimum_link, optimum_work, shared_optimum_work, OPTIMUM_AUTO_MAX_WORK};
pub use replay::{
    ratio_tuning_grid, replay, replay_with, PolicySpec, ReplayOptions, ReplayReport, SteadyState,
};
pub use t90::{t90, T90};

/// The picks of `trace.steps[range]` summed per `(layer, expert)`, named `NAME[START..END]`.
///
/// Errors: [`ExpertError::EmptyTrace`] for an empty range; the errors of [`CounterDump::from_steps`].
pub fn counter_dump(trace: &trace::Trace, range: std::ops::Range<usize>) -> Result<CounterDump> {
    let steps = trace
        .steps
        .get(range.clone())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ExpertError::EmptyTrace(format!("no step in {range:?}")))?;
    CounterDump::from_steps(
        format!("{}[{}..{}]", trace.name, range.start, range.end),
        trace.shape.layers,
        trace.shape.experts_per_layer,
        steps,
    )
}
