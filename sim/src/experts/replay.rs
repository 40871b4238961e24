//! Replays of routing traces through a residency policy, with the cold-share scoreboard and the
//! bytes the host link carries ([`ByteReport`]).

use expert_residency::{
    Controller, ControllerConfig, DrainTelemetry, ExpertError, Geometry, MemoryExecutor,
    NullExecutor, PickCounters, PolicyConfig, RatioConfig, ResidencyMap, Result, StepPicks,
    SwapExecutor, SwapStats,
};

use crate::experts::bytes::{ByteReport, ByteTally, UniqueCold};
use crate::experts::check::validate_trace;
use crate::experts::hindsight::{best_static_map, OracleWindow, StaticRank};
use crate::experts::link::LinkModel;
use crate::experts::modes::bank::{BankScope, LruBank};
use crate::experts::modes::mode::EngineMode;
use crate::experts::modes::price::CpuChannel;
use crate::experts::t90::{mean, t90, T90};
use crate::experts::trace::Trace;

/// The policy a replay runs.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicySpec {
    /// A fixed map: the given one, or first-K (a uniform map) if `None`. Never swaps.
    Static(Option<ResidencyMap>),
    /// A seed map fitted offline ([`expert_residency::fit_seed_map`]). Never swaps.
    Seed(ResidencyMap),
    /// The [`Controller`] with the given config minus any shift response, from the given boot
    /// map (first-K if `None`).
    Adaptive(Option<ResidencyMap>),
    /// The [`Controller`] with a shift response: the config's, or [`expert_residency::ShiftResponse`]'s
    /// defaults if the config has none.
    AdaptiveShiftResponse(Option<ResidencyMap>),
    /// Per-layer LRU of `hot_per_layer` experts, from the boot map (first-K if `None`): every miss
    /// is admitted at the end of its step, evicting the least recently used hot expert, then the
    /// one with the fewest picks at that use, then the lowest id (the modes table's per-layer
    /// [`LruBank`] in place: no order of picks within a step moves it). Uncapped (an idealised
    /// reference: real copies could not keep up; its swaps per step, the net copies, are
    /// reported).
    Lru(Option<ResidencyMap>),
    /// A static map in hindsight: top-`hot_per_layer` per layer over a window of the trace, ranked
    /// by touched steps ([`StaticRank::Touched`]: the best static map for stall and bytes) or by
    /// picks ([`StaticRank::Picks`]); see [`crate::experts::best_static_map`].
    BestStatic(OracleWindow, StaticRank),
    /// The [`Controller`] with exactly this config (the config passed to the replay is ignored),
    /// from the given boot map (first-K if `None`): the cost-aware default, the published ratio
    /// recipe, the capped recency policy, each at its own config.
    Controller(Option<ResidencyMap>, Box<ControllerConfig>),
    /// The published ratio policy at its best tuning **in hindsight**: every config of
    /// [`ratio_tuning_grid`] is replayed on this same trace and the one with the least mean
    /// stall per step under the replay's link is reported (its config in the report).
    RatioBestTuning(Option<ResidencyMap>),
    /// Not a policy: the exact offline optimum of the stall in the scoreboard's model, per layer
    /// (Belady with bypass and copy costs, a min-cost flow: [`crate::experts::optimum_work`] and
    /// the `optimum` module docs). Its map at step 0 is free and it knows the whole trace, so no
    /// row's stall is below it. It needs a stall linear in copies (`hide_us = 0` on a
    /// [`crate::experts::CopyMode::SharesLink`] link, as the presets have): otherwise the replay
    /// fails with [`ExpertError::InvalidConfig`]. Its swaps are its copies.
    OfflineOptimum,
}

/// The sweep behind [`PolicySpec::RatioBestTuning`]: the published recipe
/// ([`ControllerConfig::published_recipe`]) at drain every {1, 8, 64} steps × EMA half-life
/// {16, 64, 500} steps × ratio {1.25, 1.5} (18 replays).
pub fn ratio_tuning_grid() -> Vec<ControllerConfig> {
    let mut out = Vec::new();
    for drain_every in [1, 8, 64] {
        for half_life_steps in [16.0, 64.0, 500.0] {
            for ratio in [1.25, 1.5] {
                out.push(ControllerConfig {
                    drain_every,
                    half_life_steps,
                    policy: PolicyConfig::Ratio(RatioConfig { ratio }),
                    ..ControllerConfig::published_recipe()
                });
            }
        }
    }
    out
}

