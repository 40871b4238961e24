//! The decode step-time model of the serving simulation ([`TimeModel`]: base + per request +
//! per miss, µs) and its running least-squares fit ([`StepSums`]), shared by the simulation
//! ([`crate::kv::serving`]) and the admission rule of [`crate::kv::residency`] that prices misses
//! with the step times it measured.

use kv_elastic::{KvError, Result};

/// Most µs of each term of a [`TimeModel`] (10^9 µs, 1,000 s): with at most `u32::MAX` requests
/// per step and `u64::MAX` steps, every step time and the clock stay finite.
pub const MAX_STEP_TERM_US: f64 = 1e9;

/// Least non-zero `SimConfig::admission_gbps`, GB/s (1 MB/s): a copy of a whole `u64` budget then
/// stalls at most ~1.8 × 10^19 µs, so the clock stays finite.
pub const MIN_ADMISSION_GBPS: f64 = 1e-3;

/// Decode step time model (µs).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TimeModel {
    /// Fixed cost of one decode step (weights read, launch), µs.
    pub step_base_us: f64,
    /// Added cost per request in the batch, µs.
    pub step_per_request_us: f64,
    /// Added cost per demand miss of the step (one token's KV over all layers fetched from host
    /// memory), µs. 0 (the default, and missing in older JSON) keeps misses out of step time, so
    /// all placements share one schedule and their misses compare at equal concurrency; the H200
    /// serving benchmark measured 0.95–0.99 µs (`docs/kv.md`).
    #[serde(default)]
    pub step_per_miss_us: f64,
}

impl TimeModel {
    /// Least-squares fit of `step_base_us + step_per_request_us × batch` to measured decode steps
    /// `(batch, µs)` (e.g. the `steps` of `kv_serving_bench`'s JSON report, one placement). A
    /// negative slope is clamped to 0 (the base is then the mean step). Errors
    /// (`KvError::InvalidConfig`): fewer than two distinct batch sizes, a non-finite or negative
    /// time, or a fitted base that is not > 0.
    pub fn fit(steps: &[(u32, f64)]) -> Result<TimeModel> {
        let mut sums = StepSums::default();
        for &(b, t) in steps {
            sums.add(b, 0, t)?;
        }
        sums.fit_batch_only()
    }

    /// Least-squares fit of `step_base_us + step_per_request_us × batch + step_per_miss_us ×
    /// misses` to measured decode steps `(batch, misses, µs)` (the `steps` of
    /// `kv_serving_bench`'s JSON report: `batch`, `misses`, `step_us`; the pools' placements,
    /// where misses vary). Negative slopes are refitted without that term. Errors
    /// (`KvError::InvalidConfig`): a non-finite or negative time, a degenerate design (fewer than
    /// two distinct batch sizes, or misses collinear with the batch), or a base that is not > 0.
    pub fn fit_with_misses(steps: &[(u32, u64, f64)]) -> Result<TimeModel> {
        let mut sums = StepSums::default();
        for &(b, m, t) in steps {
            sums.add(b, m, t)?;
        }
        sums.fit()
    }
}

/// Running least-squares sums of decode steps `(batch, misses, µs)`: the centred co-moments of
/// [`TimeModel::fit_with_misses`], updated one step at a time (Welford's method), so a caller
/// can refit after every step in O(1) — e.g. an admission rule that prices misses with the
/// step times it measured itself ([`crate::kv::residency`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepSums {
    n: f64,
    mb: f64,
    mm: f64,
    mt: f64,
    sbb: f64,
    smm: f64,
    sbm: f64,
    sbt: f64,
    smt: f64,
    any_miss: bool,
}

