//! The one expert scoreboard: which policies a comparison runs, how they are replayed, and the
//! table every front end prints (`tierkit experts replay`, the `replay_default` example).
//!
//! Scoring choices live here, not in the front ends:
//! - the reference for "vs oracle" is the oracle after the last shift (the best static map for
//!   the new traffic), or the whole-trace oracle for a trace without a shift;
//! - a map that never moves (static, seed, oracles) has no T90 in the table (its JSON keeps the
//!   raw figure);
//! - the default seed map is fitted on the steps before the first shift, or on the first tenth of
//!   a trace without a shift.

use expert_residency::{fit_seed_map, ControllerConfig, Geometry, ResidencyMap, Result};

use crate::experts::replay::{replay_with, OracleWindow, PolicySpec, ReplayOptions, ReplayReport};
use crate::experts::trace::Trace;

/// A policy family of the comparison (one or two rows each: the oracle adds an
/// "oracle-after-shift" row on a trace with shifts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// A uniform first-K map, never swapped.
    Static,
    /// The seed map fitted offline, never swapped.
    Seed,
    /// The adaptive controller (EMA drain, ratio policy, swap caps).
    Adaptive,
    /// The adaptive controller with the shift response on.
    AdaptiveShiftResponse,
    /// Per-layer LRU admitting every miss (uncapped reference).
    Lru,
    /// The best static maps in hindsight (whole trace; after the last shift if any).
    Oracle,
}

impl Policy {
    /// Every policy, in table order.
    pub const ALL: [Policy; 6] = [
        Policy::Static,
        Policy::Seed,
        Policy::Adaptive,
        Policy::AdaptiveShiftResponse,
        Policy::Lru,
        Policy::Oracle,
    ];
}

/// One replayed policy: its row label and report.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Run {
    /// Row label (`static`, `seed`, `adaptive`, `adaptive+shift-response`, `lru`, `oracle`,
    /// `oracle-after-shift`).
    pub label: String,
    /// The replay's report.
    pub report: ReplayReport,
}

/// One row of the comparison table (JSON: the `summary` of `tierkit experts replay --json`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScoreRow {
    /// Row label.
    pub label: String,
    /// Cold share of all lookups.
    pub cold_share: f64,
    /// Steady-state cold share.
    pub steady_state_cold_share: f64,
    /// Steady state over the reference oracle's (see the module docs).
    pub vs_oracle: Option<f64>,
    /// T90 in steps after each shift (`None`: never within 10%).
    pub t90_steps: Vec<Option<u64>>,
    /// Mean swaps applied per step.
    pub mean_swaps_per_step: f64,
    /// Most swaps applied in one step.
    pub max_swaps_per_step: u32,
    /// Swaps applied.
    pub swaps_applied: u64,
}

/// The default seed map of a comparison and a note saying how it was fitted: on the steps before
/// the first shift, or on the first tenth of a trace without a shift.
///
/// Errors: the errors of [`crate::experts::counter_dump`] and [`fit_seed_map`].
pub fn default_seed_map(trace: &Trace, geometry: &Geometry) -> Result<(ResidencyMap, String)> {
    let n = trace.steps.len();
    let end = match trace.shifts.first() {
        Some(&s) => s as usize,
        None => (n / 10).max(1),
    };
    let dump = crate::experts::counter_dump(trace, 0..end)?;
    let map = fit_seed_map(format!("seed:{}", trace.name), geometry, &dump)?;
    let why = if trace.shifts.is_empty() {
        "the first tenth"
    } else {
        "before the first shift"
    };
    Ok((map, format!("fitted on steps 0..{end} ({why})")))
}

/// The labelled policy specs of `policies` (duplicates dropped, order kept), with `seed` as the
/// seed map.
pub fn policy_specs(
    policies: &[Policy],
    trace: &Trace,
    seed: &ResidencyMap,
) -> Vec<(String, PolicySpec)> {
    let mut want: Vec<Policy> = Vec::new();
    for &p in policies {
        if !want.contains(&p) {
            want.push(p);
        }
    }
    let mut out = Vec::new();
    for p in want {
        match p {
            Policy::Static => out.push(("static".into(), PolicySpec::Static(None))),
            Policy::Seed => out.push(("seed".into(), PolicySpec::Seed(seed.clone()))),
            Policy::Adaptive => out.push(("adaptive".into(), PolicySpec::Adaptive(None))),
            Policy::AdaptiveShiftResponse => out.push((
                "adaptive+shift-response".into(),
                PolicySpec::AdaptiveShiftResponse(None),
            )),
            Policy::Lru => out.push(("lru".into(), PolicySpec::Lru(None))),
            Policy::Oracle => {
                out.push(("oracle".into(), PolicySpec::Oracle(OracleWindow::Whole)));
                if !trace.shifts.is_empty() {
                    out.push((
                        "oracle-after-shift".into(),
                        PolicySpec::Oracle(OracleWindow::AfterLastShift),
                    ));
                }
            }
        }
    }
    out
}