impl PolicySpec {
    /// The policy's short name (`static`, `seed`, `adaptive`, `adaptive+shift-response`, `lru`,
    /// `best-static`, `static-by-picks`; a [`PolicySpec::Controller`] by its config's policy: `cost`, `ratio`,
    /// `recency`; `ratio-best-tuning`).
    pub fn name(&self) -> &'static str {
        match self {
            PolicySpec::Static(_) => "static",
            PolicySpec::Seed(_) => "seed",
            PolicySpec::Adaptive(_) => "adaptive",
            PolicySpec::AdaptiveShiftResponse(_) => "adaptive+shift-response",
            PolicySpec::Lru(_) => "lru",
            PolicySpec::BestStatic(_, StaticRank::Touched) => "best-static",
            PolicySpec::BestStatic(_, StaticRank::Picks) => "static-by-picks",
            PolicySpec::Controller(_, c) => c.policy.name(),
            PolicySpec::RatioBestTuning(_) => "ratio-best-tuning",
            PolicySpec::OfflineOptimum => "offline-optimum",
        }
    }

    /// The map the policy starts from: `first-k` (no map given), `seed` (a given map: the seed
    /// map, as `tierkit-sim`'s scoreboard passes it; [`PolicySpec::Seed`] too), `hindsight` (a
    /// static map in hindsight), or
    /// `optimal` ([`PolicySpec::OfflineOptimum`]: its own, free, map).
    pub fn boot_name(&self) -> &'static str {
        match self {
            PolicySpec::Static(None)
            | PolicySpec::Adaptive(None)
            | PolicySpec::AdaptiveShiftResponse(None)
            | PolicySpec::Controller(None, _)
            | PolicySpec::RatioBestTuning(None)
            | PolicySpec::Lru(None) => "first-k",
            PolicySpec::Static(Some(_))
            | PolicySpec::Seed(_)
            | PolicySpec::Adaptive(Some(_))
            | PolicySpec::AdaptiveShiftResponse(Some(_))
            | PolicySpec::Controller(Some(_), _)
            | PolicySpec::RatioBestTuning(Some(_))
            | PolicySpec::Lru(Some(_)) => "seed",
            PolicySpec::BestStatic(..) => "hindsight",
            PolicySpec::OfflineOptimum => "optimal",
        }
    }
}

/// Replay knobs besides the policy.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReplayOptions {
    /// Steps per bucket of [`ReplayReport::cold_share_windows`] (≥ 1).
    pub window_steps: u32,
    /// Tail fraction of a segment whose mean is its steady-state cold share (0 < f ≤ 1).
    pub steady_fraction: f64,
    /// Smoothing window of the T90 computation, in steps (≥ 1).
    pub smooth_steps: u32,
    /// Seconds per step, to report T90 in seconds (finite, > 0).
    pub step_time_s: Option<f64>,
    /// Keep every drain's [`DrainTelemetry`] in the report.
    pub telemetry: bool,
    /// Run adaptive policies on a [`MemoryExecutor`] with this many stand-in bytes per expert and
    /// verify every byte at the end (`None`: a [`NullExecutor`]); ≥ 1, and the executor's buffers
    /// stay within [`MemoryExecutor::MAX_BYTES`].
    pub verify_bytes: Option<usize>,
    /// The link that prices the step's host bytes ([`ByteReport::stall_us`]); default
    /// [`LinkModel::h200_pcie`].
    #[serde(default)]
    pub link: LinkModel,
    /// Keep every step's bytes in [`ByteReport::per_step`] (the per-window series are always
    /// there).
    #[serde(default)]
    pub per_step_bytes: bool,
    /// An experiment, not a runtime mode: feed the controller only **run starts** (an expert
    /// picked in a layer at step `t` and not at `t − 1`), each counted as this many picks, instead
    /// of every pick. With strong token-to-token reuse a touch count adds each run's geometric
    /// length to the popularity signal; counting starts ranks with less noise when every expert's
    /// runs are alike, and misranks when they are not (`docs/experts.md`, "Done-when bounds").
    /// Once per step and layer whatever the batch; `None` (default): every pick, as the engine
    /// counts. ≥ 1 when given.
    #[serde(default)]
    pub count_run_starts: Option<u32>,
}

