//! Static maps in hindsight: the **best static map** for the scoreboard's cost, and the map
//! ranked by picks that the scoreboard once called its oracle.
//!
//! Under the scoreboard's model ([`crate::experts::replay_with`]) a map that never moves pays, per
//! step and layer, one in-place read for each distinct cold expert the step touches, and no copy.
//! Over a window of steps its stall is therefore `read_us(expert_bytes) × Σ_layers Σ_{e cold}
//! touched(layer, e)`, where `touched` counts the steps of the window in which `e` was picked at
//! all (however many tokens picked it). Per layer that sum is least for the `hot_per_layer`
//! experts touched in the most steps: [`StaticRank::Touched`] gives **the** best static map for
//! the stall and the host bytes (ties aside), whatever the link preset. Ranking by picks
//! ([`StaticRank::Picks`]) gives the best static map for the *cold share* (which counts lookups),
//! and differs where a step's tokens pile onto few experts: a 135-token prefill gives ~260 of ~420
//! picks of a layer in a Mixtral log, so the pick ranking follows the prefill while the link pays
//! per step. Seed fitting offers both ([`crate::experts::counter_dump`] counts picks,
//! [`touched_dump`] touched steps); `fit_seed_map` ranks whatever counts it is given.

use expert_residency::{fit_seed_map, CounterDump, ExpertError, Geometry, ResidencyMap, Result};

use crate::experts::check::validate_trace;
use crate::experts::trace::Trace;

/// Which steps a static map in hindsight ([`PolicySpec::BestStatic`](crate::experts::PolicySpec::BestStatic)) is fitted on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OracleWindow {
    /// The whole trace.
    Whole,
    /// From the last shift in `trace.shifts` to the end ("the oracle for the new domain"); the
    /// whole trace if there is no shift.
    AfterLastShift,
    /// Steps `start..end`.
    Steps {
        /// First step (inclusive).
        start: u64,
        /// Last step (exclusive).
        end: u64,
    },
}

/// What a static map in hindsight ranks the experts of a layer by.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum StaticRank {
    /// Steps in which the expert was picked at all: the best static map for stall and bytes
    /// (the module docs say why). The default.
    #[default]
    Touched,
    /// Picks (lookups): the best static map for the cold share, not for the link.
    Picks,
}

impl StaticRank {
    /// `touched` or `picks`.
    pub fn name(self) -> &'static str {
        match self {
            StaticRank::Touched => "touched",
            StaticRank::Picks => "picks",
        }
    }
}

/// The steps of `window` in a trace of `n` steps (clamped to the trace).
pub(crate) fn window_range(trace: &Trace, window: &OracleWindow) -> std::ops::Range<usize> {
    let n = trace.steps.len();
    match window {
        OracleWindow::Whole => 0..n,
        OracleWindow::AfterLastShift => {
            let s = trace
                .shifts
                .iter()
                .copied()
                .filter(|&s| (s as usize) < n)
                .max();
            s.map_or(0, |s| s as usize)..n
        }
        OracleWindow::Steps { start, end } => (*start as usize).min(n)..(*end as usize).min(n),
    }
}

/// The steps of `trace.steps[range]` in which each `(layer, expert)` was picked at least once,
/// as a counter dump (`layers × experts_per_layer`, row-major), named `NAME[START..END] touched`.
/// Feed it to [`fit_seed_map`] for a map ranked by touched steps.
///
/// Errors: [`ExpertError::EmptyTrace`] for an empty range; the errors of
/// [`CounterDump::from_steps`] (a step with another number of layers than the trace's shape, an
/// id outside it, shape bounds, counts the host cannot allocate).
pub fn touched_dump(trace: &Trace, range: std::ops::Range<usize>) -> Result<CounterDump> {
    let steps = trace
        .steps
        .get(range.clone())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ExpertError::EmptyTrace(format!("no step in {range:?}")))?;
    let (layers, experts) = (trace.shape.layers, trace.shape.experts_per_layer);
    // The pick counts check the steps (layers per step, ids) and give the counts' allocation.
    let mut dump = CounterDump::from_steps(
        format!("{}[{}..{}] touched", trace.name, range.start, range.end),
        layers,
        experts,
        steps,
    )?;
    dump.counts.fill(0.0);
    // The step (+ 1) that last counted each cell: each cell counts once per step.
    let mut last = tier_core::alloc::try_filled(dump.counts.len(), 0usize, "touched-steps dump")?;
    for (i, s) in steps.iter().enumerate() {
        for (l, picks) in s.layers.iter().enumerate() {
            for &e in picks {
                let cell = l * experts as usize + e as usize;
                if last[cell] != i + 1 {
                    last[cell] = i + 1;
                    dump.counts[cell] += 1.0;
                }
            }
        }
    }
    Ok(dump)
}

/// The static map in hindsight over `window`: per layer the top `hot_per_layer` experts by
/// `rank` (ties to the lower id, busiest in slot 0). [`StaticRank::Touched`] is the best static
/// map for stall and bytes (see the module docs).
///
/// Errors: as [`validate_trace`]; [`ExpertError::EmptyTrace`] for an empty window.
pub fn best_static_map(
    trace: &Trace,
    geometry: &Geometry,
    window: &OracleWindow,
    rank: StaticRank,
) -> Result<ResidencyMap> {
    validate_trace(trace, geometry)?;
    let range = window_range(trace, window);
    let dump = match rank {
        StaticRank::Touched => touched_dump(trace, range)?,
        StaticRank::Picks => crate::experts::counter_dump(trace, range)?,
    };
    fit_seed_map(
        format!("best-static-{}:{}", rank.name(), trace.name),
        geometry,
        &dump,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::TraceShape;
    use expert_residency::StepPicks;

    fn trace(steps: &[[&[u32]; 1]]) -> Trace {
        Trace {
            name: "t".into(),
            shape: TraceShape {
                layers: 1,
                experts_per_layer: 4,
                top_k: 2,
            },
            steps: steps
                .iter()
                .map(|s| StepPicks {
                    layers: s.iter().map(|l| l.to_vec()).collect(),
                })
                .collect(),
            shifts: vec![],
        }
    }

    #[test]
    fn touched_steps_and_picks_rank_apart() {
        // Expert 0: 6 picks in one step (a prefill); expert 1: one pick in each of 3 steps.
        let t = trace(&[[&[0, 0, 0, 0, 0, 0, 1]], [&[1, 2]], [&[1, 3]]]);
        let d = touched_dump(&t, 0..3).unwrap();
        assert_eq!(d.counts, vec![1.0, 3.0, 1.0, 1.0]);
        let g = Geometry::new(1, 4, 1, 100).unwrap();
        let touched = best_static_map(&t, &g, &OracleWindow::Whole, StaticRank::Touched).unwrap();
        let picks = best_static_map(&t, &g, &OracleWindow::Whole, StaticRank::Picks).unwrap();
        assert_eq!(touched.hot_sets(), vec![vec![1]]);
        assert_eq!(picks.hot_sets(), vec![vec![0]]);
        assert!(touched_dump(&t, 3..3).is_err());
        let mut bad = t.clone();
        bad.steps[1].layers[0].push(9);
        assert!(matches!(
            touched_dump(&bad, 0..3),
            Err(ExpertError::ExpertOutOfRange { .. })
        ));
    }
}
