//! Synthetic routing traces calibrated to real data, with scheduled domain shifts.
//!
//! Model of one step (one decode forward pass of a batch of `tokens_per_step` sequences):
//! - **Popularity** per domain and layer: a share vector over expert ids ([`DomainProfile`]),
//!   fitted from the OLMoE routing counts ([`super::olmoe`], numbers in code) or read from any
//!   `routing-counts.json`.
//! - **Per-token sampling**: each token picks `top_k` distinct experts. Fresh picks are drawn by
//!   successive sampling without replacement with weights `w_e = −ln(1 − k·p_e)` (Rosén's
//!   approximation of successive-sampling inclusion probabilities, `π_e ≈ 1 − e^{−λ w_e}`), so the
//!   measured pick shares match the fitted `p_e` (checked by a test: total variation ≈ 0.01; with
//!   plain `w = p` the top experts would be under-picked by up to 6 points). `k·p_e` is capped at 0.99.
//! - **Step-to-step reuse**: every expert a token picked at the previous step is kept with
//!   probability `c`, the rest of its set is drawn fresh. `c` is calibrated per domain and layer
//!   (three short deterministic Monte-Carlo passes on common random numbers) so the measured
//!   previous-step reuse ([`super::stats::reuse_per_layer`]) equals the target
//!   [`SynthConfig::reuse`]; the default
//!   [`MIXTRAL_DECODE_REUSE`] = 0.37 is the mean of the real Mixtral decode traces (0.34–0.40 per
//!   layer). Where independent draws already reuse more than the target, `c = 0`.
//! - **Domain shifts**: [`Phase`]s switch every token to another domain's profile at a given step
//!   (the batch turns over to requests of the new domain; previous picks are forgotten).
//!
//! Everything is drawn from one `ChaCha8Rng` seeded with [`SynthConfig::seed`] in a fixed order
//! (step, layer, token), so a seed gives byte-identical traces on every platform.

use super::olmoe::{self, OLMOE_EXPERTS, OLMOE_LAYERS, OLMOE_TOP_K};
use super::{StepPicks, Trace, TraceError, TraceShape};
use rand::distr::weighted::WeightedIndex;
use rand::distr::Distribution;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Previous-token reuse probability of the real Mixtral decode traces (mean over layers; the
/// per-layer range is 0.34–0.40, 0.25 at random).
pub const MIXTRAL_DECODE_REUSE: f64 = 0.37;

/// Largest `k·p_e` used for the sampling weights (keeps `−ln(1 − k·p)` finite).
const MAX_INCLUSION: f64 = 0.99;
/// Tokens of each calibration pass.
const CALIBRATION_TOKENS: usize = 2000;

/// Most steps a scenario may have (2^32; streamed with [`write_binary`], that is already a file of
/// terabytes).
pub const MAX_STEPS: u64 = 1 << 32;
/// Most routed tokens per step (65,536; a decode batch is at most a few thousand).
pub const MAX_TOKENS_PER_STEP: u32 = 1 << 16;
/// Most picks (`layers × tokens_per_step × top_k`) in one step (2^24: 64 MiB of ids).
pub const MAX_PICKS_PER_STEP: u64 = 1 << 24;
/// Most picks (`steps × picks per step`) [`generate`] holds in memory (2^30: 4 GiB of ids; the
/// default scenario has 2^25.1). Longer scenarios stream with [`write_binary`].
pub const MAX_IN_MEMORY_PICKS: u64 = 1 << 30;

/// Expert popularity of one domain: `shares[layer][expert]`, each row summing to 1.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DomainProfile {
    /// Domain name (e.g. `github`).
    pub name: String,
    /// Pick share per layer and expert id.
    pub shares: Vec<Vec<f64>>,
}

