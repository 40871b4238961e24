//! The residency controller: drains pick counts into an EMA, asks a [`SwapPolicy`] what to swap,
//! drives an executor.
//!
//! - `mod.rs`: the controller's state and public API (steps, freeze, baseline reset, map requests).
//! - `drain.rs`: one drain, one job per function (deltas, window, shift response, EMA fold,
//!   planning through the policy, telemetry).
//! - `swaps.rs`: the swap queue (commit, begin, cancel) and its accounting.
//! - `control.rs`: the control message (freeze, baseline) and the counter-reset check.

mod control;
mod drain;
mod swaps;
mod touch;

pub use control::ControlMessage;

use crate::config::ControllerConfig;
use crate::counters::PickCounters;
use crate::error::{ExpertError, Result};
use crate::executor::{PlannedSwap, SwapExecutor};
#[cfg(doc)]
use crate::policy::{CostPolicy, RatioPolicy};
use crate::policy::{SwapChoice, SwapPolicy};
use crate::rowmap::ResidencyMap;
use crate::telemetry::{DrainTelemetry, SwapStats};
use drain::ShiftState;
use tier_core::alloc::try_filled;
use tier_core::DecayingCounters;

/// What one [`Controller::step`] did.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepReport {
    /// Step count after this call.
    pub step: u64,
    /// Swaps committed by the executor and applied to the rowmap at this boundary.
    pub applied: u32,
    /// Swaps rejected (stale generation) at this boundary.
    pub rejected: u32,
    /// Swaps that failed in the executor at this boundary.
    pub failed: u32,
    /// Swaps begun (handed to the executor) at this boundary (≤ `max_swaps_per_step`).
    pub begun: u32,
    /// The drain record, if this step drained.
    pub drain: Option<DrainTelemetry>,
}

/// Decides, step by step, which experts are hot.
///
/// Call [`Controller::step`] (or [`Controller::step_with`]) once per step boundary, after the
/// step's picks were counted. Every `drain_every` steps the counter deltas (wrap-around safe) are
/// folded into an EMA with a half-life in steps; then, for every layer with no swap queued or in
/// flight, the [`SwapPolicy`] says which cold experts should replace which hot ones (at most the
/// per-layer cap per drain). The controller stamps each swap with the layer's generation, begins
/// at most `max_swaps_per_step` queued swaps per step on the executor (one in flight per layer),
/// and applies to the rowmap the swaps the executor confirms, after a generation check.
///
/// The policy is the config's [`ControllerConfig::policy`]: by default `CostPolicy` (swap when
/// the host bytes saved over the expected residency exceed the copy's cost on the link, heat in
/// touched steps, a cadence adapted to the traffic); `RatioPolicy` is "EMA drain + ratio
/// hysteresis", the published GB300 expert-residency recipe (busiest cold vs least busy hot, swap
/// iff `cold ≥ ratio × hot`, [`ControllerConfig::published_recipe`]); both move only the few
/// experts that matter rather than re-planning every expert as EPLB-style rebalancers do. The optional shift response
/// ([`ControllerConfig::shift_response`](crate::ControllerConfig::shift_response)) lives here, not
/// in the policy: it shortens the EMA half-life and raises the per-layer cap for a while, which
/// any policy sees through [`LayerHeat`](crate::LayerHeat).
///
/// Every method that fails leaves the controller unchanged.
#[derive(Debug)]
pub struct Controller {
    cfg: ControllerConfig,
    map: ResidencyMap,
    ema: DecayingCounters,
    prev: Vec<u32>,
    snap: Vec<u32>,
    deltas: Vec<u64>,
    step: u64,
    last_drain_step: u64,
    drains: u64,
    frozen: bool,
    queue: Vec<PlannedSwap>,
    /// Per layer: swaps queued or in flight.
    busy: Vec<u32>,
    /// Per layer: a swap is in flight.
    in_flight: Vec<bool>,
    stats: SwapStats,
    /// Ring of per-layer (cold, total) of the last `window_drains` drains.
    window: Vec<(u64, u64)>,
    /// Per drain slot and layer: (cold touched expert-steps, touched expert-steps), estimated
    /// from the deltas (`touch.rs`); the unit the link pays in.
    window_touched: Vec<(f64, f64)>,
    window_pos: usize,
    shift: ShiftState,
    policy: Box<dyn SwapPolicy>,
    /// Scratch for one layer's policy choices.
    choices: Vec<SwapChoice>,
    /// Drains that found the counter table gone backwards and re-baselined.
    counter_resets: u64,
    /// EMA of touched steps per cell (same half-life as `ema`).
    touch: Vec<f64>,
    /// One drain's touched steps per cell (scratch).
    touch_scratch: Vec<f64>,
    /// Per cell: step count of the last drain whose interval touched it (0: never).
    last_touch: Vec<u64>,
    /// Experts touched per step per layer, smoothed over drains (adaptive cadence).
    touched_per_step: Option<f64>,
    /// Per layer, picks per step smoothed over drains (0: no drain with picks yet): what tells a
    /// burst interval (a prefill) from decode (`drain.rs`, `BURST_FACTOR`).
    picks_per_step: Vec<f64>,
    /// The half-life chosen by the adaptive cadence (or the config's), steps.
    base_half_life: f64,
    /// Steps from one drain to the next (`drain_every`, or the adapted cadence).
    drain_gap: u64,
}

