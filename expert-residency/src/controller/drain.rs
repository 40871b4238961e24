//! One drain, one job per function: deltas and the cold-share window, the shift response, the EMA
//! fold, planning through the policy, telemetry.

use super::touch::touch_prob_inv;
use super::Controller;
use crate::config::ShiftResponse;
use crate::policy::LayerHeat;
use crate::telemetry::DrainTelemetry;

/// Shift-response state.
#[derive(Clone, Debug, Default)]
pub(super) struct ShiftState {
    /// EMA of past drains' cold shares (`None` before the first drain with picks).
    pub(super) baseline: Option<f64>,
    /// Drains of boost left (0: normal half-life and cap).
    pub(super) boost_left: u32,
    /// Jumps detected so far.
    pub(super) detections: u64,
    /// Drains pooled since the last test: (cold, total) picks.
    pub(super) pooled: (u64, u64),
}

/// What the shift detector did at one drain.
enum ShiftEvent {
    /// Nothing changes.
    None,
    /// A jump: boost (shorter half-life, higher cap) and forget `forget_steps` extra steps.
    Jump,
    /// The boost ran out: back to the normal half-life.
    BoostOver,
}

impl ShiftState {
    /// Feeds one drain's (cold, total) picks to the detector (only drains with picks count).
    /// Drains are pooled until they hold `min_picks`; the pooled cold share `c` is a jump iff
    /// `c ≥ jump_ratio × baseline` and `c − baseline ≥ max(jump_min, z·√(b(1−b)/picks))`.
    /// While boosted, every drain counts down the boost whether or not it completed a pool.
    fn observe(&mut self, sr: &ShiftResponse, cold: u64, total: u64) -> ShiftEvent {
        self.pooled.0 += cold;
        self.pooled.1 += total;
        if self.pooled.1 < sr.min_picks {
            return self.count_down();
        }
        let (c, t) = std::mem::take(&mut self.pooled);
        let cold_share = share(c, t);
        let Some(b) = self.baseline else {
            self.baseline = Some(cold_share);
            return ShiftEvent::None;
        };
        let noise = sr.z * (b * (1.0 - b) / t as f64).sqrt();
        let jump_min = sr.jump_min.max(noise);
        let event = if cold_share >= b * sr.jump_ratio && cold_share >= b + jump_min {
            self.detections += 1;
            self.boost_left = sr.boost_drains;
            ShiftEvent::Jump
        } else {
            self.count_down()
        };
        let a = 0.5f64.powf(1.0 / sr.baseline_half_life_drains);
        self.baseline = Some(b * a + cold_share * (1.0 - a));
        event
    }

    /// One drain of boost less; `BoostOver` when it runs out.
    fn count_down(&mut self) -> ShiftEvent {
        if self.boost_left > 0 {
            self.boost_left -= 1;
            if self.boost_left == 0 {
                return ShiftEvent::BoostOver;
            }
        }
        ShiftEvent::None
    }
}

fn share(cold: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        cold as f64 / total as f64
    }
}

/// An interval's expert touches, estimated from its pick deltas ([`touch_layer`]).
#[derive(Clone, Copy, Debug, Default)]
struct Touched {
    /// Σ over layers of the touched experts per step.
    per_step_sum: f64,
    /// Layers with picks.
    layers_with_picks: u32,
    /// Touched expert-steps, all layers.
    all: f64,
    /// Their cold part (experts not resident).
    cold: f64,
    /// Layers whose interval was a burst (counted by the exact lower bound).
    bursts: u32,
}

/// An interval whose picks per step exceed this multiple of the layer's smoothed picks per step
/// holds a burst: a prefill pass (hundreds of tokens in one step) or a burst of requests. Its
/// touched steps are counted by their exact lower bound, 1 per expert picked, instead of the
/// estimate, which would spread the burst's picks over every step of the interval as if decode
/// had made them (a 135-token prompt at top-2 over 8 experts: ~34 picks per expert, read as 34
/// touched steps in a 34-step interval where the link paid for one). A burst also leaves the
/// adaptive cadence alone. 4: a decode batch that grows from 1 to 32 reads as a burst for ~4
/// drains while the smoothed rate catches up (each drain takes at most 4× the old rate).
const BURST_FACTOR: f64 = 4.0;