impl ReplayOptions {
    /// Checks the knobs: `window_steps ≥ 1`, `smooth_steps ≥ 1`, `steady_fraction` in `(0, 1]`,
    /// `step_time_s` finite and > 0 when given, `verify_bytes` in
    /// `1..=`[`MemoryExecutor::MAX_BYTES`] when given (the executor checks the whole size
    /// against the geometry), the link ([`LinkModel::validate`]).
    ///
    /// Errors: [`ExpertError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ExpertError::InvalidConfig(m));
        if self.window_steps == 0 || self.smooth_steps == 0 {
            return bad("window_steps and smooth_steps must be ≥ 1".into());
        }
        if !(self.steady_fraction > 0.0 && self.steady_fraction <= 1.0) {
            return bad(format!(
                "steady_fraction must be in (0, 1], got {}",
                self.steady_fraction
            ));
        }
        if let Some(t) = self.step_time_s {
            if !(t.is_finite() && t > 0.0) {
                return bad(format!("step_time_s must be finite and > 0, got {t}"));
            }
        }
        if self.count_run_starts == Some(0) {
            return bad("count_run_starts must be ≥ 1 when given".into());
        }
        if let Some(b) = self.verify_bytes {
            if b == 0 || b > MemoryExecutor::MAX_BYTES {
                return bad(format!(
                    "verify_bytes must be in 1..={}, got {b}",
                    MemoryExecutor::MAX_BYTES
                ));
            }
        }
        self.link.validate()
    }
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            window_steps: 64,
            steady_fraction: 0.25,
            smooth_steps: 64,
            step_time_s: None,
            telemetry: false,
            verify_bytes: None,
            link: LinkModel::default(),
            per_step_bytes: false,
            count_run_starts: None,
        }
    }
}

/// Steady-state cold share: the mean per-step cold share over `from_step..to_step`, the last
/// `steady_fraction` of the segment after the last shift (of the whole trace if none).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SteadyState {
    /// First step of the tail (inclusive).
    pub from_step: u64,
    /// End of the tail (exclusive) = steps of the trace.
    pub to_step: u64,
    /// Mean cold share over the tail.
    pub cold_share: f64,
}

/// The outcome of a replay; serde, deterministic (the same inputs give byte-identical JSON).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReplayReport {
    /// Trace name.
    pub trace: String,
    /// Policy name ([`PolicySpec::name`]).
    pub policy: String,
    /// The map the policy started from ([`PolicySpec::boot_name`]).
    #[serde(default)]
    pub boot: String,
    /// Geometry replayed.
    pub geometry: Geometry,
    /// Controller config (for adaptive policies, as run).
    pub config: Option<ControllerConfig>,
    /// Steps replayed.
    pub steps: u64,
    /// Expert lookups (picks) replayed.
    pub lookups: u64,
    /// Steps per cold-share bucket.
    pub window_steps: u32,
    /// Cold share per bucket of `window_steps` steps (lookup-weighted).
    pub cold_share_windows: Vec<f64>,
    /// Cold share of all lookups.
    pub cold_share_overall: f64,
    /// Steady-state cold share.
    pub steady_state: SteadyState,
    /// T90 after each shift of `trace.shifts` that falls inside the trace.
    pub shifts: Vec<T90>,
    /// Swap counts (for LRU: `planned = applied` = admissions).
    pub swaps: SwapStats,
    /// Most swaps applied in one step.
    pub max_swaps_per_step: u32,
    /// Mean swaps applied per step.
    pub mean_swaps_per_step: f64,
    /// Shift-response detections (adaptive+shift-response only).
    pub shift_detections: u64,
    /// Moves verified byte-exact by the [`MemoryExecutor`], if one ran.
    pub verified_moves: Option<u64>,
    /// Bytes on the host link and the modelled stall, overall, per window and (if asked for) per
    /// step.
    #[serde(default)]
    pub bytes: ByteReport,
    /// Per-drain telemetry, if asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub telemetry: Vec<DrainTelemetry>,
}