impl Controller {
    /// A controller starting from `map` (the boot map: first-K, or a seed map) with the policy
    /// `cfg.policy` configures: `CostPolicy` (default), the published `RatioPolicy`, or
    /// `RecencyPolicy`; frozen if `cfg.boot_frozen`. Each part of `cfg`
    /// is checked once: the shared knobs here, the policy's config by the policy's constructor
    /// ([`PolicyConfig::build`](crate::PolicyConfig::build)).
    ///
    /// Errors: [`ExpertError::InvalidConfig`] for a bad config; [`ExpertError::OutOfMemory`] (see
    /// [`Controller::with_policy`]).
    pub fn new(map: ResidencyMap, cfg: ControllerConfig) -> Result<Self> {
        cfg.validate_knobs()?;
        let policy = cfg.policy.build()?;
        Self::build(map, cfg, policy)
    }

    /// A controller starting from `map` that asks `policy` what to swap. `cfg.policy` chooses
    /// and tunes the policy [`Controller::new`] builds and is unused here (not checked);
    /// everything else in `cfg` (drain cadence, half-life, caps, budget, window, shift response)
    /// applies whatever the policy.
    ///
    /// Errors: [`ExpertError::InvalidConfig`] for a bad shared knob; [`ExpertError::OutOfMemory`]
    /// when the host cannot allocate the controller's per-cell tables (about 40 bytes per
    /// `(layer, expert)` cell, plus 16 bytes per layer and window drain).
    pub fn with_policy(
        map: ResidencyMap,
        cfg: ControllerConfig,
        policy: Box<dyn SwapPolicy>,
    ) -> Result<Self> {
        cfg.validate_knobs()?;
        Self::build(map, cfg, policy)
    }

    /// The controller for `cfg`, whose shared knobs are checked, and `policy`.
    fn build(
        map: ResidencyMap,
        cfg: ControllerConfig,
        policy: Box<dyn SwapPolicy>,
    ) -> Result<Self> {
        let g = *map.geometry();
        let cells = g.cells();
        let layers = g.layers as usize;
        let what = "controller tables";
        Ok(Controller {
            ema: DecayingCounters::new(cells, cfg.half_life_steps)?,
            prev: try_filled(cells, 0, what)?,
            snap: try_filled(cells, 0, what)?,
            deltas: try_filled(cells, 0, what)?,
            step: 0,
            last_drain_step: 0,
            drains: 0,
            frozen: cfg.boot_frozen,
            queue: Vec::new(),
            busy: try_filled(layers, 0, what)?,
            in_flight: try_filled(layers, false, what)?,
            stats: SwapStats::default(),
            window: try_filled(layers * cfg.window_drains as usize, (0, 0), what)?,
            window_touched: try_filled(layers * cfg.window_drains as usize, (0.0, 0.0), what)?,
            window_pos: 0,
            shift: ShiftState::default(),
            policy,
            choices: Vec::new(),
            counter_resets: 0,
            touch: try_filled(cells, 0.0, what)?,
            touch_scratch: try_filled(cells, 0.0, what)?,
            last_touch: try_filled(cells, 0, what)?,
            touched_per_step: None,
            picks_per_step: try_filled(layers, 0.0, what)?,
            base_half_life: cfg.half_life_steps,
            drain_gap: Self::first_gap(&cfg),
            cfg,
            map,
        })
    }

    /// Steps to the first drain: 1 under the adaptive cadence (to measure the traffic), else
    /// `drain_every`.
    fn first_gap(cfg: &ControllerConfig) -> u64 {
        if cfg.adaptive.is_some() {
            1
        } else {
            cfg.drain_every as u64
        }
    }

    /// The rowmap as confirmed by the executor.
    pub fn map(&self) -> &ResidencyMap {
        &self.map
    }

    /// The configuration.
    pub fn config(&self) -> &ControllerConfig {
        &self.cfg
    }

    /// The swap policy.
    pub fn policy(&self) -> &dyn SwapPolicy {
        self.policy.as_ref()
    }

