//! `tierkit experts ...`: replay, fit-seed, synth, inspect. Argument parsing, I/O and formatting
//! only; every policy, map and trace operation is a call into `expert-residency`.
//!
//! One module per job: `source` (trace files or the synthetic scenario), `replay` (the
//! scoreboard, its plot and the engine modes), `fit_seed`, `synth`, `inspect` (and the trace
//! summary `synth` prints too).

use clap::Subcommand;

mod fit_seed;
mod inspect;
mod replay;
mod source;
mod synth;

pub use fit_seed::FitSeedArgs;
pub use inspect::InspectArgs;
pub use replay::ReplayArgs;
pub use synth::SynthArgs;

type CliResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Default bytes of one expert: OLMoE-1B-7B, 3 matrices of 2048 × 1024 in bf16 (12 MiB).
const OLMOE_EXPERT_BYTES: u64 = 3 * 2048 * 1024 * 2;

/// `tierkit experts` subcommands.
#[derive(Debug, Subcommand)]
pub enum ExpertsCommand {
    /// Replay a routing trace step by step through residency policies and compare cold shares.
    ///
    /// Without --trace, replays the built-in scenario: OLMoE-1B-7B shape, expert popularity
    /// fitted from the real OLMoE routing counts (numbers in code), Mixtral-like step-to-step
    /// reuse, github → book shift at a third of the run.
    Replay(Box<ReplayArgs>),
    /// Fit a seed map (top-K per layer) from a counter dump, a trace or routing counts; write
    /// the rowmap JSON.
    FitSeed(FitSeedArgs),
    /// Generate a synthetic routing trace calibrated to real data and write it to a file.
    Synth(SynthArgs),
    /// Describe a trace: shape, steps, lookups, per-layer step-to-step reuse and skew.
    Inspect(InspectArgs),
}

/// Runs an `experts` subcommand.
pub fn run(cmd: ExpertsCommand) -> CliResult {
    match cmd {
        ExpertsCommand::Replay(a) => replay::replay_cmd(*a),
        ExpertsCommand::FitSeed(a) => fit_seed::fit_seed_cmd(a),
        ExpertsCommand::Synth(a) => synth::synth_cmd(a),
        ExpertsCommand::Inspect(a) => inspect::inspect_cmd(a),
    }
}

/// Default hot experts per layer: a quarter of the experts (at least one).
fn default_hot(experts: u32) -> u32 {
    (experts / 4).max(1)
}
