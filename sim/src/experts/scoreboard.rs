//! The one expert scoreboard: which policies a comparison runs, how they are replayed, and the
//! table every front end prints (`tierkit experts replay`, the `replay_default` example).
//!
//! Scoring choices live here, not in the front ends:
//! - the reference for every "vs best static" ratio is [`BEST_STATIC_AFTER_SHIFT_LABEL`] (the best
//!   static map for the new traffic), or [`BEST_STATIC_LABEL`] (the whole trace) for a trace
//!   without a shift: per layer the top-H experts by **steps touched**, in hindsight, which is the
//!   static map of least stall and bytes in the scoreboard's model
//!   ([`crate::experts::best_static_map`]); the map ranked by picks, once the "oracle", stays as
//!   the labelled row [`STATIC_BY_PICKS_LABEL`] (best for the cold share, not for the link);
//! - a map that never moves (static, seed, the maps in hindsight) has no T90 in the table (its JSON keeps the
//!   raw figure);
//! - the default seed map is fitted on the steps before the first shift, or on the first tenth of
//!   a trace without a shift, ranked by steps touched;
//! - adaptive and LRU rows boot from first-K unless [`Boot::Seed`] is asked for; the `boot`
//!   column says which map each row started from;
//! - the policy rows: `cost-aware (default)` ([`ControllerConfig::default`], whatever the
//!   command's flags), `ratio (published defaults)` ([`ControllerConfig::published_recipe`]),
//!   `ratio (best tuning)` (the least stall over [`crate::experts::ratio_tuning_grid`] on the
//!   same trace: in hindsight), `recency (capped 4)` ([`recency_config`]), `lru (uncapped)`;
//!   `adaptive` and `adaptive+shift-response` run the command's own config when asked for;
//! - the last row, [`OPTIMUM_LABEL`], is no policy but the exact offline optimum of the stall
//!   ([`PolicySpec::OfflineOptimum`]): a row whose whole-trace stall is below it would be a
//!   scoreboard bug (tested); every row's whole-trace stall over it is its "stall vs optimum";
//! - bytes (host reads in place + swap copies, [`crate::experts::ByteReport`]) and the modelled
//!   stall (under the replay's [`crate::experts::LinkModel`]) stand beside the cold share; their
//!   "vs best static" ratios divide steady-state bytes (stall) per step by the same reference's.

use expert_residency::{fit_seed_map, ControllerConfig, Geometry, ResidencyMap, Result};

use crate::experts::hindsight::OracleWindow;
use crate::experts::hindsight::StaticRank;
use crate::experts::link::{CopyMode, LinkModel};
use crate::experts::replay::{replay_with, PolicySpec, ReplayOptions, ReplayReport};
use crate::experts::trace::{synth, Trace};

/// A policy family of the comparison (one or two rows each: the maps in hindsight add an
/// "after shift" row on a trace with shifts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// A uniform first-K map, never swapped.
    Static,
    /// The seed map fitted offline, never swapped.
    Seed,
    /// The controller with the comparison's own config (by default the cost-aware default).
    Adaptive,
    /// The controller with the comparison's own config and the shift response on.
    AdaptiveShiftResponse,
    /// The cost-aware default, [`ControllerConfig::default`] (no flags), row
    /// `cost-aware (default)`.
    CostAware,
    /// The published ratio recipe at its defaults, [`ControllerConfig::published_recipe`], row
    /// `ratio (published defaults)`.
    Ratio,
    /// The published ratio recipe at its best tuning in hindsight on the same trace
    /// ([`PolicySpec::RatioBestTuning`]), row `ratio (best tuning)`.
    RatioBest,
    /// The capped recency policy ([`recency_config`]), row `recency (capped 4)`.
    Recency,
    /// Per-layer LRU admitting every miss (uncapped reference), row `lru (uncapped)`.
    Lru,
    /// The best static maps in hindsight, top-H by steps touched (whole trace; after the last
    /// shift if any), rows [`BEST_STATIC_LABEL`], [`BEST_STATIC_AFTER_SHIFT_LABEL`]: the reference
    /// of every "vs best static" ratio.
    BestStatic,
    /// The static maps in hindsight ranked by picks (the former `oracle`), rows
    /// [`STATIC_BY_PICKS_LABEL`] and `static by picks after shift`.
    StaticByPicks,
    /// Not a policy: the exact offline optimum of the stall ([`PolicySpec::OfflineOptimum`]),
    /// row [`OPTIMUM_LABEL`].
    #[serde(rename = "offline-optimum")]
    Optimum,
}