    /// Steps seen so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Running swap counts.
    pub fn stats(&self) -> SwapStats {
        self.stats
    }

    /// The EMA of pick counts, `[layers × experts]` row-major f64 (picks per step boundary,
    /// decayed with the half-life in force): the heat the ratio policy plans with.
    pub fn ema_values(&self) -> &[f64] {
        self.ema.values()
    }

    /// The EMA of touched steps, `[layers × experts]` row-major f64 (steps in which an expert was
    /// picked at all, estimated from the picks; decayed with the half-life in force): the heat
    /// the cost-aware policy plans with.
    #[cfg(test)]
    pub(crate) fn touch_values(&self) -> &[f64] {
        &self.touch
    }

    /// The EMA half-life in force, steps (adapted to the traffic under
    /// [`ControllerConfig::adaptive`], shortened while the shift response is boosted).
    pub fn half_life_steps(&self) -> f64 {
        self.ema.half_life_steps()
    }

    /// Swaps queued (planned, not yet begun).
    pub fn queued(&self) -> &[PlannedSwap] {
        &self.queue
    }

    /// Swaps in flight in the executor.
    pub fn in_flight_count(&self) -> u32 {
        self.in_flight.iter().filter(|&&b| b).count() as u32
    }

    /// Whether the next [`Controller::step`] drains (`drain_every` steps since the last drain,
    /// or the adapted cadence): an engine copying a device counter
    /// table copies it only then.
    pub fn drain_due(&self) -> bool {
        self.step + 1 - self.last_drain_step >= self.drain_gap
    }

    /// Shift-response detections so far.
    pub fn shift_detections(&self) -> u64 {
        self.shift.detections
    }

    /// Freezes the map: counting and draining go on, nothing is planned, begun or committed;
    /// queued swaps are cancelled and in-flight ones are discarded at their commit (both counted
    /// in [`SwapStats::cancelled`]).
    pub fn freeze(&mut self) {
        self.frozen = true;
        self.cancel_queued();
    }

    /// Lifts [`Controller::freeze`].
    pub fn unfreeze(&mut self) {
        self.frozen = false;
    }

    /// Whether frozen.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Baseline reset: forget the EMA, the cold-share window and the shift detector, cancel queued
    /// swaps, and take `snapshot` (`[layers × experts]` u32, the current counter table) as the new
    /// reference, so that counts before now (warm-up, a past domain) never reach the EMA.
    ///
    /// Errors: [`ExpertError::LengthMismatch`] (nothing changed).
    pub fn reset_baseline(&mut self, snapshot: &[u32]) -> Result<()> {
        if snapshot.len() != self.prev.len() {
            return Err(ExpertError::LengthMismatch {
                expected: self.prev.len(),
                found: snapshot.len(),
            });
        }
        self.prev.copy_from_slice(snapshot);
        self.ema.reset();
        self.ema.set_half_life(self.cfg.half_life_steps)?;
        self.touch.iter_mut().for_each(|t| *t = 0.0);
        self.last_touch.iter_mut().for_each(|t| *t = 0);
        self.touched_per_step = None;
        self.picks_per_step.iter_mut().for_each(|p| *p = 0.0);
        self.base_half_life = self.cfg.half_life_steps;
        self.drain_gap = Self::first_gap(&self.cfg);
        self.window.iter_mut().for_each(|w| *w = (0, 0));
        self.window_touched.iter_mut().for_each(|w| *w = (0.0, 0.0));
        self.shift = ShiftState {
            detections: self.shift.detections,
            ..ShiftState::default()
        };
        self.last_drain_step = self.step;
        self.cancel_queued();
        Ok(())
    }

    /// Queues the swaps that turn the current hot sets into `target`'s (e.g. loading a new seed
    /// map at run time, or restoring the boot map); they are begun under the usual per-step cap.
    /// Cancels previously queued swaps. Returns how many were queued.
    ///
    /// Errors: [`ExpertError::GeometryMismatch`]; [`ExpertError::Executor`] if swaps are in flight (let them
    /// commit first: `executor.flush()` then one `step`).
    pub fn request_map(&mut self, target: &ResidencyMap) -> Result<u32> {
        let plan = self.map.plan_transition(target)?;
        if self.in_flight_count() > 0 {
            return Err(ExpertError::Executor(format!(
                "{} swaps in flight; let them commit before requesting a map",
                self.in_flight_count()
            )));
        }
        self.cancel_queued();
        for s in &plan {
            self.busy[s.layer as usize] += 1;
        }
        self.stats.planned += plan.len() as u64;
        let n = plan.len() as u32;
        self.queue = plan;
        Ok(n)
    }