impl StepSums {
    /// Adds one step. Error (`KvError::InvalidConfig`, nothing added): `us` not finite and >= 0.
    pub fn add(&mut self, batch: u32, misses: u64, us: f64) -> Result<()> {
        if !(us.is_finite() && us >= 0.0) {
            return Err(KvError::InvalidConfig(format!(
                "step time {us} µs must be finite and >= 0"
            )));
        }
        let (b, m) = (batch as f64, misses as f64);
        self.n += 1.0;
        let (db, dm, dt) = (b - self.mb, m - self.mm, us - self.mt);
        self.mb += db / self.n;
        self.mm += dm / self.n;
        self.mt += dt / self.n;
        let (eb, em, et) = (b - self.mb, m - self.mm, us - self.mt);
        self.sbb += db * eb;
        self.smm += dm * em;
        self.sbm += db * em;
        self.sbt += db * et;
        self.smt += dm * et;
        self.any_miss |= misses > 0;
        Ok(())
    }

    /// Steps added.
    pub fn steps(&self) -> u64 {
        self.n as u64
    }

    /// The two-term fit (`step_per_miss_us` 0) of [`TimeModel::fit`].
    pub fn fit_batch_only(&self) -> Result<TimeModel> {
        if self.n < 2.0 || self.sbb == 0.0 {
            return Err(KvError::InvalidConfig(
                "fitting a step-time model needs steps of at least two batch sizes".into(),
            ));
        }
        let slope = (self.sbt / self.sbb).max(0.0);
        Self::model(self.mt - slope * self.mb, slope, 0.0)
    }

    /// The three-term fit of [`TimeModel::fit_with_misses`] (the two-term one when no step
    /// missed).
    pub fn fit(&self) -> Result<TimeModel> {
        if !self.any_miss {
            return self.fit_batch_only();
        }
        let (sbb, smm, sbm) = (self.sbb, self.smm, self.sbm);
        let det = sbb * smm - sbm * sbm;
        if !(det.is_finite() && det > 1e-9 * (sbb * smm).max(f64::MIN_POSITIVE)) {
            return Err(KvError::InvalidConfig(
                "fitting a step-time model with misses needs steps whose batch and misses vary independently".into(),
            ));
        }
        let mut kb = (self.sbt * smm - self.smt * sbm) / det;
        let mut km = (self.smt * sbb - self.sbt * sbm) / det;
        if km < 0.0 {
            km = 0.0;
            kb = if sbb > 0.0 {
                (self.sbt / sbb).max(0.0)
            } else {
                0.0
            };
        } else if kb < 0.0 {
            kb = 0.0;
            km = if smm > 0.0 {
                (self.smt / smm).max(0.0)
            } else {
                0.0
            };
        }
        Self::model(self.mt - kb * self.mb - km * self.mm, kb, km)
    }

    fn model(base: f64, per_request: f64, per_miss: f64) -> Result<TimeModel> {
        if !(base.is_finite() && base > 0.0) {
            return Err(KvError::InvalidConfig(format!(
                "fitted step_base_us {base} must be > 0"
            )));
        }
        Ok(TimeModel {
            step_base_us: base,
            step_per_request_us: per_request,
            step_per_miss_us: per_miss,
        })
    }
}

impl TimeModel {
    /// Checks the terms (`KvError::InvalidConfig` naming `what`, e.g. the placement):
    /// `step_base_us` in `(0, MAX_STEP_TERM_US]` µs, the per-request and per-miss terms in
    /// `[0, MAX_STEP_TERM_US]` µs ([`MAX_STEP_TERM_US`] keeps every step time and the clock finite).
    pub fn validate(&self, what: &str) -> Result<()> {
        let bad = |m: String| Err(KvError::InvalidConfig(format!("{what}: {m}")));
        let t = *self;
        let max = MAX_STEP_TERM_US;
        if !(t.step_base_us.is_finite() && t.step_base_us > 0.0 && t.step_base_us <= max) {
            return bad(format!(
                "step_base_us {} must be in (0, {max:e}] µs",
                t.step_base_us
            ));
        }
        for (name, v) in [
            ("step_per_miss_us", t.step_per_miss_us),
            ("step_per_request_us", t.step_per_request_us),
        ] {
            if !(v.is_finite() && (0.0..=max).contains(&v)) {
                return bad(format!("{name} {v} must be in [0, {max:e}] µs"));
            }
        }
        Ok(())
    }
}