impl Controller {
    /// Drains `snap` (length checked by the callers): the "drain + decide" of one interval.
    pub(super) fn drain_from(&mut self, snap: &[u32]) -> DrainTelemetry {
        let elapsed = self.step - self.last_drain_step;
        self.last_drain_step = self.step;
        self.drains += 1;
        // Touched steps of the interval (and the adapted half-life) before anything folds, for the
        // policies and cadences that learn from them (the default's); the telemetry then also
        // reports them in the link's unit.
        let touches = self.cfg.adaptive.is_some() || self.policy.uses_touch();
        let (cold, picks, touched) = self.take_deltas(snap, touches.then_some(elapsed));
        let cold_share = share(cold, picks);
        if let Some(t) = touched.as_ref().filter(|t| t.bursts == 0) {
            self.adapt_cadence(t.per_step_sum, t.layers_with_picks);
        }
        // Detect before folding so that a boosted half-life applies to this very fold.
        let forget = if picks > 0 {
            self.respond_to_shift(cold, picks)
        } else {
            None
        };
        let hl = self.half_life_in_force();
        self.ema
            .set_half_life(hl)
            .expect("validated, finite and > 0");
        let decay_steps = elapsed.saturating_add(forget.unwrap_or(0));
        self.ema
            .fold(&self.deltas, decay_steps)
            .expect("lengths fixed at new");
        if touches {
            let f = self.ema.decay_factor(decay_steps);
            for (t, x) in self.touch.iter_mut().zip(&self.touch_scratch) {
                *t = *t * f + x;
            }
        }
        let cap = self.per_layer_cap();
        let planned = if self.frozen { 0 } else { self.plan(cap) };
        let mut t = self.telemetry(elapsed, picks, cold_share, planned, cap, forget.is_some());
        if let Some(x) = touched {
            t.touched = Some(x.all);
            t.cold_share_touched = Some(if x.all > 0.0 { x.cold / x.all } else { 0.0 });
            t.host_bytes_per_step =
                Some(x.cold * self.map.geometry().expert_bytes as f64 / elapsed.max(1) as f64);
        }
        t
    }

    /// A drain whose snapshot went backwards (a counter table re-created or zeroed under the
    /// controller; found by `check_counter_reset`) under [`crate::OnCounterReset::Rebaseline`]:
    /// `snap` becomes the reference and the interval is dropped. Nothing is folded (its deltas
    /// would be ~2^32 phantom picks, or a part of a new table's counts), nothing is planned, and
    /// the EMA, the window, the shift detector and the queue are kept: the traffic did not
    /// change, only the table. Counted in `counter_resets`.
    pub(super) fn rebaseline_drain(&mut self, snap: &[u32]) -> DrainTelemetry {
        let elapsed = self.step - self.last_drain_step;
        self.last_drain_step = self.step;
        self.drains += 1;
        self.counter_resets += 1;
        self.prev.copy_from_slice(snap);
        self.deltas.iter_mut().for_each(|d| *d = 0);
        let cap = self.per_layer_cap();
        let mut t = self.telemetry(elapsed, 0, 0.0, 0, cap, false);
        t.counter_reset = true;
        t
    }

    /// One fused pass per layer: wrap-around-safe deltas (u32 → u64) into `deltas`, `snap` as the
    /// new reference snapshot, and the interval's (cold, total) picks with the map as it is now,
    /// recorded in the cold-share window. With `touch_elapsed` (the interval's steps), the
    /// layer's touched steps are then estimated from its deltas while they are still in cache
    /// ([`touch_layer`]), and their cold part, recorded in the touched window. Returns (cold,
    /// total) picks over all layers and, with `touch_elapsed`, the [`Touched`] sums.
    fn take_deltas(
        &mut self,
        snap: &[u32],
        touch_elapsed: Option<u64>,
    ) -> (u64, u64, Option<Touched>) {
        let experts = self.map.geometry().experts_per_layer as usize;
        let layers = self.map.layers().len();
        let wbase = self.window_pos * layers;
        let n = touch_elapsed.map(|e| e.max(1) as f64);
        let step = self.step;
        let mut touched = Touched::default();
        let (mut cold_all, mut total_all) = (0u64, 0u64);
        for (l, row) in self.map.layers().iter().enumerate() {
            let r = l * experts..(l + 1) * experts;
            let (mut cold, mut total) = (0u64, 0u64);
            for (((d, p), &s), &slot) in self.deltas[r.clone()]
                .iter_mut()
                .zip(&mut self.prev[r.clone()])
                .zip(&snap[r.clone()])
                .zip(row.table())
            {
                let x = s.wrapping_sub(*p) as u64;
                *p = s;
                *d = x;
                total += x;
                // slot < 0 (not resident) → all-ones mask.
                cold += x & ((slot >> 31) as i64 as u64);
            }
            self.window[wbase + l] = (cold, total);
            cold_all += cold;
            total_all += total;
            let Some(n) = n else { continue };
            let burst = burst_update(&mut self.picks_per_step[l], total, n);
            touched.bursts += u32::from(burst);
            let (mut cold_t, mut all_t) = (0.0, 0.0);
            if let Some((per_step, cold)) = touch_layer(
                &self.deltas[r.clone()],
                row.table(),
                &mut self.touch_scratch[r.clone()],
                &mut self.last_touch[r],
                n,
                step,
                burst,
            ) {
                touched.per_step_sum += per_step;
                touched.layers_with_picks += 1;
                all_t = n * per_step;
                cold_t = cold;
            }
            self.window_touched[wbase + l] = (cold_t, all_t);
            touched.cold += cold_t;
            touched.all += all_t;
        }
        self.window_pos = (self.window_pos + 1) % self.cfg.window_drains as usize;
        (cold_all, total_all, n.map(|_| touched))
    }