    /// One step boundary with a host [`PickCounters`] table: commits what the executor has ready,
    /// drains if due (snapshotting `counters`), and begins queued swaps. A table that went
    /// backwards is handled as [`ControllerConfig::on_counter_reset`] says.
    ///
    /// Errors: [`ExpertError::GeometryMismatch`] if `counters` has another shape or `executor`
    /// holds a bank of another geometry ([`SwapExecutor::geometry`]), or
    /// [`ExpertError::CounterReset`] (nothing changed); executor errors from `commit_ready`.
    pub fn step(
        &mut self,
        counters: &PickCounters,
        executor: &mut dyn SwapExecutor,
    ) -> Result<StepReport> {
        counters.check_geometry(self.map.geometry())?;
        self.check_executor(executor)?;
        let drain = self.drain_due();
        if drain {
            let mut snap = std::mem::take(&mut self.snap);
            counters.snapshot_into(&mut snap)?;
            self.snap = snap;
        }
        let reset = drain && self.check_counter_reset(&self.snap)?;
        self.step_inner(drain, reset, executor)
    }

    /// One step boundary with a counter table copied from the device: `snapshot` (`[layers ×
    /// experts]` u32, row-major) is read only if a drain is due; pass `None` to postpone the drain
    /// to a later step (the elapsed steps are then folded together). A snapshot with a cell below
    /// the previous drain's (a device table re-created or zeroed under the controller) is
    /// handled as [`ControllerConfig::on_counter_reset`] says: re-baselined by default
    /// ([`DrainTelemetry::counter_reset`]), never read as ~2^32 phantom picks.
    ///
    /// Errors: [`ExpertError::LengthMismatch`] for a wrong snapshot length,
    /// [`ExpertError::GeometryMismatch`] for an executor of another geometry
    /// ([`SwapExecutor::geometry`]), [`ExpertError::CounterReset`] under
    /// [`crate::OnCounterReset::Error`] (nothing changed).
    pub fn step_with(
        &mut self,
        snapshot: Option<&[u32]>,
        executor: &mut dyn SwapExecutor,
    ) -> Result<StepReport> {
        self.check_executor(executor)?;
        let (drain, reset) = match snapshot {
            Some(s) if self.drain_due() => {
                if s.len() != self.snap.len() {
                    return Err(ExpertError::LengthMismatch {
                        expected: self.snap.len(),
                        found: s.len(),
                    });
                }
                let reset = self.check_counter_reset(s)?;
                self.snap.copy_from_slice(s);
                (true, reset)
            }
            _ => (false, false),
        };
        self.step_inner(drain, reset, executor)
    }

    /// [`ExpertError::GeometryMismatch`] if `executor` holds a bank of another geometry than
    /// the map's: every swap it was handed would fail, step after step, behind `Ok` reports.
    fn check_executor(&self, executor: &dyn SwapExecutor) -> Result<()> {
        match executor.geometry() {
            Some(g) if g != *self.map.geometry() => Err(ExpertError::GeometryMismatch {
                expected: format!("the controller's map: {}", self.map.geometry()),
                found: format!("the executor's bank: {g}"),
            }),
            _ => Ok(()),
        }
    }

    fn step_inner(
        &mut self,
        drain: bool,
        reset: bool,
        executor: &mut dyn SwapExecutor,
    ) -> Result<StepReport> {
        let mut rep = StepReport::default();
        self.commit(executor, &mut rep)?;
        self.step += 1;
        rep.step = self.step;
        if drain {
            let snap = std::mem::take(&mut self.snap);
            rep.drain = Some(if reset {
                self.rebaseline_drain(&snap)
            } else {
                self.drain_from(&snap)
            });
            self.snap = snap;
        }
        self.begin(executor, &mut rep);
        Ok(rep)
    }

    /// Drains `snapshot` now (whatever the cadence) and plans swaps; returns the drain record.
    /// This is the "drain + decide" the benches time. A table that went backwards is handled
    /// as [`ControllerConfig::on_counter_reset`] says.
    ///
    /// Errors: [`ExpertError::LengthMismatch`], [`ExpertError::CounterReset`] (nothing changed).
    pub fn drain_now(&mut self, snapshot: &[u32]) -> Result<DrainTelemetry> {
        if snapshot.len() != self.snap.len() {
            return Err(ExpertError::LengthMismatch {
                expected: self.snap.len(),
                found: snapshot.len(),
            });
        }
        if self.check_counter_reset(snapshot)? {
            return Ok(self.rebaseline_drain(snapshot));
        }
        Ok(self.drain_from(snapshot))
    }
}

#[cfg(test)]
mod tests;