impl Policy {
    /// Every policy of the default comparison, in table order (`adaptive` and
    /// `adaptive+shift-response`, the command's own config, only when asked for).
    pub const ALL: [Policy; 10] = [
        Policy::Static,
        Policy::Seed,
        Policy::CostAware,
        Policy::Ratio,
        Policy::RatioBest,
        Policy::Recency,
        Policy::Lru,
        Policy::StaticByPicks,
        Policy::BestStatic,
        Policy::Optimum,
    ];
}

/// Row label of [`Policy::BestStatic`] over the whole trace.
pub const BEST_STATIC_LABEL: &str = "best static";
/// Row label of [`Policy::BestStatic`] after the last shift.
pub const BEST_STATIC_AFTER_SHIFT_LABEL: &str = "best static after shift";
/// Row label of [`Policy::StaticByPicks`] over the whole trace.
pub const STATIC_BY_PICKS_LABEL: &str = "static by picks";

/// Row label of [`Policy::Optimum`]: no row's stall over the whole trace is below it.
/// step.
pub const OPTIMUM_LABEL: &str = "offline optimum";

/// Swaps per step of the `recency (capped N)` row.
pub const RECENCY_CAP: u32 = 4;

/// The config of the `recency (capped N)` row: [`expert_residency::PolicyConfig::Recency`],
/// drained every step (recency at one-step resolution), at most [`RECENCY_CAP`] swaps per step
/// and per layer per drain, a fixed 8-step half-life for its frequency tie-break, no byte budget.
pub fn recency_config() -> ControllerConfig {
    ControllerConfig {
        policy: expert_residency::PolicyConfig::Recency(expert_residency::RecencyConfig {}),
        drain_every: 1,
        half_life_steps: 8.0,
        max_swaps_per_layer: RECENCY_CAP,
        max_swaps_per_step: RECENCY_CAP,
        adaptive: None,
        swap_budget_bytes_per_step: None,
        ..ControllerConfig::default()
    }
}

/// The map the adaptive and LRU rows boot from.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Boot {
    /// The uniform first-K map (the `static` row's).
    #[default]
    FirstK,
    /// The seed map (the `seed` row's).
    Seed,
}

/// Experts per layer of the [`wide_reuse_scenario`] (Qwen3-Next-80B-A3B's routed experts).
pub const WIDE_EXPERTS: u32 = 512;
/// Top-k of the [`wide_reuse_scenario`].
pub const WIDE_TOP_K: u32 = 10;
/// MoE layers of the [`wide_reuse_scenario`].
pub const WIDE_LAYERS: u32 = 48;
/// Zipf exponent of the [`wide_reuse_scenario`]'s popularity (weak skew: the busiest quarter of
/// the experts takes ~40% of the picks).
pub const WIDE_ZIPF: f64 = 0.5;
/// Default previous-step reuse of the [`wide_reuse_scenario`] ("strong token-to-token reuse";
/// the report gives no number, 0.6 is our choice, against 0.37 measured on Mixtral decode).
pub const WIDE_REUSE: f64 = 0.6;