impl DomainProfile {
    /// Builds a profile for `layers` layers from measured anchor layers `(layer, shares)`.
    ///
    /// An anchor layer keeps its measured shares and expert ids. Any other layer `l` sits at
    /// position `x = l · last_anchor / (layers − 1)` between anchors `a ≤ x ≤ b` (`t = (x−a)/(b−a)`):
    /// its **sorted** share curve is the linear mix `(1−t)·sorted(a) + t·sorted(b)` (so the skew
    /// moves smoothly between measured layers), the expert ranking is the nearest anchor's (ties to
    /// the lower one), and ids are then relabelled by a fixed per-layer permutation (ChaCha8,
    /// seeded by the layer only). The relabelling is the same for every domain, so the overlap
    /// between domains' hot sets at a layer is the nearest anchor's, as measured.
    ///
    /// # Errors
    /// [`TraceError::InvalidScenario`] for no anchor, anchors of different widths, negative or
    /// non-finite shares, or zero `layers`; [`TraceError::TooLarge`] for `layers × experts` above
    /// the bounds of [`TraceShape::validate`].
    pub fn from_anchors(
        name: &str,
        anchors: &[(u32, Vec<f64>)],
        layers: u32,
    ) -> Result<Self, TraceError> {
        let bad = |m: String| TraceError::InvalidScenario(format!("profile {name}: {m}"));
        if anchors.is_empty() || layers == 0 {
            return Err(bad("needs at least one anchor layer and one layer".into()));
        }
        let experts = anchors[0].1.len();
        // Bound the profile (`layers × experts` shares) before building it.
        u32::try_from(experts)
            .map_err(|_| format!("{experts} experts"))
            .and_then(|e| {
                expert_residency::Geometry::check_shape(layers, e).map_err(|e| e.to_string())
            })
            .map_err(|m| TraceError::TooLarge(format!("profile {name}: {m}")))?;
        let mut anchors: Vec<(u32, Vec<f64>)> = anchors.to_vec();
        anchors.sort_by_key(|a| a.0);
        for (l, s) in &mut anchors {
            if s.len() != experts || experts == 0 {
                return Err(bad(format!("anchor layer {l} has {} experts", s.len())));
            }
            if s.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(bad(format!(
                    "anchor layer {l} has a negative or non-finite share"
                )));
            }
            let t: f64 = s.iter().sum();
            if t <= 0.0 {
                return Err(bad(format!("anchor layer {l} has no pick")));
            }
            s.iter_mut().for_each(|v| *v /= t);
        }
        let last = anchors.last().map_or(0, |a| a.0) as f64;
        let sorted = |s: &[f64]| {
            let mut order: Vec<usize> = (0..s.len()).collect();
            order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
            order
        };
        let mut shares = Vec::with_capacity(layers as usize);
        for l in 0..layers {
            let x = if layers == 1 {
                0.0
            } else {
                l as f64 * last / (layers - 1) as f64
            };
            if let Some(a) = anchors.iter().find(|a| (a.0 as f64 - x).abs() < 1e-9) {
                shares.push(a.1.clone());
                continue;
            }
            let bi = anchors
                .iter()
                .position(|a| a.0 as f64 > x)
                .unwrap_or(anchors.len() - 1);
            let ai = bi.saturating_sub(1);
            let (a, b) = (&anchors[ai], &anchors[bi]);
            let t = if b.0 == a.0 {
                0.0
            } else {
                ((x - a.0 as f64) / (b.0 - a.0) as f64).clamp(0.0, 1.0)
            };
            let (oa, ob) = (sorted(&a.1), sorted(&b.1));
            let rank_order = if t <= 0.5 { &oa } else { &ob };
            let mut perm: Vec<usize> = (0..experts).collect();
            let mut rng = ChaCha8Rng::seed_from_u64(0x7472_6163_6500_0000 ^ l as u64);
            for i in (1..experts).rev() {
                perm.swap(i, rng.random_range(0..=i));
            }
            let mut row = vec![0.0; experts];
            for r in 0..experts {
                let v = (1.0 - t) * a.1[oa[r]] + t * b.1[ob[r]];
                row[perm[rank_order[r]]] = v;
            }
            shares.push(row);
        }
        Ok(Self {
            name: name.to_string(),
            shares,
        })
    }

    /// The OLMoE-1B-7B profile of a domain (`arxiv`, `book`, `c4`, `github`, `tulu`,
    /// `wikipedia`) from the in-code fitted figures, spread over `layers` layers.
    ///
    /// # Errors
    /// [`TraceError::InvalidScenario`] for an unknown domain or zero layers.
    pub fn olmoe(domain: &str, layers: u32) -> Result<Self, TraceError> {
        Self::from_anchors(domain, &olmoe::olmoe_anchor_shares(domain)?, layers)
    }

    /// A profile fitted from a parsed `routing-counts.json` (any model in it, e.g. `olmoe`,
    /// `mistral`), spread over `layers` layers.
    ///
    /// # Errors
    /// [`TraceError::InvalidScenario`] for missing entries or ids not below `experts`.
    pub fn from_routing_counts(
        json: &serde_json::Value,
        model: &str,
        domain: &str,
        experts: u32,
        layers: u32,
    ) -> Result<Self, TraceError> {
        let anchors: Vec<(u32, Vec<f64>)> = olmoe::routing_counts(json, model, domain, experts)?
            .into_iter()
            .map(|(l, c)| (l, c.into_iter().map(|v| v as f64).collect()))
            .collect();
        Self::from_anchors(domain, &anchors, layers)
    }

    fn validate(&self, shape: &TraceShape) -> Result<(), TraceError> {
        let bad = |m: String| TraceError::InvalidScenario(format!("profile {}: {m}", self.name));
        if self.shares.len() != shape.layers as usize {
            return Err(bad(format!(
                "{} layers, the shape has {}",
                self.shares.len(),
                shape.layers
            )));
        }
        for (l, row) in self.shares.iter().enumerate() {
            if row.len() != shape.experts_per_layer as usize {
                return Err(bad(format!("layer {l} has {} experts", row.len())));
            }
            if row.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(bad(format!("layer {l} has a negative or non-finite share")));
            }
            let nonzero = row.iter().filter(|&&v| v > 0.0).count();
            if nonzero < shape.top_k as usize {
                return Err(bad(format!(
                    "layer {l}: only {nonzero} experts with a non-zero share for top-{}",
                    shape.top_k
                )));
            }
        }
        Ok(())
    }
}