    /// The shift response (if configured) for a drain with picks: on a jump, starts the boost
    /// (a shorter half-life, [`Controller::half_life_in_force`]) and returns the extra steps to
    /// forget (scaled with the half-life under the adaptive cadence). `Some` iff a jump was
    /// detected.
    fn respond_to_shift(&mut self, cold: u64, picks: u64) -> Option<u64> {
        let sr = self.cfg.shift_response.as_ref()?;
        match self.shift.observe(sr, cold, picks) {
            ShiftEvent::Jump => {
                let scale = if self.cfg.adaptive.is_some() {
                    self.base_half_life / self.cfg.half_life_steps
                } else {
                    1.0
                };
                Some((sr.forget_steps as f64 * scale).round() as u64)
            }
            ShiftEvent::None | ShiftEvent::BoostOver => None,
        }
    }

    /// The EMA half-life in force, steps: the adapted (or configured) one, shortened while the
    /// shift response is boosted (to `boost_half_life_steps`, or by the same factor
    /// `boost_half_life_steps / half_life_steps` under the adaptive cadence).
    pub(super) fn half_life_in_force(&self) -> f64 {
        match &self.cfg.shift_response {
            Some(sr) if self.shift.boost_left > 0 => {
                if self.cfg.adaptive.is_some() {
                    (self.base_half_life * sr.boost_half_life_steps / self.cfg.half_life_steps)
                        .max(1e-3)
                } else {
                    sr.boost_half_life_steps
                }
            }
            _ => self.base_half_life,
        }
    }

    /// Under the adaptive cadence, re-derives the half-life and the next drain's distance from
    /// the experts touched per step (`sum_touched` over `layers_with_picks` layers, from
    /// [`touch_layer`]).
    fn adapt_cadence(&mut self, sum_touched: f64, layers_with_picks: u32) {
        let experts = self.map.geometry().experts_per_layer as usize;
        let Some(a) = self.cfg.adaptive else {
            return;
        };
        if layers_with_picks == 0 {
            return;
        }
        let s_now = sum_touched / layers_with_picks as f64;
        let s = match self.touched_per_step {
            Some(old) => 0.5 * old + 0.5 * s_now,
            None => s_now,
        };
        self.touched_per_step = Some(s);
        let hl = (a.touches_per_half_life * experts as f64 / s.max(1e-9))
            .clamp(a.min_half_life_steps, a.max_half_life_steps);
        self.base_half_life = hl;
        self.drain_gap =
            ((hl / a.drains_per_half_life).round() as u64).clamp(1, self.cfg.drain_every as u64);
    }

    /// The per-layer swap cap in force: the shift response's while boosted, else the config's.
    fn per_layer_cap(&self) -> u32 {
        match &self.cfg.shift_response {
            Some(sr) if self.shift.boost_left > 0 => sr.boost_swaps_per_layer,
            _ => self.cfg.max_swaps_per_layer,
        }
    }

    /// Asks the policy about every layer with no swap queued or in flight and queues what it
    /// chose; returns how many swaps were planned.
    fn plan(&mut self, cap: u32) -> u32 {
        let experts = self.map.geometry().experts_per_layer as usize;
        let per_step = self.cfg.swaps_per_step(self.map.geometry().expert_bytes);
        let mut planned = 0;
        for l in 0..self.map.layers().len() {
            if self.busy[l] != 0 {
                continue;
            }
            self.choices.clear();
            let r = l * experts..(l + 1) * experts;
            let layer = LayerHeat {
                layer: l as u32,
                heat: &self.ema.values()[r.clone()],
                touch: &self.touch[r.clone()],
                last_touch: &self.last_touch[r],
                step: self.step,
                half_life_steps: self.ema.half_life_steps(),
                expert_bytes: self.map.geometry().expert_bytes,
                row: &self.map.layers()[l],
                max_swaps: cap,
                max_swaps_per_step: per_step,
            };
            self.policy.plan(&layer, &mut self.choices);
            planned += self.queue_choices(l as u32, cap);
        }
        planned
    }