/// The `wide-reuse` synthetic scenario, after a public llama.cpp report's traffic: 512 experts,
/// top-10 ([`WIDE_LAYERS`] layers, Qwen3-Next's shape), weak skew (Zipf popularity with exponent
/// [`WIDE_ZIPF`], expert ids relabelled per layer), strong token-to-token reuse (`reuse`,
/// default [`WIDE_REUSE`]), `tokens` per step, no shift. Built with the synthetic generator's
/// config ([`synth::SynthConfig`]).
///
/// Errors: [`crate::experts::trace::TraceError`] from [`synth::SynthConfig::validate`] (zero
/// steps or tokens, reuse outside `[0, 1]`, sizes above the generator's bounds).
pub fn wide_reuse_scenario(
    steps: u64,
    tokens: u32,
    seed: u64,
    reuse: f64,
) -> std::result::Result<synth::SynthConfig, crate::experts::trace::TraceError> {
    let shape = crate::experts::trace::TraceShape {
        layers: WIDE_LAYERS,
        experts_per_layer: WIDE_EXPERTS,
        top_k: WIDE_TOP_K,
    };
    let mut cfg = synth::SynthConfig::zipf(shape, WIDE_ZIPF, steps, tokens, seed, reuse)?;
    cfg.name = format!("wide-reuse-{WIDE_EXPERTS}x{WIDE_TOP_K}-b{tokens}");
    cfg.domains[0].name = "wide".into();
    Ok(cfg)
}

/// One replayed policy: its row label and report.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Run {
    /// Row label (`static`, `seed`, `cost-aware (default)`, `ratio (published defaults)`,
    /// `ratio (best tuning)`, `recency (capped 4)`, `lru (uncapped)`, `adaptive`,
    /// `adaptive+shift-response`, `static by picks`, `static by picks after shift`, `best static`,
    /// `best static after shift`, [`OPTIMUM_LABEL`]).
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
    /// Steady-state cold share over the reference best static map's (see the module docs).
    pub vs_best_static: Option<f64>,
    /// T90 in steps after each shift (`None`: never within 10%).
    pub t90_steps: Vec<Option<u64>>,
    /// Mean swaps applied per step.
    pub mean_swaps_per_step: f64,
    /// Most swaps applied in one step.
    pub max_swaps_per_step: u32,
    /// Swaps applied.
    pub swaps_applied: u64,
    /// The map the row started from (`first-k`, `seed`, `hindsight`; `optimal` for the offline
    /// optimum, whose map at step 0 is free).
    #[serde(default)]
    pub boot: String,
    /// Name of the link the stall was modelled with.
    #[serde(default)]
    pub link: String,
    /// Bytes read in place from host memory, all steps, GB (10⁹ bytes).
    #[serde(default)]
    pub host_read_gb: f64,
    /// Bytes copied host → HBM by swaps (net hot-set changes), all steps, GB.
    #[serde(default)]
    pub swap_gb: f64,
    /// `host_read_gb + swap_gb`.
    #[serde(default)]
    pub total_gb: f64,
    /// Mean modelled stall per step under the link, ms.
    #[serde(default)]
    pub stall_ms_per_step: f64,
    /// Steady-state bytes per step over the reference best static map's (see the module docs).
    #[serde(default)]
    pub bytes_vs_best_static: Option<f64>,
    /// Steady-state stall per step over the reference best static map's.
    #[serde(default)]
    pub stall_vs_best_static: Option<f64>,
    /// Stall over the whole trace over the [`OPTIMUM_LABEL`] row's (`None` without that row, or
    /// when its stall is 0).
    #[serde(default)]
    pub stall_vs_optimum: Option<f64>,
}

/// The default seed map of a comparison and a note saying how it was fitted: per layer the top-H
/// experts by steps touched ([`crate::experts::touched_dump`], the ranking of least stall) on the
/// steps before the first shift, or on the first tenth of a trace without a shift.
///
/// Errors: the errors of [`crate::experts::touched_dump`] and [`fit_seed_map`].
pub fn default_seed_map(trace: &Trace, geometry: &Geometry) -> Result<(ResidencyMap, String)> {
    let n = trace.steps.len();
    let end = match trace.shifts.first() {
        Some(&s) => s as usize,
        None => (n / 10).max(1),
    };
    let dump = crate::experts::touched_dump(trace, 0..end)?;
    let map = fit_seed_map(format!("seed:{}", trace.name), geometry, &dump)?;
    let why = if trace.shifts.is_empty() {
        "the first tenth"
    } else {
        "before the first shift"
    };
    Ok((
        map,
        format!("fitted on steps 0..{end} ({why}), ranked by steps touched"),
    ))
}

