//! The residency controller: drains pick counts into an EMA, plans swaps, drives an executor.

use crate::config::ControllerConfig;
use crate::counters::PickCounters;
use crate::error::{Error, Result};
use crate::executor::{PlannedSwap, SwapExecutor, SwapOutcome};
use crate::rowmap::ResidencyMap;
use crate::telemetry::{DrainTelemetry, SwapStats};
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

/// Shift-response state.
#[derive(Clone, Debug, Default)]
struct ShiftState {
    baseline: Option<f64>,
    boost_left: u32,
    detections: u64,
}

/// Decides, step by step, which experts are hot.
///
/// Call [`Controller::step`] (or [`Controller::step_with`]) once per step boundary, after the
/// step's picks were counted. Every `drain_every` steps the counter deltas (wrap-around safe) are
/// folded into an EMA with a half-life in steps; then, per layer, the busiest cold experts are
/// paired with the least busy hot ones and a swap is planned when the cold EMA is at least `ratio`
/// times the hot one (at most `max_swaps_per_layer` per drain; a layer with a swap queued or in
/// flight plans none). Each step at most `max_swaps_per_step` queued swaps are begun on the
/// executor (one in flight per layer), and swaps the executor confirms are applied to the rowmap
/// after a generation check. Policy after the seed (EMA drain + ratio hysteresis, as in
/// EPLB-style rebalancers but moving only the few experts that matter).
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
    window_pos: usize,
    shift: ShiftState,
    cold_scratch: Vec<(f64, u32)>,
    hot_scratch: Vec<(f64, u32)>,
}

impl Controller {
    /// A controller starting from `map` (the boot map: first-K, or a seed map).
    ///
    /// Errors: [`Error::InvalidConfig`] for a bad config.
    pub fn new(map: ResidencyMap, cfg: ControllerConfig) -> Result<Self> {
        cfg.validate()?;
        let g = *map.geometry();
        let cells = g.cells();
        let layers = g.layers as usize;
        Ok(Controller {
            ema: DecayingCounters::new(cells, cfg.half_life_steps)?,
            prev: vec![0; cells],
            snap: vec![0; cells],
            deltas: vec![0; cells],
            step: 0,
            last_drain_step: 0,
            drains: 0,
            frozen: false,
            queue: Vec::new(),
            busy: vec![0; layers],
            in_flight: vec![false; layers],
            stats: SwapStats::default(),
            window: vec![(0, 0); layers * cfg.window_drains as usize],
            window_pos: 0,
            shift: ShiftState::default(),
            cold_scratch: Vec::new(),
            hot_scratch: Vec::new(),
            cfg,
            map,
        })
    }

    /// The rowmap as confirmed by the executor.
    pub fn map(&self) -> &ResidencyMap {
        &self.map
    }

    /// The configuration.
    pub fn config(&self) -> &ControllerConfig {
        &self.cfg
    }

    /// Steps seen so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Running swap counts.
    pub fn stats(&self) -> SwapStats {
        self.stats
    }

    /// The EMA of pick counts, `[layers × experts]` row-major f64 (picks, decayed).
    pub fn ema_values(&self) -> &[f64] {
        self.ema.values()
    }

    /// Swaps queued (planned, not yet begun).
    pub fn queued(&self) -> &[PlannedSwap] {
        &self.queue
    }

    /// Swaps in flight in the executor.
    pub fn in_flight_count(&self) -> u32 {
        self.in_flight.iter().filter(|&&b| b).count() as u32
    }