/// Replays every spec on up to `available_parallelism` threads; results in input order.
/// `progress(label)` is called as each replay starts and `progress("")` as each ends (for a
/// progress bar; pass `&|_| {}` for none).
///
/// Errors: the first failing replay's error, prefixed with its label.
pub fn run_policies(
    trace: &Trace,
    geometry: &Geometry,
    cfg: &ControllerConfig,
    opts: &ReplayOptions,
    specs: &[(String, PolicySpec)],
    progress: &(dyn Fn(&str) + Sync),
) -> std::result::Result<Vec<Run>, String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<ReplayReport>>>> =
        specs.iter().map(|_| Mutex::new(None)).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(specs.len())
        .max(1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                // Relaxed: the counter only hands out distinct indices; results go through mutexes.
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((label, spec)) = specs.get(i) else {
                    break;
                };
                progress(label);
                let r = replay_with(trace, geometry, spec, cfg, opts);
                *results[i].lock().expect("no panic holds it") = Some(r);
                progress("");
            });
        }
    });
    specs
        .iter()
        .zip(results)
        .map(|((label, _), r)| {
            let report = r
                .into_inner()
                .expect("no panic holds it")
                .expect("every index was run")
                .map_err(|e| format!("policy {label}: {e}"))?;
            Ok(Run {
                label: label.clone(),
                report,
            })
        })
        .collect()
}

/// The rows of the comparison (see the module docs for the reference oracle).
pub fn summarize(runs: &[Run]) -> Vec<ScoreRow> {
    let reference = runs
        .iter()
        .find(|r| r.label == "oracle-after-shift")
        .or_else(|| runs.iter().find(|r| r.label == "oracle"))
        .map(|r| r.report.steady_state.cold_share);
    runs.iter()
        .map(|r| {
            let rep = &r.report;
            ScoreRow {
                label: r.label.clone(),
                cold_share: rep.cold_share_overall,
                steady_state_cold_share: rep.steady_state.cold_share,
                vs_oracle: reference
                    .filter(|&o| o > 0.0)
                    .map(|o| rep.steady_state.cold_share / o),
                t90_steps: rep.shifts.iter().map(|t| t.steps).collect(),
                mean_swaps_per_step: rep.mean_swaps_per_step,
                max_swaps_per_step: rep.max_swaps_per_step,
                swaps_applied: rep.swaps.applied,
            }
        })
        .collect()
}

/// The comparison as a Markdown-compatible text table.
pub fn render(rows: &[ScoreRow]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            // T90 describes adaptation: a map that never moves has none.
            let fixed = r.swaps_applied == 0
                && matches!(
                    r.label.as_str(),
                    "static" | "seed" | "oracle" | "oracle-after-shift"
                );
            let t90 = if r.t90_steps.is_empty() || fixed {
                "-".to_string()
            } else {
                r.t90_steps
                    .iter()
                    .map(|t| t.map_or("never".to_string(), |s| s.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                r.label.clone(),
                format!("{:.4}", r.cold_share),
                format!("{:.4}", r.steady_state_cold_share),
                r.vs_oracle.map_or("-".into(), |v| format!("{v:.3}×")),
                t90,
                format!("{:.3}", r.mean_swaps_per_step),
                r.max_swaps_per_step.to_string(),
                r.swaps_applied.to_string(),
            ]
        })
        .collect();
    crate::table::render(
        &[
            "policy",
            "cold share",
            "steady-state cold share",
            "vs oracle",
            "T90 after shift (steps)",
            "swaps/step",
            "max swaps/step",
            "swaps",
        ],
        &body,
    )
}

/// The legend printed under [`render`]'s table.
pub fn legend(opts: &ReplayOptions, trace: &Trace) -> String {
    format!(
        "cold share = fraction of expert lookups served from host; steady state = mean over the last {}% of the segment after the last shift; vs oracle = steady state / {}'s; T90 = steps until the excess cold share after a shift has decayed by 90%.",
        (opts.steady_fraction * 100.0).round(),
        if trace.shifts.is_empty() {
            "oracle"
        } else {
            "oracle-after-shift"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::synth;

    #[test]
    fn scoreboard_rows_reference_the_oracle_after_the_shift() {
        let mut cfg = synth::SynthConfig::default_scenario();
        cfg.steps = 300;
        cfg.phases[1].start_step = 150;
        let trace = synth::generate(&cfg).unwrap();
        let s = trace.shape;
        let g = Geometry::new(s.layers, s.experts_per_layer, 16, 1 << 20).unwrap();
        let (seed, note) = default_seed_map(&trace, &g).unwrap();
        assert!(note.contains("0..150"), "{note}");
        let specs = policy_specs(
            &[Policy::Oracle, Policy::Static, Policy::Oracle],
            &trace,
            &seed,
        );
        let labels: Vec<&str> = specs.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["oracle", "oracle-after-shift", "static"]);
        let runs = run_policies(
            &trace,
            &g,
            &ControllerConfig::default(),
            &ReplayOptions::default(),
            &specs,
            &|_| {},
        )
        .unwrap();
        let rows = summarize(&runs);
        assert_eq!(rows[1].vs_oracle, Some(1.0));
        assert!(rows[2].vs_oracle.unwrap() > 1.0);
        let table = render(&rows);
        assert!(table.contains("oracle-after-shift") && table.contains("1.000×"));
        // Fixed maps show no T90.
        assert!(table
            .lines()
            .all(|l| !l.starts_with("| static") || l.contains(" - ")));
    }
}