/// The labelled policy specs of `policies` (duplicates dropped, order kept), with `seed` as the
/// seed map; adaptive and LRU boot from first-K ([`policy_specs_booted`] with [`Boot::FirstK`]).
pub fn policy_specs(
    policies: &[Policy],
    trace: &Trace,
    seed: &ResidencyMap,
) -> Vec<(String, PolicySpec)> {
    policy_specs_booted(policies, trace, seed, Boot::FirstK)
}

/// [`policy_specs`] with the adaptive and LRU rows booting from `boot`.
pub fn policy_specs_booted(
    policies: &[Policy],
    trace: &Trace,
    seed: &ResidencyMap,
    boot: Boot,
) -> Vec<(String, PolicySpec)> {
    let start = match boot {
        Boot::FirstK => None,
        Boot::Seed => Some(seed.clone()),
    };
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
            Policy::Adaptive => out.push(("adaptive".into(), PolicySpec::Adaptive(start.clone()))),
            Policy::AdaptiveShiftResponse => out.push((
                "adaptive+shift-response".into(),
                PolicySpec::AdaptiveShiftResponse(start.clone()),
            )),
            Policy::CostAware => out.push((
                "cost-aware (default)".into(),
                PolicySpec::Controller(start.clone(), Box::default()),
            )),
            Policy::Ratio => out.push((
                "ratio (published defaults)".into(),
                PolicySpec::Controller(
                    start.clone(),
                    Box::new(ControllerConfig::published_recipe()),
                ),
            )),
            Policy::RatioBest => out.push((
                "ratio (best tuning)".into(),
                PolicySpec::RatioBestTuning(start.clone()),
            )),
            Policy::Recency => out.push((
                format!("recency (capped {RECENCY_CAP})"),
                PolicySpec::Controller(start.clone(), Box::new(recency_config())),
            )),
            Policy::Lru => out.push(("lru (uncapped)".into(), PolicySpec::Lru(start.clone()))),
            Policy::BestStatic | Policy::StaticByPicks => {
                let (label, rank) = match p {
                    Policy::BestStatic => (BEST_STATIC_LABEL, StaticRank::Touched),
                    _ => (STATIC_BY_PICKS_LABEL, StaticRank::Picks),
                };
                out.push((
                    label.into(),
                    PolicySpec::BestStatic(OracleWindow::Whole, rank),
                ));
                if !trace.shifts.is_empty() {
                    out.push((
                        format!("{label} after shift"),
                        PolicySpec::BestStatic(OracleWindow::AfterLastShift, rank),
                    ));
                }
            }
            Policy::Optimum => out.push((OPTIMUM_LABEL.into(), PolicySpec::OfflineOptimum)),
        }
    }
    out
}