impl ReplayReport {
    /// The per-drain telemetry as JSON lines (one line per drain, `\n`-terminated).
    pub fn telemetry_json_lines(&self) -> String {
        self.telemetry
            .iter()
            .map(|t| t.to_json_line() + "\n")
            .collect()
    }
}

/// [`replay_with`] with [`ReplayOptions::default`].
pub fn replay(
    trace: &Trace,
    geometry: &Geometry,
    policy: &PolicySpec,
    cfg: &ControllerConfig,
) -> Result<ReplayReport> {
    replay_with(trace, geometry, policy, cfg, &ReplayOptions::default())
}

/// [`ReplayOptions::count_run_starts`]: the step each `(layer, expert)` was last picked.
struct RunStarts {
    experts: usize,
    weight: u32,
    /// Step index + 1 of the last pick per `(layer, expert)` cell (0: never).
    last: Vec<u64>,
    step: u64,
}

impl RunStarts {
    fn new(geometry: &Geometry, weight: u32) -> Self {
        let experts = geometry.experts_per_layer as usize;
        RunStarts {
            experts,
            weight,
            last: vec![0; geometry.layers as usize * experts],
            step: 0,
        }
    }

    /// Records `weight` picks for each expert whose run starts at this step (once per layer).
    fn record(&mut self, counters: &PickCounters, s: &StepPicks) -> Result<()> {
        self.step += 1;
        let now = self.step;
        for (l, picks) in s.layers.iter().enumerate() {
            for &e in picks {
                let cell = &mut self.last[l * self.experts + e as usize];
                let before = std::mem::replace(cell, now);
                if before == 0 || before + 1 < now {
                    for _ in 0..self.weight {
                        counters.record(l as u32, e)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// `(cold lookups, distinct cold pairs)` of a step under `map`.
fn cold_under(map: &ResidencyMap, layers: &[Vec<u32>], uniq: &mut UniqueCold) -> (u64, u64) {
    let rows = map.layers();
    uniq.count(layers, |l, e| rows[l].table()[e] < 0)
}

/// Replays `trace` through `policy` and scores it.
///
/// Per step: the step's lookups are served with the map in force at the step's start (a lookup of
/// a cold expert counts as cold; each distinct cold `(layer, expert)` is read in place once), then
/// its picks are counted and the policy acts at the step boundary (adaptive: [`Controller::step`];
/// LRU: admissions), the swaps committed there counting as this step's copies
/// ([`ByteReport`], priced with [`ReplayOptions::link`]). Deterministic.
///
/// Errors: trace errors of [`validate_trace`]; map errors if a given map has another geometry;
/// [`ExpertError::InvalidConfig`] for bad options ([`ReplayOptions::validate`]), a bad config or a
/// [`MemoryExecutor`] too large for `verify_bytes`.
pub fn replay_with(
    trace: &Trace,
    geometry: &Geometry,
    policy: &PolicySpec,
    cfg: &ControllerConfig,
    opts: &ReplayOptions,
) -> Result<ReplayReport> {
    let lookups = validate_trace(trace, geometry)?;
    opts.validate()?;
    if let PolicySpec::RatioBestTuning(m) = policy {
        let mut best: Option<ReplayReport> = None;
        for c in ratio_tuning_grid() {
            let spec = PolicySpec::Controller(m.clone(), Box::new(c));
            let mut r = replay_with(trace, geometry, &spec, cfg, opts)?;
            if best
                .as_ref()
                .is_none_or(|b| r.bytes.mean_stall_us_per_step < b.bytes.mean_stall_us_per_step)
            {
                r.policy = policy.name().into();
                best = Some(r);
            }
        }
        return best.ok_or_else(|| ExpertError::InvalidConfig("empty tuning grid".into()));
    }
    let boot = |m: &Option<ResidencyMap>| -> Result<ResidencyMap> {
        match m {
            Some(m) => {
                geometry.check_same(m.geometry())?;
                Ok(m.clone())
            }
            None => ResidencyMap::first_k(trace.name.clone(), *geometry),
        }
    };
    let n = trace.steps.len();
    let mut cold_per_step = Vec::with_capacity(n);
    let mut total_per_step = Vec::with_capacity(n);
    let mut swaps_per_step = Vec::with_capacity(n);
    let mut uniq = UniqueCold::new(geometry.experts_per_layer);
    let mut tally = ByteTally::new(&opts.link, geometry.expert_bytes, n);
    let mut stats = SwapStats::default();
    let mut telemetry = Vec::new();
    let mut detections = 0;
    let mut verified = None;
    let mut config = None;

    let mut fixed = |map: ResidencyMap| {
        for s in &trace.steps {
            let (cold, unique) = cold_under(&map, &s.layers, &mut uniq);
            cold_per_step.push(cold);
            swaps_per_step.push(0u32);
            tally.push(unique, 0);
        }
    };
    match policy {
        PolicySpec::Static(m) => fixed(boot(m)?),
        PolicySpec::Seed(m) => fixed(boot(&Some(m.clone()))?),
        PolicySpec::BestStatic(w, r) => fixed(best_static_map(trace, geometry, w, *r)?),
        PolicySpec::OfflineOptimum => {
            for s in crate::experts::optimum::solve(trace, geometry, &opts.link)? {
                cold_per_step.push(s.cold_lookups);
                let copies = u32::try_from(s.copies).unwrap_or(u32::MAX);
                swaps_per_step.push(copies);
                tally.push(s.cold_unique, s.copies);
                stats.planned += s.copies;
                stats.applied += s.copies;
            }
        }
        PolicySpec::Lru(m) => {
            // The modes table's per-layer LRU bank in place: its deterministic eviction order.
            let mut lru = LruBank::new(
                geometry,
                BankScope::PerLayer,
                EngineMode::InPlace,
                Some(&boot(m)?),
                &opts.link,
                &CpuChannel::default(),
            )?;
            for s in &trace.steps {
                let (cold, unique) = uniq.count(&s.layers, |l, e| !lru.is_resident(l, e as u32));
                cold_per_step.push(cold);
                let copies = lru.step(&s.layers).boundary_copies;
                tally.push(unique, copies);
                swaps_per_step.push(u32::try_from(copies).unwrap_or(u32::MAX));
                stats.planned += copies;
                stats.applied += copies;
            }
        }
        PolicySpec::RatioBestTuning(_) => unreachable!("handled above"),
        PolicySpec::Adaptive(m)
        | PolicySpec::AdaptiveShiftResponse(m)
        | PolicySpec::Controller(m, _) => {
            let c = match policy {
                PolicySpec::Adaptive(_) => ControllerConfig {
                    shift_response: None,
                    ..cfg.clone()
                },
                PolicySpec::Controller(_, c) => (**c).clone(),
                _ => ControllerConfig {
                    shift_response: Some(cfg.shift_response.clone().unwrap_or_default()),
                    ..cfg.clone()
                },
            };
            let map = boot(m)?;
            let mut mem = match opts.verify_bytes {
                Some(b) => Some(MemoryExecutor::new(&map, b, 0x5eed)?),
                None => None,
            };
            let mut null = NullExecutor::new();
            let mut ctl = Controller::new(map, c.clone())?;
            let counters = PickCounters::new(geometry)?;
            let mut starts = opts.count_run_starts.map(|w| RunStarts::new(geometry, w));
            for s in &trace.steps {
                let (cold, unique) = cold_under(ctl.map(), &s.layers, &mut uniq);
                cold_per_step.push(cold);
                match starts.as_mut() {
                    Some(r) => r.record(&counters, s)?,
                    None => counters.record_step(s)?,
                }
                let exec: &mut dyn SwapExecutor = match mem.as_mut() {
                    Some(m) => m,
                    None => &mut null,
                };
                let rep = ctl.step(&counters, exec)?;
                // The swaps committed at this boundary: their copies ran during this step.
                tally.push(unique, rep.applied as u64);
                swaps_per_step.push(rep.applied);
                if opts.telemetry {
                    telemetry.extend(rep.drain);
                }
            }
            stats = ctl.stats();
            detections = ctl.shift_detections();
            if let Some(m) = mem.as_mut() {
                // Let in-flight moves land, then check every byte against the final map.
                m.flush()?;
                ctl.step_with(None, m)?;
                m.verify(ctl.map())?;
                verified = Some(m.verified_moves());
            }
            config = Some(c);
        }
    }
    for s in &trace.steps {
        total_per_step.push(s.layers.iter().map(|p| p.len() as u64).sum::<u64>());
    }
    let per_step: Vec<f64> = cold_per_step
        .iter()
        .zip(&total_per_step)
        .map(|(&c, &t)| if t == 0 { 0.0 } else { c as f64 / t as f64 })
        .collect();
    let w = opts.window_steps as usize;
    let cold_share_windows = cold_per_step
        .chunks(w)
        .zip(total_per_step.chunks(w))
        .map(|(c, t)| {
            let (c, t): (u64, u64) = (c.iter().sum(), t.iter().sum());
            if t == 0 {
                0.0
            } else {
                c as f64 / t as f64
            }
        })
        .collect();
    let mut shifts_in: Vec<usize> = trace
        .shifts
        .iter()
        .map(|&s| s as usize)
        .filter(|&s| s < n)
        .collect();
    shifts_in.sort_unstable();
    shifts_in.dedup();
    let last = shifts_in.last().copied().unwrap_or(0);
    let tail = (((n - last) as f64 * opts.steady_fraction).ceil() as usize).clamp(1, n - last);
    let steady_state = SteadyState {
        from_step: (n - tail) as u64,
        to_step: n as u64,
        cold_share: mean(&per_step[n - tail..]),
    };
    let shifts = shifts_in
        .iter()
        .enumerate()
        .filter_map(|(i, &s)| {
            let end = shifts_in.get(i + 1).copied().unwrap_or(n);
            t90(
                &per_step,
                s,
                end,
                opts.steady_fraction,
                opts.smooth_steps as usize,
                opts.step_time_s,
            )
        })
        .collect();
    let cold_all: u64 = cold_per_step.iter().sum();
    let bytes = tally.finish(w, n - tail..n, opts.per_step_bytes);
    Ok(ReplayReport {
        trace: trace.name.clone(),
        policy: policy.name().into(),
        boot: policy.boot_name().into(),
        geometry: *geometry,
        config,
        steps: n as u64,
        lookups,
        window_steps: opts.window_steps,
        cold_share_windows,
        cold_share_overall: cold_all as f64 / lookups as f64,
        steady_state,
        shifts,
        swaps: stats,
        max_swaps_per_step: swaps_per_step.iter().copied().max().unwrap_or(0),
        mean_swaps_per_step: swaps_per_step.iter().map(|&x| x as f64).sum::<f64>() / n as f64,
        shift_detections: detections,
        verified_moves: verified,
        bytes,
        telemetry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_starts_count_each_run_once_per_layer() {
        let g = Geometry::new(2, 4, 2, 1000).unwrap();
        let counters = PickCounters::new(&g).unwrap();
        let mut r = RunStarts::new(&g, 3);
        // Layer 0: expert 0 runs over steps 1-2 and starts again at 4; expert 1 at step 3 (picked
        // by two tokens: one start). Layer 1: expert 2 every step (one run), expert 3 at 1 and 3.
        let steps: [[&[u32]; 2]; 4] = [
            [&[0], &[2, 3]],
            [&[0], &[2]],
            [&[1, 1], &[2, 3]],
            [&[0], &[2]],
        ];
        for s in steps {
            let s = StepPicks {
                layers: s.iter().map(|l| l.to_vec()).collect(),
            };
            r.record(&counters, &s).unwrap();
        }
        // Cells are layer-major: [layer 0: e0 e1 e2 e3, layer 1: e0 e1 e2 e3] × weight 3.
        assert_eq!(counters.snapshot(), vec![6, 3, 0, 0, 0, 0, 3, 6]);
        let bad = ReplayOptions {
            count_run_starts: Some(0),
            ..ReplayOptions::default()
        };
        assert!(bad.validate().is_err());
    }
}