/// From `start_step` on, every token routes with profile `domain` (an index into
/// [`SynthConfig::domains`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Phase {
    /// First step of the phase.
    pub start_step: u64,
    /// Index into [`SynthConfig::domains`].
    pub domain: usize,
}

/// A synthetic scenario.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SynthConfig {
    /// Scenario name (the trace's name).
    pub name: String,
    /// Layers, experts per layer, top-k.
    pub shape: TraceShape,
    /// Routed tokens per step (decode batch size).
    pub tokens_per_step: u32,
    /// Steps to generate.
    pub steps: u64,
    /// Target previous-step reuse probability per token and layer, in `[0, 1]`.
    pub reuse: f64,
    /// RNG seed.
    pub seed: u64,
    /// Popularity profiles.
    pub domains: Vec<DomainProfile>,
    /// Phases, the first starting at step 0, start steps increasing.
    pub phases: Vec<Phase>,
}

impl SynthConfig {
    /// The built-in default scenario `olmoe-github-to-book`: OLMoE-1B-7B shape (16 layers, 64
    /// experts, top-8), 32 decode tokens per step, 9,000 steps, github traffic shifting to book at
    /// step 3,000, reuse 0.37 (Mixtral decode), seed 42. Needs no external file.
    pub fn default_scenario() -> Self {
        Self::olmoe_shift("github", "book", 9_000, 3_000, 32, 42)
            .expect("built-in OLMoE domains are valid")
    }

    /// An OLMoE-shaped scenario shifting from domain `from` to `to` at step `shift_at`
    /// (no shift when `shift_at >= steps`), with the Mixtral decode reuse.
    ///
    /// # Errors
    /// [`TraceError::InvalidScenario`] for an unknown domain.
    pub fn olmoe_shift(
        from: &str,
        to: &str,
        steps: u64,
        shift_at: u64,
        tokens_per_step: u32,
        seed: u64,
    ) -> Result<Self, TraceError> {
        let domains = vec![
            DomainProfile::olmoe(from, OLMOE_LAYERS)?,
            DomainProfile::olmoe(to, OLMOE_LAYERS)?,
        ];
        let mut phases = vec![Phase {
            start_step: 0,
            domain: 0,
        }];
        if shift_at < steps {
            phases.push(Phase {
                start_step: shift_at,
                domain: 1,
            });
        }
        Ok(Self {
            name: format!("olmoe-{from}-to-{to}"),
            shape: TraceShape {
                layers: OLMOE_LAYERS,
                experts_per_layer: OLMOE_EXPERTS,
                top_k: OLMOE_TOP_K,
            },
            tokens_per_step,
            steps,
            reuse: MIXTRAL_DECODE_REUSE,
            seed,
            domains,
            phases,
        })
    }