    /// The drain record.
    fn telemetry(
        &self,
        elapsed: u64,
        picks: u64,
        cold_share: f64,
        planned: u32,
        cap: u32,
        shift_detected: bool,
    ) -> DrainTelemetry {
        let layers = self.map.layers().len();
        let (mut wc, mut wt) = (0u64, 0u64);
        let per_layer = (0..layers)
            .map(|l| {
                let (c, t) = (0..self.cfg.window_drains as usize)
                    .map(|k| self.window[k * layers + l])
                    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                wc += c;
                wt += t;
                share(c, t)
            })
            .collect();
        let (tc, tt) = self
            .window_touched
            .iter()
            .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        DrainTelemetry {
            step: self.step,
            drain: self.drains,
            elapsed_steps: elapsed,
            picks,
            cold_share,
            cold_share_window: share(wc, wt),
            cold_share_per_layer: per_layer,
            touched: None,
            cold_share_touched: None,
            cold_share_touched_window: (self.cfg.adaptive.is_some() || self.policy.uses_touch())
                .then_some(if tt > 0.0 { tc / tt } else { 0.0 }),
            host_bytes_per_step: None,
            planned,
            queued: self.queue.len() as u32,
            in_flight: self.in_flight_count(),
            totals: self.stats,
            frozen: self.frozen,
            half_life_steps: self.ema.half_life_steps(),
            max_swaps_per_layer: cap,
            shift_detected,
            boost_drains_left: self.shift.boost_left,
            counter_reset: false,
            counter_resets: self.counter_resets,
        }
    }
}

/// Whether a layer's interval of `n` steps with `picks` picks is a burst (see [`BURST_FACTOR`]),
/// with `mean`, the layer's smoothed picks per step, updated (halfway to this interval's rate,
/// capped at `BURST_FACTOR ×` the old one; an interval without picks leaves it).
fn burst_update(mean: &mut f64, picks: u64, n: f64) -> bool {
    if picks == 0 {
        return false;
    }
    let rate = picks as f64 / n;
    if *mean <= 0.0 {
        *mean = rate;
        return false;
    }
    let burst = rate > BURST_FACTOR * *mean;
    *mean = 0.5 * *mean + 0.5 * rate.min(BURST_FACTOR * *mean);
    burst
}