    /// Whether the next [`Controller::step`] drains (`drain_every` steps since the last drain):
    /// an engine copying a device counter table copies it only then.
    pub fn drain_due(&self) -> bool {
        self.step + 1 - self.last_drain_step >= self.cfg.drain_every as u64
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

    /// Drops every queued swap (counted as cancelled); returns how many.
    pub fn cancel_queued(&mut self) -> u32 {
        let n = self.queue.len() as u32;
        for s in self.queue.drain(..) {
            self.busy[s.layer as usize] -= 1;
        }
        self.stats.cancelled += n as u64;
        n
    }

    /// Baseline reset: forget the EMA, the cold-share window and the shift detector, cancel queued
    /// swaps, and take `snapshot` (`[layers × experts]` u32, the current counter table) as the new
    /// reference, so that counts before now (warm-up, a past domain) never reach the EMA.
    ///
    /// Errors: [`Error::LengthMismatch`] (nothing changed).
    pub fn reset_baseline(&mut self, snapshot: &[u32]) -> Result<()> {
        if snapshot.len() != self.prev.len() {
            return Err(Error::LengthMismatch {
                expected: self.prev.len(),
                found: snapshot.len(),
            });
        }
        self.prev.copy_from_slice(snapshot);
        self.ema.reset();
        self.ema.set_half_life(self.cfg.half_life_steps)?;
        self.window.iter_mut().for_each(|w| *w = (0, 0));
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
    /// Errors: [`Error::GeometryMismatch`]; [`Error::Executor`] if swaps are in flight (let them
    /// commit first: `executor.flush()` then one `step`).
    pub fn request_map(&mut self, target: &ResidencyMap) -> Result<u32> {
        let plan = self.map.plan_transition(target)?;
        if self.in_flight_count() > 0 {
            return Err(Error::Executor(format!(
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
    /// drains if due (snapshotting `counters`), and begins queued swaps.
    ///
    /// Errors: [`Error::GeometryMismatch`] if `counters` has another shape (nothing changed);
    /// executor errors from `commit_ready`.
    pub fn step(
        &mut self,
        counters: &PickCounters,
        executor: &mut dyn SwapExecutor,
    ) -> Result<StepReport> {
        counters.check_geometry(self.map.geometry())?;
        let drain = self.drain_due();
        if drain {
            let mut snap = std::mem::take(&mut self.snap);
            counters.snapshot_into(&mut snap)?;
            self.snap = snap;
        }
        self.step_inner(drain, executor)
    }

    /// One step boundary with a counter table copied from the device: `snapshot` (`[layers ×
    /// experts]` u32, row-major) is read only if a drain is due; pass `None` to postpone the drain
    /// to a later step (the elapsed steps are then folded together).
    ///
    /// Errors: [`Error::LengthMismatch`] for a wrong snapshot length (nothing changed).
    pub fn step_with(
        &mut self,
        snapshot: Option<&[u32]>,
        executor: &mut dyn SwapExecutor,
    ) -> Result<StepReport> {
        let drain = match snapshot {
            Some(s) if self.drain_due() => {
                if s.len() != self.snap.len() {
                    return Err(Error::LengthMismatch {
                        expected: self.snap.len(),
                        found: s.len(),
                    });
                }
                self.snap.copy_from_slice(s);
                true
            }
            _ => false,
        };
        self.step_inner(drain, executor)
    }

    fn step_inner(&mut self, drain: bool, executor: &mut dyn SwapExecutor) -> Result<StepReport> {
        let mut rep = StepReport::default();
        self.commit(executor, &mut rep)?;
        self.step += 1;
        rep.step = self.step;
        if drain {
            let snap = std::mem::take(&mut self.snap);
            rep.drain = Some(self.drain_from(&snap));
            self.snap = snap;
        }
        self.begin(executor, &mut rep);
        Ok(rep)
    }

    /// Drains `snapshot` now (whatever the cadence) and plans swaps; returns the drain record.
    /// This is the "drain + decide" the benches time.
    ///
    /// Errors: [`Error::LengthMismatch`] (nothing changed).
    pub fn drain_now(&mut self, snapshot: &[u32]) -> Result<DrainTelemetry> {
        if snapshot.len() != self.snap.len() {
            return Err(Error::LengthMismatch {
                expected: self.snap.len(),
                found: snapshot.len(),
            });
        }
        Ok(self.drain_from(snapshot))
    }

    fn commit(&mut self, executor: &mut dyn SwapExecutor, rep: &mut StepReport) -> Result<()> {
        if executor.in_flight() == 0 {
            return Ok(());
        }
        let map = &self.map;
        let frozen = self.frozen;
        let done = executor.commit_ready(&mut |s| !frozen && map.check_swap(s).is_ok())?;
        for c in done {
            let l = c.swap.layer as usize;
            if l >= self.in_flight.len() || !self.in_flight[l] {
                // Not ours (an executor bug); never applied.
                self.stats.rejected += 1;
                rep.rejected += 1;
                continue;
            }
            self.in_flight[l] = false;
            self.busy[l] -= 1;
            match c.outcome {
                SwapOutcome::Committed => match self.map.apply(&c.swap) {
                    Ok(()) => {
                        self.stats.applied += 1;
                        rep.applied += 1;
                    }
                    Err(_) => {
                        self.stats.rejected += 1;
                        rep.rejected += 1;
                    }
                },
                SwapOutcome::Discarded if frozen => self.stats.cancelled += 1,
                SwapOutcome::Discarded => {
                    self.stats.rejected += 1;
                    rep.rejected += 1;
                }
                SwapOutcome::Failed => {
                    self.stats.failed += 1;
                    rep.failed += 1;
                }
            }
        }
        Ok(())
    }

    fn begin(&mut self, executor: &mut dyn SwapExecutor, rep: &mut StepReport) {
        if self.frozen || self.queue.is_empty() {
            return;
        }
        let cap = self.cfg.max_swaps_per_step;
        let mut keep = Vec::with_capacity(self.queue.len());
        // Layers whose queued chain died this step (a stale or failed swap invalidates the rest of
        // that layer's chain, which was planned with consecutive generations).
        let mut dead: Vec<u32> = Vec::new();
        for s in std::mem::take(&mut self.queue) {
            let l = s.layer as usize;
            if dead.contains(&s.layer) {
                self.busy[l] -= 1;
                self.stats.rejected += 1;
                rep.rejected += 1;
                continue;
            }
            if rep.begun >= cap || self.in_flight[l] || !executor.can_begin(s.layer) {
                keep.push(s);
                continue;
            }
            if self.map.check_swap(&s).is_err() {
                self.busy[l] -= 1;
                self.stats.rejected += 1;
                rep.rejected += 1;
                dead.push(s.layer);
                continue;
            }
            match executor.begin(&s) {
                Ok(()) => {
                    self.in_flight[l] = true;
                    rep.begun += 1;
                }
                Err(_) => {
                    self.busy[l] -= 1;
                    self.stats.failed += 1;
                    rep.failed += 1;
                    dead.push(s.layer);
                }
            }
        }
        self.queue = keep;
    }

    /// Drains `snap` (length checked by the callers).
    fn drain_from(&mut self, snap: &[u32]) -> DrainTelemetry {
        let g = *self.map.geometry();
        let experts = g.experts_per_layer as usize;
        let layers = g.layers as usize;
        let elapsed = self.step - self.last_drain_step;
        self.last_drain_step = self.step;
        self.drains += 1;

        // One fused pass per layer: wrap-around-safe deltas (u32 → u64), the new reference
        // snapshot, and the interval's cold share with the map as it is now.
        let wbase = self.window_pos * layers;
        let mut cold_all = 0u64;
        let mut total_all = 0u64;
        for l in 0..layers {
            let r = l * experts..(l + 1) * experts;
            let table = self.map.layers()[l].table();
            let mut cold = 0u64;
            let mut total = 0u64;
            for (((d, p), &s), &slot) in self.deltas[r.clone()]
                .iter_mut()
                .zip(&mut self.prev[r.clone()])
                .zip(&snap[r])
                .zip(table)
            {
                let x = s.wrapping_sub(*p) as u64;
                *p = s;
                *d = x;
                total += x;
                // slot < 0 (cold) → all-ones mask.
                cold += x & ((slot >> 31) as i64 as u64);
            }
            self.window[wbase + l] = (cold, total);
            cold_all += cold;
            total_all += total;
        }
        self.window_pos = (self.window_pos + 1) % self.cfg.window_drains as usize;
        let share = |c: u64, t: u64| if t == 0 { 0.0 } else { c as f64 / t as f64 };
        let cold_share = share(cold_all, total_all);

        // Shift response: detect before folding so the boosted half-life applies to this fold.
        let mut detected = false;
        let mut forget = 0u64;
        if let Some(sr) = &self.cfg.shift_response {
            if total_all > 0 {
                match self.shift.baseline {
                    None => self.shift.baseline = Some(cold_share),
                    Some(b) => {
                        if cold_share >= b * sr.jump_ratio && cold_share >= b + sr.jump_min {
                            detected = true;
                            self.shift.detections += 1;
                            self.shift.boost_left = sr.boost_drains;
                            self.ema
                                .set_half_life(sr.boost_half_life_steps)
                                .expect("validated");
                            forget = sr.forget_steps;
                        } else if self.shift.boost_left > 0 {
                            self.shift.boost_left -= 1;
                            if self.shift.boost_left == 0 {
                                self.ema
                                    .set_half_life(self.cfg.half_life_steps)
                                    .expect("validated");
                            }
                        }
                        let a = 0.5f64.powf(1.0 / sr.baseline_half_life_drains);
                        self.shift.baseline = Some(b * a + cold_share * (1.0 - a));
                    }
                }
            }
        }
        self.ema
            .fold(&self.deltas, elapsed.saturating_add(forget))
            .expect("lengths fixed at new");

        let per_layer_cap = if self.shift.boost_left > 0 {
            self.cfg
                .shift_response
                .as_ref()
                .map_or(self.cfg.max_swaps_per_layer, |s| s.boost_swaps_per_layer)
        } else {
            self.cfg.max_swaps_per_layer
        };
        let mut planned = 0u32;
        if !self.frozen {
            for l in 0..layers {
                if self.busy[l] == 0 {
                    planned += self.plan_layer(l, per_layer_cap);
                }
            }
        }

        let mut per_layer = Vec::with_capacity(layers);
        let mut wc = 0u64;
        let mut wt = 0u64;
        for l in 0..layers {
            let (c, t) = (0..self.cfg.window_drains as usize)
                .map(|k| self.window[k * layers + l])
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            per_layer.push(share(c, t));
            wc += c;
            wt += t;
        }
        DrainTelemetry {
            step: self.step,
            drain: self.drains,
            elapsed_steps: elapsed,
            picks: total_all,
            cold_share,
            cold_share_window: share(wc, wt),
            cold_share_per_layer: per_layer,
            planned,
            queued: self.queue.len() as u32,
            in_flight: self.in_flight_count(),
            totals: self.stats,
            frozen: self.frozen,
            half_life_steps: self.ema.half_life_steps(),
            max_swaps_per_layer: per_layer_cap,
            shift_detected: detected,
            boost_drains_left: self.shift.boost_left,
        }
    }

    /// Plans up to `cap` swaps in layer `l`; returns how many.
    fn plan_layer(&mut self, l: usize, cap: u32) -> u32 {
        let g = self.map.geometry();
        let experts = g.experts_per_layer as usize;
        let row = &self.map.layers()[l];
        let vals = &self.ema.values()[l * experts..(l + 1) * experts];
        let cap = cap as usize;
        let cold = &mut self.cold_scratch;
        let hot = &mut self.hot_scratch;
        cold.clear();
        hot.clear();
        let ratio = self.cfg.ratio;
        // Only a cold expert at least `ratio` × the least busy hot one can swap in: find that
        // bound first (one short pass), so that in steady state the scans below insert nothing.
        let hot_min = row
            .hot_experts()
            .iter()
            .map(|&e| vals[e as usize])
            .fold(f64::INFINITY, f64::min);
        let needed = ratio * hot_min;
        // Busiest cold experts with EMA ≥ `needed` (and > 0), descending by EMA (ties: lower id
        // first, as ids are scanned in order). `floor`: the smallest EMA that can still enter the
        // full list. Insertion sort into at most `cap` entries.
        let mut floor = 0.0;
        for (e, (&v, &slot)) in vals.iter().zip(row.table()).enumerate() {
            if slot >= 0 || v <= floor || v < needed {
                continue;
            }
            let mut i = if cold.len() < cap {
                cold.push((v, e as u32));
                cold.len() - 1
            } else {
                cold[cap - 1] = (v, e as u32);
                cap - 1
            };
            while i > 0 && cold[i - 1].0 < cold[i].0 {
                cold.swap(i - 1, i);
                i -= 1;
            }
            if cold.len() == cap {
                floor = cold[cap - 1].0;
            }
        }
        let Some(&(cold_max, _)) = cold.first() else {
            return 0;
        };
        // Least busy hot experts that the busiest cold one beats, ascending by (EMA, id).
        for &e in row.hot_experts() {
            let x = (vals[e as usize], e);
            if x.0 * ratio > cold_max {
                continue;
            }
            let mut i = if hot.len() < cap {
                hot.push(x);
                hot.len() - 1
            } else if x < hot[cap - 1] {
                hot[cap - 1] = x;
                cap - 1
            } else {
                continue;
            };
            while i > 0 && hot[i] < hot[i - 1] {
                hot.swap(i - 1, i);
                i -= 1;
            }
        }
        let mut n = 0u32;
        for (generation, (&(cv, ce), &(hv, he))) in
            (row.generation()..).zip(cold.iter().zip(hot.iter()))
        {
            if cv < ratio * hv {
                break;
            }
            self.queue.push(PlannedSwap {
                layer: l as u32,
                incoming: ce,
                outgoing: he,
                slot: row.slot_of(he).expect("hot expert has a slot"),
                generation,
            });
            n += 1;
        }
        self.busy[l] += n;
        self.stats.planned += n as u64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{NullExecutor, SwapCompletion};
    use crate::geometry::Geometry;
    use crate::picks::StepPicks;

    fn geo() -> Geometry {
        Geometry::new(2, 8, 2, 1 << 10).unwrap()
    }

    fn cfg() -> ControllerConfig {
        ControllerConfig {
            drain_every: 4,
            ..ControllerConfig::default()
        }
    }

    /// Counts `reps` picks of each of `experts` in every layer.
    fn busy(c: &PickCounters, experts: &[u32], reps: usize) {
        let step = StepPicks {
            layers: vec![experts.repeat(reps); 2],
        };
        c.record_step(&step).unwrap();
    }

    /// Refuses the first `fail_begins` begins, then fails the next `fail_commits` commits.
    struct Flaky {
        inner: NullExecutor,
        fail_begins: u32,
        fail_commits: u32,
    }

    impl SwapExecutor for Flaky {
        fn begin(&mut self, s: &PlannedSwap) -> Result<()> {
            if self.fail_begins > 0 {
                self.fail_begins -= 1;
                return Err(Error::Executor("refused".into()));
            }
            self.inner.begin(s)
        }
        fn commit_ready(
            &mut self,
            accept: &mut dyn FnMut(&PlannedSwap) -> bool,
        ) -> Result<Vec<SwapCompletion>> {
            let mut v = self.inner.commit_ready(accept)?;
            for c in &mut v {
                if self.fail_commits > 0 && c.outcome == SwapOutcome::Committed {
                    self.fail_commits -= 1;
                    c.outcome = SwapOutcome::Failed;
                }
            }
            Ok(v)
        }
        fn in_flight(&self) -> usize {
            self.inner.in_flight()
        }
    }

    #[test]
    fn follows_traffic_within_caps() {
        let g = geo();
        let mut ctl = Controller::new(
            ResidencyMap::first_k("t", g).unwrap(),
            ControllerConfig {
                max_swaps_per_step: 1,
                max_swaps_per_layer: 1,
                ..cfg()
            },
        )
        .unwrap();
        let c = PickCounters::new(&g).unwrap();
        let mut ex = NullExecutor::new();
        let mut drains = 0;
        for _ in 0..40 {
            busy(&c, &[5, 6], 3);
            let r = ctl.step(&c, &mut ex).unwrap();
            assert!(r.begun <= 1 && r.applied <= 1);
            if let Some(d) = r.drain {
                drains += 1;
                assert!(d.planned <= 2, "one per layer per drain");
            }
        }
        assert_eq!(drains, 10);
        for l in 0..2 {
            assert!(ctl.map().is_hot(l, 5) && ctl.map().is_hot(l, 6));
        }
        assert_eq!(ctl.stats().applied, 4);
        assert_eq!(ctl.stats().rejected, 0);
    }

    #[test]
    fn ratio_hysteresis_holds_back_close_calls() {
        let g = geo();
        let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg()).unwrap();
        let c = PickCounters::new(&g).unwrap();
        let mut ex = NullExecutor::new();
        for _ in 0..40 {
            // Cold expert 7 is 1.4× the hot ones: below the 1.5 ratio.
            let step = StepPicks {
                layers: vec![vec![0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 7, 7, 7, 7, 7, 7, 7]; 2],
            };
            c.record_step(&step).unwrap();
            ctl.step(&c, &mut ex).unwrap();
        }
        assert_eq!(ctl.stats().planned, 0);
    }

    #[test]
    fn freeze_counts_but_never_swaps() {
        let g = geo();
        let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg()).unwrap();
        let boot = ctl.map().clone();
        let c = PickCounters::new(&g).unwrap();
        let mut ex = NullExecutor::new();
        ctl.freeze();
        for _ in 0..16 {
            busy(&c, &[7], 4);
            let r = ctl.step(&c, &mut ex).unwrap();
            if let Some(d) = r.drain {
                assert!(d.frozen);
                assert_eq!(d.planned, 0);
                assert!(d.cold_share > 0.99);
            }
        }
        assert_eq!(ctl.map(), &boot);
        assert!(ctl.ema_values()[7] > 0.0);
        ctl.unfreeze();
        for _ in 0..8 {
            busy(&c, &[7], 4);
            ctl.step(&c, &mut ex).unwrap();
        }
        assert!(ctl.map().is_hot(0, 7));
    }

    #[test]
    fn failed_and_stale_swaps_are_counted_never_applied() {
        let g = geo();
        let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg()).unwrap();
        let target = ResidencyMap::from_hot_sets("t", g, vec![vec![6, 7], vec![0, 1]]).unwrap();
        assert_eq!(ctl.request_map(&target).unwrap(), 2);
        // Layer 0's chain: swap 1 refused at begin, so swap 2 (planned at generation 1) is stale.
        let mut ex = Flaky {
            inner: NullExecutor::new(),
            fail_begins: 1,
            fail_commits: 0,
        };
        let c = PickCounters::new(&g).unwrap();
        let r = ctl.step(&c, &mut ex).unwrap();
        assert_eq!((r.failed, r.rejected, r.begun), (1, 1, 0));
        assert_eq!(ctl.map().layer(0).unwrap().generation(), 0);
        // Copy failure at commit: nothing applied, the chain's next swap is stale at begin.
        ctl.request_map(&target).unwrap();
        ex.fail_commits = 1;
        ctl.step(&c, &mut ex).unwrap();
        let r = ctl.step(&c, &mut ex).unwrap();
        assert_eq!((r.failed, r.rejected, r.applied), (1, 1, 0));
        assert_eq!(ctl.map().layer(0).unwrap().generation(), 0);
        let s = ctl.stats();
        assert_eq!((s.planned, s.applied, s.failed, s.rejected), (4, 0, 2, 2));
        // A clean run reaches the target.
        ctl.request_map(&target).unwrap();
        for _ in 0..4 {
            ctl.step(&c, &mut ex).unwrap();
        }
        assert!(ctl.map().same_hot_sets(&target));
    }

    #[test]
    fn baseline_reset_forgets_and_errors_change_nothing() {
        let g = geo();
        let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg()).unwrap();
        let c = PickCounters::new(&g).unwrap();
        let mut ex = NullExecutor::new();
        {
            let _warmup = c.pause();
            busy(&c, &[7], 100);
        }
        busy(&c, &[6], 100);
        ctl.reset_baseline(&c.snapshot()).unwrap();
        for _ in 0..4 {
            ctl.step(&c, &mut ex).unwrap();
        }
        assert!(ctl.ema_values().iter().all(|&v| v == 0.0));
        let wrong = PickCounters::new(&Geometry::new(3, 8, 2, 1).unwrap()).unwrap();
        let before = ctl.steps();
        assert!(matches!(
            ctl.step(&wrong, &mut ex),
            Err(Error::GeometryMismatch { .. })
        ));
        assert!(ctl.reset_baseline(&[0; 3]).is_err());
        assert!(ctl.drain_now(&[0; 3]).is_err());
        assert_eq!(ctl.steps(), before);
        assert!(Controller::new(
            ResidencyMap::first_k("t", g).unwrap(),
            ControllerConfig {
                ratio: 0.5,
                ..cfg()
            }
        )
        .is_err());
    }

    #[test]
    fn wrapped_counters_drain_correctly() {
        let g = geo();
        let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg()).unwrap();
        let mut ex = NullExecutor::new();
        let mut snap = vec![u32::MAX - 2; g.cells()];
        ctl.reset_baseline(&snap).unwrap();
        snap[7] = 5; // wrapped: 8 picks of expert 7 in layer 0
        for _ in 0..3 {
            ctl.step_with(None, &mut ex).unwrap();
        }
        let r = ctl.step_with(Some(&snap), &mut ex).unwrap();
        let d = r.drain.expect("due");
        assert_eq!(d.picks, 8);
        assert_eq!(ctl.ema_values()[7], 8.0);
    }

    #[test]
    fn huge_forget_steps_saturate() {
        let g = geo();
        let sr = crate::ShiftResponse {
            forget_steps: u64::MAX,
            jump_ratio: 1.01,
            jump_min: 0.0,
            ..crate::ShiftResponse::default()
        };
        let mut ctl = Controller::new(
            ResidencyMap::first_k("t", g).unwrap(),
            ControllerConfig {
                shift_response: Some(sr),
                ..cfg()
            },
        )
        .unwrap();
        let c = PickCounters::new(&g).unwrap();
        let mut ex = NullExecutor::new();
        // Hot traffic first (cold share 0), then cold traffic: a jump, with u64::MAX forget steps.
        for i in 0..16 {
            busy(&c, if i < 8 { &[0, 1] } else { &[6, 7] }, 2);
            ctl.step(&c, &mut ex).unwrap();
        }
        assert!(ctl.shift_detections() >= 1);
        assert!(ctl.ema_values().iter().all(|v| v.is_finite()));
    }

    mod machine {
        use super::*;
        use crate::memory::MemoryExecutor;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            /// A step whose picks favour experts `hot_bias..hot_bias+2` (per layer), then `step`.
            Step {
                bias: u32,
                tokens: u8,
            },
            Freeze,
            Unfreeze,
            Reset,
            Request(u32),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                12 => (0..8u32, 1..6u8).prop_map(|(bias, tokens)| Op::Step { bias, tokens }),
                1 => Just(Op::Freeze),
                2 => Just(Op::Unfreeze),
                1 => Just(Op::Reset),
                1 => (0..8u32).prop_map(Op::Request),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]
            /// Whatever the sequence: every planned swap is accounted for exactly once (applied,
            /// rejected, failed, cancelled, queued or in flight), at most `max_swaps_per_step`
            /// begin per step, at most one swap is in flight per layer, and the executor's bytes
            /// and table agree with the controller's rowmap after every step.
            #[test]
            fn controller_invariants(ops in prop::collection::vec(op(), 1..120)) {
                let g = Geometry::new(3, 8, 2, 1).unwrap();
                let cfg = ControllerConfig {
                    drain_every: 3,
                    half_life_steps: 10.0,
                    max_swaps_per_step: 2,
                    max_swaps_per_layer: 2,
                    shift_response: Some(crate::ShiftResponse::default()),
                    ..ControllerConfig::default()
                };
                let mut ctl = Controller::new(ResidencyMap::first_k("m", g).unwrap(), cfg).unwrap();
                let mut ex = MemoryExecutor::new(ctl.map(), 8, 1).unwrap();
                let c = PickCounters::new(&g).unwrap();
                for op in ops {
                    match op {
                        Op::Step { bias, tokens } => {
                            let picks: Vec<u32> = (0..tokens as u32)
                                .flat_map(|t| [(bias + t % 2) % 8, (bias + 1 + t) % 8])
                                .collect();
                            c.record_step(&StepPicks { layers: vec![picks; 3] }).unwrap();
                            let r = ctl.step(&c, &mut ex).unwrap();
                            prop_assert!(r.begun <= 2);
                            prop_assert!(ex.in_flight() <= 3);
                            ex.verify(ctl.map()).unwrap();
                        }
                        Op::Freeze => ctl.freeze(),
                        Op::Unfreeze => ctl.unfreeze(),
                        Op::Reset => ctl.reset_baseline(&c.snapshot()).unwrap(),
                        Op::Request(k) => {
                            let hot = (0..3).map(|l| vec![(k + l) % 8, (k + l + 3) % 8]).collect();
                            let target = ResidencyMap::from_hot_sets("m", g, hot).unwrap();
                            // Refused while swaps are in flight; nothing changes then.
                            let before = ctl.stats();
                            if ctl.request_map(&target).is_err() {
                                prop_assert!(ctl.in_flight_count() > 0);
                                prop_assert_eq!(ctl.stats(), before);
                            }
                        }
                    }
                    let s = ctl.stats();
                    prop_assert_eq!(
                        s.planned,
                        s.applied + s.rejected + s.failed + s.cancelled
                            + ctl.queued().len() as u64 + ctl.in_flight_count() as u64
                    );
                    prop_assert_eq!(ctl.in_flight_count() as usize, ex.in_flight());
                }
            }
        }
    }
}