    /// A one-domain scenario of any shape: Zipf popularity with exponent `zipf` (the expert of
    /// rank `r` takes a share ∝ `(r + 1)^−zipf`; 0 is uniform) whose ranking is relabelled per
    /// layer by a fixed stride permutation (rank `r` of layer `l` is expert `(r·389 + l·97 + 13)
    /// mod experts`, a bijection when `experts` is not a multiple of 389), `reuse` previous-step
    /// reuse, `tokens_per_step` tokens, no shift. Named `zipf{zipf}-{layers}x{experts}x{top_k}`.
    /// For shapes no real trace covers (Qwen3-30B-A3B's 128 experts top-8, the 512-expert top-10
    /// scenario); the `wide-reuse` preset is this at 48 × 512, top-10, Zipf 0.5.
    ///
    /// # Errors
    /// [`TraceError::InvalidScenario`] for a negative or non-finite `zipf`, then
    /// [`SynthConfig::validate`]'s errors (shape, zero steps or tokens, reuse outside `[0, 1]`,
    /// sizes above the generator's bounds).
    pub fn zipf(
        shape: TraceShape,
        zipf: f64,
        steps: u64,
        tokens_per_step: u32,
        seed: u64,
        reuse: f64,
    ) -> Result<Self, TraceError> {
        if !zipf.is_finite() || zipf < 0.0 {
            return Err(TraceError::InvalidScenario(format!(
                "zipf exponent {zipf} must be finite and non-negative"
            )));
        }
        shape.validate()?;
        let e = shape.experts_per_layer as usize;
        let norm: f64 = (1..=e).map(|r| (r as f64).powf(-zipf)).sum();
        let shares = (0..shape.layers as usize)
            .map(|l| {
                let mut row = vec![0.0; e];
                for rank in 0..e {
                    row[(rank * 389 + l * 97 + 13) % e] += ((rank + 1) as f64).powf(-zipf) / norm;
                }
                row
            })
            .collect();
        let cfg = Self {
            name: format!(
                "zipf{zipf}-{}x{}x{}",
                shape.layers, shape.experts_per_layer, shape.top_k
            ),
            shape,
            tokens_per_step,
            steps,
            reuse,
            seed,
            domains: vec![DomainProfile {
                name: format!("zipf{zipf}"),
                shares,
            }],
            phases: vec![Phase {
                start_step: 0,
                domain: 0,
            }],
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Steps at which a phase other than the first starts.
    pub fn shifts(&self) -> Vec<u64> {
        self.phases
            .iter()
            .skip(1)
            .map(|p| p.start_step)
            .filter(|&s| s < self.steps)
            .collect()
    }

    /// Picks in one step, `layers × tokens_per_step × top_k`.
    pub fn picks_per_step(&self) -> u64 {
        self.shape.layers as u64 * self.tokens_per_step as u64 * self.shape.top_k as u64
    }

    /// Checks the scenario.
    ///
    /// # Errors
    /// [`TraceError::InvalidScenario`] (zero steps or tokens, reuse outside `[0, 1]`, bad phases,
    /// bad profiles), [`TraceError::TooLarge`] for more than [`MAX_STEPS`] steps, more than
    /// [`MAX_TOKENS_PER_STEP`] tokens or more than [`MAX_PICKS_PER_STEP`] picks per step, shape
    /// errors of [`TraceShape::validate`].
    pub fn validate(&self) -> Result<(), TraceError> {
        self.shape.validate()?;
        let bad = |m: String| TraceError::InvalidScenario(m);
        if self.steps == 0 || self.tokens_per_step == 0 {
            return Err(bad("steps and tokens_per_step must be non-zero".into()));
        }
        if self.steps > MAX_STEPS {
            return Err(TraceError::TooLarge(format!(
                "{} steps exceed the limit of {MAX_STEPS}",
                self.steps
            )));
        }
        if self.tokens_per_step > MAX_TOKENS_PER_STEP {
            return Err(TraceError::TooLarge(format!(
                "{} tokens per step exceed the limit of {MAX_TOKENS_PER_STEP}",
                self.tokens_per_step
            )));
        }
        if self.picks_per_step() > MAX_PICKS_PER_STEP {
            return Err(TraceError::TooLarge(format!(
                "{} picks per step (layers × tokens × top-k) exceed the limit of \
                 {MAX_PICKS_PER_STEP}",
                self.picks_per_step()
            )));
        }
        if !(0.0..=1.0).contains(&self.reuse) {
            return Err(bad(format!("reuse {} is not in [0, 1]", self.reuse)));
        }
        if self.phases.first().map(|p| p.start_step) != Some(0) {
            return Err(bad("the first phase must start at step 0".into()));
        }
        if self
            .phases
            .windows(2)
            .any(|w| w[0].start_step >= w[1].start_step)
        {
            return Err(bad("phase start steps must increase".into()));
        }
        if let Some(p) = self.phases.iter().find(|p| p.domain >= self.domains.len()) {
            return Err(bad(format!(
                "phase at step {} names domain {} of {}",
                p.start_step,
                p.domain,
                self.domains.len()
            )));
        }
        self.domains
            .iter()
            .try_for_each(|d| d.validate(&self.shape))
    }
}

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

impl SynthConfig {
    /// Checks the scenario ([`SynthConfig::validate`]) and that the whole trace fits in memory:
    /// at most [`MAX_IN_MEMORY_PICKS`] picks, and room for the step list.
    ///
    /// # Errors
    /// As [`SynthConfig::validate`]; [`TraceError::TooLarge`] above the limit or when the step
    /// list cannot be allocated.
    pub fn validate_in_memory(&self) -> Result<(), TraceError> {
        self.validate()?;
        let picks = self.steps.saturating_mul(self.picks_per_step());
        if picks > MAX_IN_MEMORY_PICKS {
            return Err(TraceError::TooLarge(format!(
                "{} steps × {} picks per step = {picks} picks exceed the in-memory limit of \
                 {MAX_IN_MEMORY_PICKS} (stream long scenarios with synth::write_binary)",
                self.steps,
                self.picks_per_step()
            )));
        }
        Ok(())
    }

    /// An empty step list with room for every step.
    pub(crate) fn step_list(&self) -> Result<Vec<StepPicks>, TraceError> {
        let mut v = Vec::new();
        v.try_reserve_exact(self.steps as usize).map_err(|e| {
            TraceError::TooLarge(format!("cannot allocate {} steps: {e}", self.steps))
        })?;
        Ok(v)
    }
}

/// Generates the whole trace in memory (at most [`MAX_IN_MEMORY_PICKS`] picks).
///
/// # Errors
/// As [`SynthConfig::validate_in_memory`].
pub fn generate(cfg: &SynthConfig) -> Result<Trace, TraceError> {
    cfg.validate_in_memory()?;
    let mut steps = cfg.step_list()?;
    steps.extend(Synth::new(cfg.clone())?);
    Ok(Trace {
        name: cfg.name.clone(),
        shape: cfg.shape,
        shifts: cfg.shifts(),
        steps,
    })
}

/// Streams the scenario to `out` in the binary format without holding the trace.
///
/// # Errors
/// As [`SynthConfig::validate`] and [`super::binary::BinaryTraceWriter`].
pub fn write_binary<W: std::io::Write>(cfg: &SynthConfig, out: W) -> Result<W, TraceError> {
    let synth = Synth::new(cfg.clone())?;
    let mut w =
        super::binary::BinaryTraceWriter::new(out, &cfg.name, cfg.shape, cfg.steps, &cfg.shifts())?;
    for s in synth {
        w.write_step(&s)?;
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::stats;

    fn small(steps: u64, shift: u64, seed: u64) -> SynthConfig {
        SynthConfig::olmoe_shift("github", "book", steps, shift, 16, seed).unwrap()
    }

    #[test]
    fn same_seed_same_bytes_other_seed_differs() {
        let cfg = small(60, 30, 7);
        let a = write_binary(&cfg, Vec::new()).unwrap();
        let b = write_binary(&cfg, Vec::new()).unwrap();
        assert_eq!(a, b);
        let c = write_binary(&small(60, 30, 8), Vec::new()).unwrap();
        assert_ne!(a, c);
        let t = generate(&cfg).unwrap();
        assert_eq!(super::super::binary::read_binary_bytes(&a, "m").unwrap(), t);
        assert_eq!(t.shifts, vec![30]);
        t.validate().unwrap();
    }

    #[test]
    fn calibration_reuse_and_popularity_match_targets() {
        // 2 domains x 16 layers; enough picks per layer to measure shares to ~0.01 TV.
        let cfg = small(1200, 600, 3);
        let t = generate(&cfg).unwrap();
        let reuse = stats::reuse_per_layer(&t).unwrap();
        for (l, r) in reuse.iter().enumerate() {
            assert!(
                (r - MIXTRAL_DECODE_REUSE).abs() < 0.03,
                "layer {l}: reuse {r}"
            );
        }
        let mean = reuse.iter().sum::<f64>() / reuse.len() as f64;
        assert!(
            (mean - MIXTRAL_DECODE_REUSE).abs() < 0.01,
            "mean reuse {mean}"
        );
        for (phase, range) in [(0, 0..600), (1, 600..1200)] {
            let measured = stats::pick_shares(&t, range).unwrap();
            for l in [0usize, 7, 15, 4] {
                let fitted = &cfg.domains[phase].shares[l];
                let tv = stats::total_variation(&measured[l], fitted);
                assert!(tv < 0.03, "phase {phase} layer {l}: TV {tv}");
                let (a, b) = (
                    stats::top_n_share(&measured[l], 16),
                    stats::top_n_share(fitted, 16),
                );
                assert!(
                    (a - b).abs() < 0.03,
                    "phase {phase} layer {l}: top-16 {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn anchors_are_exact_and_other_layers_interpolate() {
        let p = DomainProfile::olmoe("github", 16).unwrap();
        let anchors = olmoe::olmoe_anchor_shares("github").unwrap();
        for (l, s) in &anchors {
            assert!(stats::total_variation(&p.shares[*l as usize], s) < 1e-12);
        }
        for row in &p.shares {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        }
        // Layer 3 skew lies between layers 0 and 7.
        let top = |s: &[f64]| stats::top_n_share(s, 16);
        let (t0, t3, t7) = (top(&p.shares[0]), top(&p.shares[3]), top(&p.shares[7]));
        assert!(t0.min(t7) <= t3 && t3 <= t0.max(t7), "{t0} {t3} {t7}");
        // Relabelling is domain-independent: github's and book's hot sets overlap at layer 3
        // exactly as at the nearest anchor, layer 0.
        let b = DomainProfile::olmoe("book", 16).unwrap();
        let hot = |s: &[f64]| {
            let mut o: Vec<usize> = (0..s.len()).collect();
            o.sort_by(|&x, &y| s[y].total_cmp(&s[x]).then(x.cmp(&y)));
            o.truncate(16);
            o
        };
        let overlap = |a: &[f64], b: &[f64]| {
            let h = hot(b);
            hot(a).iter().filter(|e| h.contains(e)).count()
        };
        assert_eq!(
            overlap(&p.shares[3], &b.shares[3]),
            overlap(&p.shares[0], &b.shares[0])
        );
    }

    #[test]
    fn zipf_scenario_has_its_skew_and_reuse() {
        let shape = TraceShape {
            layers: 3,
            experts_per_layer: 128,
            top_k: 8,
        };
        let cfg = SynthConfig::zipf(shape, 0.8, 400, 16, 5, 0.4).unwrap();
        assert_eq!(cfg.name, "zipf0.8-3x128x8");
        let norm: f64 = (1..=128).map(|r| (r as f64).powf(-0.8)).sum();
        let top_quarter: f64 = (1..=32).map(|r| (r as f64).powf(-0.8)).sum::<f64>() / norm;
        for row in &cfg.domains[0].shares {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            assert!((stats::top_n_share(row, 32) - top_quarter).abs() < 1e-9);
        }
        // the per-layer relabelling differs between layers
        assert_ne!(cfg.domains[0].shares[0], cfg.domains[0].shares[1]);
        let t = generate(&cfg).unwrap();
        for r in stats::reuse_per_layer(&t).unwrap() {
            assert!((r - 0.4).abs() < 0.05, "reuse {r}");
        }
        let shares = stats::pick_shares(&t, 0..400).unwrap();
        for (l, measured) in shares.iter().enumerate() {
            let tv = stats::total_variation(measured, &cfg.domains[0].shares[l]);
            assert!(tv < 0.08, "layer {l}: total variation {tv}");
        }
        for bad in [-0.1, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                SynthConfig::zipf(shape, bad, 10, 1, 0, 0.3),
                Err(TraceError::InvalidScenario(_))
            ));
        }
    }

    #[test]
    fn bad_scenarios_are_typed_errors() {
        let mut c = small(10, 5, 1);
        c.steps = 0;
        assert!(matches!(Synth::new(c), Err(TraceError::InvalidScenario(_))));
        let mut c = small(10, 5, 1);
        c.phases[1].domain = 9;
        assert!(Synth::new(c).is_err());
        let mut c = small(10, 5, 1);
        c.reuse = 1.5;
        assert!(Synth::new(c).is_err());
        let mut c = small(10, 5, 1);
        c.domains[0].shares[2] = vec![0.0; 64];
        c.domains[0].shares[2][0] = 1.0;
        assert!(matches!(Synth::new(c), Err(TraceError::InvalidScenario(_))));
        let mut c = small(10, 5, 1);
        c.shape.top_k = 65;
        assert!(matches!(Synth::new(c), Err(TraceError::TopKTooWide { .. })));
        assert!(SynthConfig::olmoe_shift("github", "poetry", 10, 5, 4, 1).is_err());
    }

    #[test]
    fn huge_scenarios_are_refused_before_allocating() {
        // u64::MAX steps used to overflow `Vec::with_capacity`; 10^9 steps or 2^32 - 1 tokens
        // aborted on allocation.
        for (steps, tokens) in [
            (u64::MAX, 16),
            (MAX_STEPS + 1, 16),
            (10, u32::MAX),
            (10, 65_537),
        ] {
            let c = small(steps, 5, 1);
            let c = SynthConfig {
                tokens_per_step: tokens,
                ..c
            };
            let e = generate(&c).unwrap_err();
            assert!(
                matches!(e, TraceError::TooLarge(_)),
                "{steps}/{tokens}: {e}"
            );
        }
        let c = small(1_000_000_000, 5, 1);
        c.validate().unwrap();
        let e = c.validate_in_memory().unwrap_err();
        assert!(e.to_string().contains("write_binary"), "{e}");
        assert!(matches!(generate(&c), Err(TraceError::TooLarge(_))));
        // Profiles are bounded too.
        let e = DomainProfile::from_anchors("x", &[(0, vec![1.0; 100_000])], 1000).unwrap_err();
        assert!(matches!(e, TraceError::TooLarge(_)), "{e}");
    }

    #[test]
    fn routing_counts_profile_matches_in_code_one() {
        let Some(shared) =
            crate::experts::trace::test_util::shared_dir("routing-counts profile test")
        else {
            return;
        };
        let text =
            std::fs::read_to_string(shared.join("data/moe/olmoe/routing-counts.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let from_json =
            DomainProfile::from_routing_counts(&json, "olmoe", "github", 64, 16).unwrap();
        let in_code = DomainProfile::olmoe("github", 16).unwrap();
        for (a, b) in from_json.shares.iter().zip(&in_code.shares) {
            assert!(stats::total_variation(a, b) < 1e-5);
        }
        // Mixtral counts (8 experts, top-2) also make a valid scenario.
        let m = DomainProfile::from_routing_counts(&json, "mistral", "github", 8, 32).unwrap();
        assert_eq!(m.shares.len(), 32);
    }
}
