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
//!
//! Modules: `profile` ([`DomainProfile`]), `config` ([`SynthConfig`], [`Phase`]), `stream` (the
//! calibrated sampler, [`Synth`]); [`generate`] and [`write_binary`] here.

use super::{Trace, TraceError};

mod config;
mod profile;
mod stream;
#[cfg(test)]
mod tests;

pub use config::{Phase, SynthConfig};
pub use profile::DomainProfile;
pub use stream::Synth;

/// Previous-token reuse probability of the real Mixtral decode traces (mean over layers; the
/// per-layer range is 0.34–0.40, 0.25 at random).
pub const MIXTRAL_DECODE_REUSE: f64 = 0.37;

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
