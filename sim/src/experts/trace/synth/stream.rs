//! [`Synth`]: the streaming generator, its per-layer samplers and the reuse calibration.

use super::super::{StepPicks, TraceError};
use super::SynthConfig;
use rand::distr::weighted::WeightedIndex;
use rand::distr::Distribution;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Largest `k·p_e` used for the sampling weights (keeps `−ln(1 − k·p)` finite).
const MAX_INCLUSION: f64 = 0.99;
/// Tokens of each calibration pass.
const CALIBRATION_TOKENS: usize = 2000;

/// Draws one token's top-k set into `out`: each of `prev`'s experts is kept with probability
/// `keep`, the rest are drawn fresh from `sampler` without replacement.
fn draw_set(
    rng: &mut ChaCha8Rng,
    sampler: &WeightedIndex<f64>,
    k: usize,
    prev: Option<&[u32]>,
    keep: f64,
    out: &mut Vec<u32>,
) {
    let start = out.len();
    if let Some(prev) = prev {
        for &e in prev {
            if rng.random::<f64>() < keep {
                out.push(e);
            }
        }
    }
    while out.len() - start < k {
        let e = sampler.sample(rng) as u32;
        if !out[start..].contains(&e) {
            out.push(e);
        }
    }
}

/// Measured reuse of one token chain of `CALIBRATION_TOKENS` steps with keep probability `keep`.
fn chain_reuse(sampler: &WeightedIndex<f64>, k: usize, keep: f64, seed: u64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut prev = Vec::with_capacity(k);
    let mut cur = Vec::with_capacity(k);
    draw_set(&mut rng, sampler, k, None, keep, &mut prev);
    let mut hits = 0usize;
    for _ in 1..CALIBRATION_TOKENS {
        cur.clear();
        draw_set(&mut rng, sampler, k, Some(&prev), keep, &mut cur);
        hits += cur.iter().filter(|e| prev.contains(e)).count();
        std::mem::swap(&mut prev, &mut cur);
    }
    hits as f64 / (k * (CALIBRATION_TOKENS - 1)) as f64
}

/// Keep probability giving `target` reuse: measures the reuse of independent draws `q`, sets
/// `c = (target − q)/(1 − q)`, measures again, corrects with the effective `q`, then takes one
/// secant step.
fn calibrate_keep(sampler: &WeightedIndex<f64>, k: usize, target: f64, seed: u64) -> f64 {
    let q = chain_reuse(sampler, k, 0.0, seed);
    if target <= q || q >= 1.0 {
        return 0.0;
    }
    let c1 = ((target - q) / (1.0 - q)).clamp(0.0, 1.0);
    if c1 >= 1.0 {
        return 1.0;
    }
    let r1 = chain_reuse(sampler, k, c1, seed);
    let q_eff = ((r1 - c1) / (1.0 - c1)).clamp(0.0, 0.999);
    let c2 = ((target - q_eff) / (1.0 - q_eff)).clamp(0.0, 1.0);
    // One secant step on (c1, r1), (c2, r2) removes what the linear model leaves.
    let r2 = chain_reuse(sampler, k, c2, seed);
    if (r2 - r1).abs() < 1e-6 {
        return c2;
    }
    (c2 + (target - r2) * (c2 - c1) / (r2 - r1)).clamp(0.0, 1.0)
}

/// Streaming generator: an iterator of [`StepPicks`] for a [`SynthConfig`].
#[derive(Debug)]
pub struct Synth {
    cfg: SynthConfig,
    rng: ChaCha8Rng,
    /// `[domain][layer]` fresh-pick samplers.
    samplers: Vec<Vec<WeightedIndex<f64>>>,
    /// `[domain][layer]` calibrated keep probabilities.
    keep: Vec<Vec<f64>>,
    prev: Option<StepPicks>,
    step: u64,
    phase: usize,
}

impl Synth {
    /// Validates the scenario, builds the samplers and calibrates the reuse.
    ///
    /// # Errors
    /// As [`SynthConfig::validate`].
    pub fn new(cfg: SynthConfig) -> Result<Self, TraceError> {
        cfg.validate()?;
        let k = cfg.shape.top_k as usize;
        let mut samplers = Vec::new();
        let mut keep = Vec::new();
        for (d, dom) in cfg.domains.iter().enumerate() {
            let mut ds = Vec::new();
            let mut dk = Vec::new();
            for (l, row) in dom.shares.iter().enumerate() {
                let total: f64 = row.iter().sum();
                let w: Vec<f64> = row
                    .iter()
                    .map(|&p| -(1.0 - (k as f64 * p / total).min(MAX_INCLUSION)).ln())
                    .collect();
                let s = WeightedIndex::new(&w).map_err(|e| {
                    TraceError::InvalidScenario(format!("profile {} layer {l}: {e}", dom.name))
                })?;
                let cal_seed = cfg.seed ^ 0xca1_1b4a7e ^ ((d as u64) << 32 | l as u64);
                dk.push(calibrate_keep(&s, k, cfg.reuse, cal_seed));
                ds.push(s);
            }
            samplers.push(ds);
            keep.push(dk);
        }
        Ok(Self {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            samplers,
            keep,
            prev: None,
            step: 0,
            phase: 0,
        })
    }

    /// The scenario.
    pub fn config(&self) -> &SynthConfig {
        &self.cfg
    }

    /// Calibrated keep probabilities `[domain][layer]`.
    pub fn keep_probabilities(&self) -> &[Vec<f64>] {
        &self.keep
    }
}

impl Iterator for Synth {
    type Item = StepPicks;

    fn next(&mut self) -> Option<StepPicks> {
        if self.step >= self.cfg.steps {
            return None;
        }
        if self
            .cfg
            .phases
            .get(self.phase + 1)
            .is_some_and(|p| p.start_step == self.step)
        {
            self.phase += 1;
            self.prev = None;
        }
        let d = self.cfg.phases[self.phase].domain;
        let k = self.cfg.shape.top_k as usize;
        let tokens = self.cfg.tokens_per_step as usize;
        let mut layers = Vec::with_capacity(self.cfg.shape.layers as usize);
        for l in 0..self.cfg.shape.layers as usize {
            let mut ids = Vec::with_capacity(tokens * k);
            for t in 0..tokens {
                let prev = self.prev.as_ref().map(|p| &p.layers[l][t * k..(t + 1) * k]);
                draw_set(
                    &mut self.rng,
                    &self.samplers[d][l],
                    k,
                    prev,
                    self.keep[d][l],
                    &mut ids,
                );
            }
            layers.push(ids);
        }
        let step = StepPicks { layers };
        self.prev = Some(step.clone());
        self.step += 1;
        Some(step)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.cfg.steps - self.step) as usize;
        (left, Some(left))
    }
}
