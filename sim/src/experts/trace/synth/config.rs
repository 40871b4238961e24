//! [`SynthConfig`]: a synthetic scenario (shape, batch, reuse target, domains and phases) and
//! its checks.

use super::super::olmoe::{OLMOE_EXPERTS, OLMOE_LAYERS, OLMOE_TOP_K};
use super::super::{StepPicks, TraceError, TraceShape};
use super::{
    DomainProfile, MAX_IN_MEMORY_PICKS, MAX_PICKS_PER_STEP, MAX_STEPS, MAX_TOKENS_PER_STEP,
    MIXTRAL_DECODE_REUSE,
};

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
    /// [`TraceError::InvalidScenario`] for an unknown domain, or `shift_at` 0 (a run that starts
    /// on `to` is the scenario with `to` as its first domain; the message says so).
    pub fn olmoe_shift(
        from: &str,
        to: &str,
        steps: u64,
        shift_at: u64,
        tokens_per_step: u32,
        seed: u64,
    ) -> Result<Self, TraceError> {
        if shift_at == 0 {
            return Err(TraceError::InvalidScenario(format!(
                "shift at step 0: the run would have no `{from}` phase; to run `{to}` from the \
                 start give it as the first domain (from_domain / --from), or shift at step 1 or \
                 later (shift_at / --shift-at)"
            )));
        }
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