/// Why the [`OPTIMUM_LABEL`] row would not take seconds or cannot be computed on this trace and
/// link (`None`: compute it): its solver's work bound ([`crate::experts::optimum_work`]) above
/// [`crate::experts::OPTIMUM_AUTO_MAX_WORK`], or a stall not linear in copies (`hide_us > 0` on a
/// link whose copies share it).
pub fn optimum_skip_reason(trace: &Trace, geometry: &Geometry, link: &LinkModel) -> Option<String> {
    if link.copy_mode == CopyMode::SharesLink && link.hide_us > 0.0 {
        return Some(format!(
            "with {} µs of copy time hidden per step the stall is not linear in copies",
            link.hide_us
        ));
    }
    let work = crate::experts::optimum_work(trace, geometry);
    let max = crate::experts::OPTIMUM_AUTO_MAX_WORK;
    (work > max).then(|| {
        format!(
            "its work bound {work:.3e} is above {max:.0e} (minutes, not seconds); --optimum always computes it"
        )
    })
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

/// The rows of the comparison (see the module docs for the reference map).
pub fn summarize(runs: &[Run]) -> Vec<ScoreRow> {
    let reference_run = runs
        .iter()
        .find(|r| r.label == BEST_STATIC_AFTER_SHIFT_LABEL)
        .or_else(|| runs.iter().find(|r| r.label == BEST_STATIC_LABEL))
        .map(|r| &r.report);
    let reference = reference_run.map(|r| r.steady_state.cold_share);
    let optimum = runs
        .iter()
        .find(|r| r.label == OPTIMUM_LABEL)
        .map(|r| r.report.bytes.stall_us);
    let ratio = |x: f64, of: Option<f64>| of.filter(|&o| o > 0.0).map(|o| x / o);
    runs.iter()
        .map(|r| {
            let rep = &r.report;
            let b = &rep.bytes;
            ScoreRow {
                label: r.label.clone(),
                cold_share: rep.cold_share_overall,
                steady_state_cold_share: rep.steady_state.cold_share,
                vs_best_static: reference
                    .filter(|&o| o > 0.0)
                    .map(|o| rep.steady_state.cold_share / o),
                t90_steps: rep.shifts.iter().map(|t| t.steps).collect(),
                mean_swaps_per_step: rep.mean_swaps_per_step,
                max_swaps_per_step: rep.max_swaps_per_step,
                swaps_applied: rep.swaps.applied,
                boot: rep.boot.clone(),
                link: b.link.name.clone(),
                host_read_gb: b.host_read_bytes as f64 / 1e9,
                swap_gb: b.swap_bytes as f64 / 1e9,
                total_gb: b.total_bytes as f64 / 1e9,
                stall_ms_per_step: b.mean_stall_us_per_step / 1e3,
                bytes_vs_best_static: ratio(
                    b.steady_bytes_per_step,
                    reference_run.map(|o| o.bytes.steady_bytes_per_step),
                ),
                stall_vs_best_static: ratio(
                    b.steady_stall_us_per_step,
                    reference_run.map(|o| o.bytes.steady_stall_us_per_step),
                ),
                stall_vs_optimum: ratio(b.stall_us, optimum),
            }
        })
        .collect()
}

/// The T90 cell of a row: its steps after each shift, `never`, or `-` for a map that never moves
/// (T90 describes adaptation).
fn t90_cell(r: &ScoreRow) -> String {
    let fixed = r.swaps_applied == 0
        && (matches!(r.label.as_str(), "static" | "seed") || r.boot == "hindsight")
        || r.label == OPTIMUM_LABEL;
    if r.t90_steps.is_empty() || fixed {
        "-".to_string()
    } else {
        r.t90_steps
            .iter()
            .map(|t| t.map_or("never".to_string(), |s| s.to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The comparison in eight columns, under 120 characters wide for the scoreboard's row labels
/// (the CLI's default table; [`render`] has every column): policy, steady-state cold share and
/// its ratio to the best static map, T90, swaps per step, stall per step and its ratios to the
/// best static map and to the offline optimum.
pub fn render_compact(rows: &[ScoreRow]) -> String {
    let x = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}×"));
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.label.clone(),
                format!("{:.4}", r.steady_state_cold_share),
                x(r.vs_best_static),
                t90_cell(r),
                format!("{:.3}", r.mean_swaps_per_step),
                format!("{:.2}", r.stall_ms_per_step),
                x(r.stall_vs_best_static),
                x(r.stall_vs_optimum),
            ]
        })
        .collect();
    crate::table::render(
        &[
            "policy",
            "steady cold",
            "vs best",
            "T90",
            "swaps/step",
            "stall ms",
            "stall vs best",
            "vs optimum",
        ],
        &body,
    )
}

/// The comparison as a Markdown-compatible text table.
pub fn render(rows: &[ScoreRow]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let t90 = t90_cell(r);
            let x = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}×"));
            vec![
                r.label.clone(),
                r.boot.clone(),
                format!("{:.4}", r.cold_share),
                format!("{:.4}", r.steady_state_cold_share),
                x(r.vs_best_static),
                t90,
                format!("{:.3}", r.mean_swaps_per_step),
                r.max_swaps_per_step.to_string(),
                r.swaps_applied.to_string(),
                format!("{:.1}", r.host_read_gb),
                format!("{:.1}", r.swap_gb),
                format!("{:.1}", r.total_gb),
                format!("{:.2}", r.stall_ms_per_step),
                x(r.bytes_vs_best_static),
                x(r.stall_vs_best_static),
                x(r.stall_vs_optimum),
            ]
        })
        .collect();
    crate::table::render(
        &[
            "policy",
            "boot",
            "cold share",
            "steady-state cold share",
            "vs best static",
            "T90 after shift (steps)",
            "swaps/step",
            "max swaps/step",
            "swaps",
            "host GB read",
            "swap GB",
            "total GB",
            "stall ms/step",
            "bytes vs best static",
            "stall vs best static",
            "stall vs optimum",
        ],
        &body,
    )
}