/// One layer's touched steps of an interval of `n` steps (see `touch.rs`): `n · τ(d)` per cell
/// into `x` (0 where `d` is 0), `step` stamped into `last` where `d > 0`. A `burst` interval is
/// counted by its exact lower bound instead: 1 where `d > 0` (see [`BURST_FACTOR`]). Returns the
/// sum of `τ` over the layer and the sum of `x` over its cold cells (`table[e] < 0`), both in
/// expert order, or `None` (and `x` all zeros) if it had no picks.
///
/// Small pick counts repeat across a layer's experts: a first pass over the (cached) deltas finds
/// the largest and which counts below `MEMO` (64) occur, `τ` is evaluated once for each of those
/// (independent evaluations, no branch per cell), and the cells read it from the table.
fn touch_layer(
    d: &[u64],
    table: &[i32],
    x: &mut [f64],
    last: &mut [u64],
    n: f64,
    step: u64,
    burst: bool,
) -> Option<(f64, f64)> {
    const MEMO: usize = 64;
    // Four accumulators for the maxima (they do not chain cell after cell); the counts present
    // are marked in a byte table (a store per cell, index clamped to `MEMO`: cheaper than a
    // variable shift into a bitmask).
    let mut mx = [0u64; 4];
    let mut present = [0u8; MEMO + 1];
    let chunks = d.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..4 {
            mx[k] = mx[k].max(c[k]);
            present[c[k].min(MEMO as u64) as usize] = 1;
        }
    }
    for &v in rest {
        mx[0] = mx[0].max(v);
        present[v.min(MEMO as u64) as usize] = 1;
    }
    let max_d = mx[0].max(mx[1]).max(mx[2].max(mx[3]));
    if max_d == 0 {
        x.iter_mut().for_each(|v| *v = 0.0);
        return None;
    }
    if burst {
        // A burst interval: its exact lower bound, one touched step per expert picked, however
        // many tokens picked it (a prefill's hundreds of tokens count once).
        let (mut touched, mut cold) = (0.0, 0.0);
        for (((&d, &slot), x), last) in d.iter().zip(table).zip(x.iter_mut()).zip(last.iter_mut()) {
            let hit = d > 0;
            *x = f64::from(u8::from(hit));
            touched += *x;
            if hit {
                *last = step;
                if slot < 0 {
                    cold += 1.0;
                }
            }
        }
        return Some((touched / n.max(1.0), cold));
    }
    let inv_n = 1.0 / n;
    let tokens = (max_d as f64 * inv_n).max(1.0);
    let inv_tokens = 1.0 / tokens;
    let tau_of = |d: u64| touch_prob_inv(d as f64 * inv_n, tokens, inv_tokens);
    let mut memo = [0.0f64; MEMO];
    // d = 0 is never read from the table.
    for k in 1..MEMO {
        if present[k] != 0 {
            memo[k] = tau_of(k as u64);
        }
    }
    // Two sums in expert order (the cold one skips hot cells and zeros, which add nothing to a
    // sum ≥ 0): the same bits as summing afterwards, one pass fewer.
    let (mut touched, mut cold) = (0.0, 0.0);
    for (((&d, &slot), x), last) in d.iter().zip(table).zip(x.iter_mut()).zip(last.iter_mut()) {
        if d == 0 {
            *x = 0.0;
            continue;
        }
        let tau = if d < MEMO as u64 {
            memo[d as usize]
        } else {
            tau_of(d)
        };
        touched += tau;
        *x = n * tau;
        if slot < 0 {
            cold += *x;
        }
        *last = step;
    }
    Some((touched, cold))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::touch::touch_prob_inv;
    use rand::{Rng, SeedableRng};

    /// [`touch_layer`] as its contract reads, cell by cell: `τ` evaluated for every cell (no
    /// table of small counts), the cold sum taken afterwards over the written cells.
    fn touch_layer_ref(
        d: &[u64],
        table: &[i32],
        n: f64,
        burst: bool,
    ) -> Option<(Vec<f64>, f64, f64)> {
        let max_d = d.iter().copied().max().unwrap_or(0);
        if max_d == 0 {
            return None;
        }
        let tokens = (max_d as f64 * (1.0 / n)).max(1.0);
        let x: Vec<f64> = d
            .iter()
            .map(|&d| match (d, burst) {
                (0, _) => 0.0,
                (_, true) => 1.0,
                _ => n * touch_prob_inv(d as f64 * (1.0 / n), tokens, 1.0 / tokens),
            })
            .collect();
        let touched = if burst {
            x.iter().sum::<f64>() / n.max(1.0)
        } else {
            let mut s = 0.0;
            for &d in d.iter().filter(|&&d| d > 0) {
                s += touch_prob_inv(d as f64 * (1.0 / n), tokens, 1.0 / tokens);
            }
            s
        };
        let cold = x
            .iter()
            .zip(table)
            .filter(|(_, &slot)| slot < 0)
            .map(|(x, _)| x)
            .sum();
        Some((x, touched, cold))
    }

    #[test]
    fn touch_layer_matches_the_cell_by_cell_estimate() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for round in 0..3000 {
            let e = rng.random_range(1..400usize);
            let top = [1u64, 3, 63, 64, 65, 200, 5000][round % 7];
            let d: Vec<u64> = (0..e)
                .map(|_| {
                    if rng.random_range(0..3) == 0 {
                        0
                    } else {
                        rng.random_range(0..=top)
                    }
                })
                .collect();
            let table: Vec<i32> = (0..e)
                .map(|i| {
                    if rng.random_range(0..4) == 0 {
                        i as i32
                    } else {
                        -1
                    }
                })
                .collect();
            let n = [1.0, 7.0, 64.0][round % 3];
            let burst = round % 5 == 0;
            let (mut x, mut last) = (vec![f64::NAN; e], vec![3u64; e]);
            let got = touch_layer(&d, &table, &mut x, &mut last, n, 9, burst);
            match touch_layer_ref(&d, &table, n, burst) {
                None => {
                    assert!(got.is_none(), "round {round}");
                    assert!(x.iter().all(|&v| v == 0.0));
                }
                Some((want_x, touched, cold)) => {
                    let (t, c) = got.expect("picks");
                    assert_eq!(t.to_bits(), touched.to_bits(), "touched, round {round}");
                    // Equal as numbers: a layer without cold experts sums to −0.0 under `sum`
                    // (its start) and to +0.0 here; the drain adds it to +0.0 totals either way.
                    assert!(c == cold, "cold {c} vs {cold}, round {round}");
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&x), bits(&want_x), "x, round {round}");
                    for (&d, &l) in d.iter().zip(&last) {
                        assert_eq!(l, if d > 0 { 9 } else { 3 });
                    }
                }
            }
        }
    }
}