/// The legend printed under [`render`]'s table.
pub fn legend(opts: &ReplayOptions, trace: &Trace) -> String {
    let l = &opts.link;
    let copies = match l.copy_mode {
        CopyMode::StopsStep => "copies stop the step".to_string(),
        CopyMode::SharesLink => format!(
            "copies overlap the step but share the link ({} µs of copy time hidden per step)",
            l.hide_us
        ),
    };
    format!(
        "cold share = fraction of expert lookups served from host; steady state = mean over the last {}% of the segment after the last shift; vs best static = steady state / {}'s (per layer the top-H experts by steps touched in hindsight: the static map of least stall); T90 = steps until the excess cold share after a shift has decayed by 90%.\n\
         host GB read = distinct cold (layer, expert) pairs per step × expert bytes, read in place; swap GB = net hot-set changes × expert bytes; stall = modelled link wait per step under {}: reads at {} GB/s, copies at {} GB/s, {copies}, +{} µs per copy; bytes/stall vs best static = steady-state per step / the same map's; stall vs optimum = stall over the whole trace / the offline optimum's (the least stall of any hot-set schedule in this model, per layer, its step-0 map free); boot = the map a row started from.",
        (opts.steady_fraction * 100.0).round(),
        if trace.shifts.is_empty() {
            BEST_STATIC_LABEL
        } else {
            BEST_STATIC_AFTER_SHIFT_LABEL
        },
        l.name,
        l.cost.read_gbps,
        l.cost.copy_gbps,
        l.cost.copy_fixed_us,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::synth;

    #[test]
    fn scoreboard_rows_reference_the_best_static_map_after_the_shift() {
        let mut cfg = synth::SynthConfig::default_scenario();
        cfg.steps = 300;
        cfg.phases[1].start_step = 150;
        let trace = synth::generate(&cfg).unwrap();
        let s = trace.shape;
        let g = Geometry::new(s.layers, s.experts_per_layer, 16, 1 << 20).unwrap();
        let (seed, note) = default_seed_map(&trace, &g).unwrap();
        assert!(note.contains("0..150"), "{note}");
        let specs = policy_specs(
            &[Policy::BestStatic, Policy::Static, Policy::BestStatic],
            &trace,
            &seed,
        );
        let labels: Vec<&str> = specs.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            [BEST_STATIC_LABEL, BEST_STATIC_AFTER_SHIFT_LABEL, "static"]
        );
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
        assert_eq!(rows[1].vs_best_static, Some(1.0));
        assert_eq!(rows[1].stall_vs_best_static, Some(1.0));
        assert!(rows[2].vs_best_static.unwrap() > 1.0);
        let table = render(&rows);
        assert!(table.contains(BEST_STATIC_AFTER_SHIFT_LABEL) && table.contains("1.000×"));
        // Fixed maps show no T90.
        assert!(table
            .lines()
            .all(|l| !l.starts_with("| static") || l.contains(" - ")));
    }
}
