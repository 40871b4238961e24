//! `tierkit experts ...`: replay, fit-seed, synth, inspect. Argument parsing, I/O and formatting
//! only; every policy, map and trace operation is a call into `expert-residency`.

use crate::{input, output, plot, progress};
use clap::{Args, Subcommand, ValueEnum};
use expert_residency::{
    fit_seed_map, seed_coverage, ControllerConfig, Coverage, Geometry, MapFile, ResidencyMap,
};
use serde::Serialize;
use std::path::{Path, PathBuf};
use tierkit_sim::experts::scoreboard::{self, Boot, Policy, Run, ScoreRow};
use tierkit_sim::experts::trace::{
    self, binary, logger, stats, synth, MissingRows, ReadOptions, Trace, TraceFormat,
};
use tierkit_sim::experts::{LinkModel, ReplayOptions};
use tierkit_sim::table;

mod modes;

type CliResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Most `--count-run-starts`: a run start counted as up to the picks of a 256-token decode
/// batch (the largest batch of the documented scenarios). Each run start is recorded that many
/// times, and a drain's counter deltas must stay below 2^31.
const MAX_COUNT_RUN_STARTS: u32 = 256;

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
        ExpertsCommand::Replay(a) => replay_cmd(*a),
        ExpertsCommand::FitSeed(a) => fit_seed_cmd(a),
        ExpertsCommand::Synth(a) => synth_cmd(a),
        ExpertsCommand::Inspect(a) => inspect_cmd(a),
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    /// Detect from magic bytes, extension (.tkt, .json, .csv) and the first line's keys.
    Auto,
    /// tierkit binary trace (.tkt).
    Binary,
    /// A whole tierkit trace as one JSON document.
    Json,
    /// Mixtral per-token decode JSONL (`problem_id`, `token_idx`, `layer`, `experts`).
    MixtralJsonl,
    /// Engine-logger JSONL (`layer` + ids, `step`/`forward_pass` or boundary markers).
    LoggerJsonl,
    /// Per-row routing logs: vLLM MoE routing logger (meta line, `"type": "route"`), or raw rows
    /// (position under `token_idx`/`token_pos`/`pos`, ids under `topk_ids`/`experts`/
    /// `selected_experts`/`expert_ids`/`routed_experts`); lost rows are counted, not refused.
    #[value(alias = "vllm-jsonl", alias = "token-pos-jsonl")]
    RoutesJsonl,
    /// Per-request captures: vLLM `--enable-return-routed-experts` (`routed_experts`,
    /// `prompt_routed_experts`; nested lists or base64 .npy), SGLang `return_routed_experts`
    /// (`meta_info.routed_experts`, base64 int32: give --layers and --top-k).
    #[value(alias = "vllm-capture", alias = "sglang-capture")]
    CaptureJson,
    /// llama.cpp moe-trace CSV (`layer,expert`, or `phase,token,layer,rank,expert`).
    #[value(alias = "llama-csv", alias = "moe-trace-csv")]
    RoutingCsv,
}

impl From<FormatArg> for TraceFormat {
    fn from(f: FormatArg) -> Self {
        match f {
            FormatArg::Auto => TraceFormat::Auto,
            FormatArg::Binary => TraceFormat::Binary,
            FormatArg::Json => TraceFormat::Json,
            FormatArg::MixtralJsonl => TraceFormat::MixtralJsonl,
            FormatArg::LoggerJsonl => TraceFormat::LoggerJsonl,
            FormatArg::RoutesJsonl => TraceFormat::RoutesJsonl,
            FormatArg::CaptureJson => TraceFormat::CaptureJson,
            FormatArg::RoutingCsv => TraceFormat::RoutingCsv,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum MissingArg {
    /// Keep the token; missing layers see no lookup from it.
    EmptyLayer,
    /// Drop tokens lacking a row in any layer.
    DropToken,
}

/// Trace files to read.
#[derive(Debug, Args)]
pub struct TraceFiles {
    /// Trace file or directory (every *.jsonl, *.tkt, *.json, *.csv in it, by name); repeat to
    /// join several, each join counting as a shift. Per-layer routing logs (`moe_layer{L}.jsonl`)
    /// are merged into one trace instead. Formats and field names: see --format and
    /// docs/experts.md.
    #[arg(long, value_name = "FILE|DIR")]
    trace: Vec<PathBuf>,
    /// Trace format (default: detected). Lost (token, layer) rows are counted and printed, never
    /// a refusal.
    #[arg(long, value_enum, default_value_t = FormatArg::Auto)]
    format: FormatArg,
    /// Warm-up forward passes to drop from the start of each file.
    #[arg(long, default_value_t = 0)]
    skip_steps: u64,
    /// MoE layers (default: from the file, Mixtral 32, or inferred).
    #[arg(long)]
    layers: Option<u32>,
    /// Experts per layer (default: from the file, Mixtral 8, or inferred).
    #[arg(long)]
    experts: Option<u32>,
    /// Top-k (default: from the file, Mixtral 2, or inferred).
    #[arg(long)]
    top_k: Option<u32>,
    /// Missing (token, layer) rows in per-token traces.
    #[arg(long, value_enum, default_value_t = MissingArg::EmptyLayer)]
    missing_rows: MissingArg,
    /// Keep the dummy profiling, warm-up and other non-counted passes of routing logs (dropped
    /// by default: every row identical, or a `pass` kind other than prefill/decode).
    #[arg(long)]
    keep_dummy_passes: bool,
}

impl TraceFiles {
    /// Warns about the flags that shape how trace files are read when no --trace is given: the
    /// synthetic scenario ignores them (`--layers 0` used to pass silently).
    fn warn_unused(&self) {
        let given: Vec<&str> = [
            ("--layers", self.layers.is_some()),
            ("--experts", self.experts.is_some()),
            ("--top-k", self.top_k.is_some()),
            ("--skip-steps", self.skip_steps != 0),
            ("--keep-dummy-passes", self.keep_dummy_passes),
            ("--format", !matches!(self.format, FormatArg::Auto)),
            (
                "--missing-rows",
                !matches!(self.missing_rows, MissingArg::EmptyLayer),
            ),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect();
        if !given.is_empty() {
            errln!(
                "warning: {} only {} to --trace files; the synthetic scenario ignores {}",
                given.join(", "),
                if given.len() == 1 { "applies" } else { "apply" },
                if given.len() == 1 { "it" } else { "them" }
            );
        }
    }

    fn options(&self) -> ReadOptions {
        ReadOptions {
            format: self.format.into(),
            layers: self.layers,
            experts_per_layer: self.experts,
            top_k: self.top_k,
            skip_steps: self.skip_steps,
            missing_rows: match self.missing_rows {
                MissingArg::EmptyLayer => MissingRows::EmptyLayer,
                MissingArg::DropToken => MissingRows::DropToken,
            },
            keep_dummy_passes: self.keep_dummy_passes,
        }
    }
}

/// Synthetic scenario presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PresetArg {
    /// OLMoE-1B-7B shape, popularity from the real OLMoE routing counts, a domain shift
    /// (--from, --to, --shift-at).
    OlmoeShift,
    /// 512 experts top-10 (48 layers), weak skew (Zipf 0.5), strong token-to-token reuse
    /// (default 0.6), no shift: after a public llama.cpp report's traffic.
    WideReuse,
}

/// The synthetic scenario (used when no --trace is given, and by `synth`).
#[derive(Debug, Args, Clone)]
pub struct ScenarioArgs {
    /// Scenario preset.
    #[arg(long, value_enum, default_value_t = PresetArg::OlmoeShift)]
    preset: PresetArg,
    /// Domain before the shift (OLMoE: arxiv, book, c4, github, tulu, wikipedia).
    #[arg(long, default_value = "github")]
    from: String,
    /// Domain after the shift.
    #[arg(long, default_value = "book")]
    to: String,
    /// Steps (decode forward passes) to generate.
    #[arg(long, default_value_t = 9_000)]
    steps: u64,
    /// Step of the domain shift (default: a third of --steps, at least step 1; ≥ --steps for
    /// none).
    #[arg(long)]
    shift_at: Option<u64>,
    /// Routed tokens per step (decode batch).
    #[arg(long, default_value_t = 32)]
    tokens: u32,
    /// RNG seed (the same seed gives byte-identical traces and reports).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Previous-step reuse probability per token and layer (default: real Mixtral decode's
    /// 0.37; 0.6 for --preset wide-reuse).
    #[arg(long)]
    reuse: Option<f64>,
}

impl ScenarioArgs {
    fn config(&self) -> CliResult<synth::SynthConfig> {
        if self.preset == PresetArg::WideReuse {
            return Ok(scoreboard::wide_reuse_scenario(
                self.steps,
                self.tokens,
                self.seed,
                self.reuse.unwrap_or(scoreboard::WIDE_REUSE),
            )?);
        }
        // A third of the run, but never step 0 (a shift at 0 is no shift: `--steps 1` or 2 must
        // still run, on the first domain).
        let shift = self.shift_at.unwrap_or((self.steps / 3).max(1));
        let mut cfg = synth::SynthConfig::olmoe_shift(
            &self.from,
            &self.to,
            self.steps,
            shift,
            self.tokens,
            self.seed,
        )?;
        cfg.reuse = self.reuse.unwrap_or(synth::MIXTRAL_DECODE_REUSE);
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Trace files, or the synthetic scenario when no file is given.
#[derive(Debug, Args)]
pub struct TraceInput {
    #[command(flatten)]
    files: TraceFiles,
    #[command(flatten)]
    scenario: ScenarioArgs,
}

/// Where a replayed trace came from (part of the JSON report).
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum Source {
    Synthetic {
        scenario: String,
        from: String,
        to: String,
        steps: u64,
        shift_at: Vec<u64>,
        tokens_per_step: u32,
        seed: u64,
        reuse: f64,
    },
    Files {
        paths: Vec<String>,
        options: ReadOptions,
        /// What the readers found: format, rows read and missing, passes dropped.
        read: trace::ReadReport,
    },
}

/// Generates a synthetic trace with a progress bar (bounded by
/// [`synth::SynthConfig::validate_in_memory`]).
fn generate(cfg: &synth::SynthConfig, quiet: bool) -> CliResult<Trace> {
    cfg.validate_in_memory()?;
    let mut steps = Vec::new();
    steps
        .try_reserve_exact(cfg.steps as usize)
        .map_err(|e| format!("cannot hold {} steps in memory: {e}", cfg.steps))?;
    let pb = progress::bar(cfg.steps, &format!("generating {}", cfg.name), quiet);
    for s in synth::Synth::new(cfg.clone())? {
        steps.push(s);
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(Trace {
        name: cfg.name.clone(),
        shape: cfg.shape,
        steps,
        shifts: cfg.shifts(),
    })
}

fn load(input: &TraceInput, quiet: bool) -> CliResult<(Trace, Source)> {
    if input.files.trace.is_empty() {
        input.files.warn_unused();
        let cfg = input.scenario.config()?;
        let trace = generate(&cfg, quiet)?;
        let source = Source::Synthetic {
            scenario: cfg.name.clone(),
            from: input.scenario.from.clone(),
            to: input.scenario.to.clone(),
            steps: cfg.steps,
            shift_at: cfg.shifts(),
            tokens_per_step: cfg.tokens_per_step,
            seed: cfg.seed,
            reuse: cfg.reuse,
        };
        Ok((trace, source))
    } else {
        let pb = progress::spinner("reading trace", quiet);
        let opts = input.files.options();
        let (t, read) = trace::read_traces_report(&input.files.trace, &opts)?;
        pb.finish_and_clear();
        let paths = input
            .files
            .trace
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        Ok((
            t,
            Source::Files {
                paths,
                options: opts,
                read,
            },
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PolicyArg {
    /// A uniform first-K map, never swapped.
    Static,
    /// A seed map fitted offline (--seed-map, else on the steps before the first shift).
    Seed,
    /// The cost-aware default policy (the crate's default config; no flag applies to it).
    CostAware,
    /// The published ratio recipe at its defaults (drain 64, half-life 500, ratio 1.5).
    Ratio,
    /// The published ratio recipe at its best tuning in hindsight (a sweep on the same trace).
    RatioBest,
    /// The capped recency policy (LRU on drained touches, ≤ 4 swaps per step).
    Recency,
    /// The controller with this command's config (--config, --drain-every, ...; by default the
    /// cost-aware default). Not in `all`.
    Adaptive,
    /// The same with the shift response on. Not in `all`.
    #[value(name = "adaptive+shift-response", alias = "shift-response")]
    AdaptiveShiftResponse,
    /// Per-layer LRU admitting every miss (uncapped reference).
    Lru,
    /// The best static map in hindsight: per layer the top-H experts by steps touched, the static
    /// map of least stall (whole trace; also after the last shift if any). The reference of every
    /// "vs best static" ratio.
    BestStatic,
    /// The static map in hindsight ranked by picks (the former `oracle`: best for the cold share,
    /// not for the link).
    StaticByPicks,
    /// Not a policy: the exact offline optimum of the stall (per layer, a min-cost flow; its
    /// step-0 map free); every row's stall over it is shown. Subject to --optimum.
    OfflineOptimum,
    /// static, seed, cost-aware, ratio, ratio-best, recency, lru, static-by-picks, best-static,
    /// offline-optimum.
    All,
}

/// When `replay` computes the `offline optimum` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OptimumArg {
    /// Where it takes seconds: the solver's work bound at most
    /// `tierkit_sim::experts::OPTIMUM_AUTO_MAX_WORK` (5 × 10⁷, about 10 s), and a stall linear in
    /// copies.
    Auto,
    /// Always (fails on a link with --hide-us > 0, where the stall is not linear in copies).
    Always,
    /// Never.
    Never,
}

/// What `fit-seed` ranks experts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RankArg {
    /// Steps in which the expert was picked at all (the map of least stall).
    Touched,
    /// Picks (the map of least cold share).
    Picks,
}

/// The map adaptive and LRU rows boot from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BootArg {
    /// The uniform first-K map (the `static` row's).
    FirstK,
    /// The seed map (the `seed` row's: --seed-map, else fitted before the first shift).
    Seed,
}

/// The link preset that prices host bytes as a stall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LinkArg {
    /// H200 PCIe Gen5 as measured: in-place reads 47 GB/s, copies 55 GB/s overlapping the step
    /// on the shared link, +26.2 µs per copy.
    H200Pcie,
    /// GB300 C2C as published: in-place reads 340 GB/s, a 17.93 MiB copy ~72 µs stopping the
    /// step.
    Gb300C2c,
}

/// `tierkit experts replay` arguments.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    input: TraceInput,
    /// Hot (HBM) experts per layer (default: a quarter of the experts per layer).
    #[arg(long)]
    hot: Option<u32>,
    /// Policies to replay, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [PolicyArg::All])]
    policy: Vec<PolicyArg>,
    /// Seed map JSON (from `fit-seed`; at most 257 MiB, read before the trace); default: fitted
    /// on the steps before the first shift (the first tenth of the trace if it has no shift).
    #[arg(long)]
    seed_map: Option<PathBuf>,
    /// Controller config JSON (`ControllerConfig`: an object of named fields, at most 1 MiB; the
    /// policy as `{"kind": "ratio", "ratio": 1.5}`, or the flat shape of older configs,
    /// `"policy": "ratio", "ratio": 1.5`); default: the crate's defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override: steps between drains.
    #[arg(long)]
    drain_every: Option<u32>,
    /// Override: EMA half-life in steps.
    #[arg(long)]
    half_life_steps: Option<f64>,
    /// Steps per cold-share window (table, plot and `cold_share_windows`).
    #[arg(long, default_value_t = 64)]
    window_steps: u32,
    /// Seconds per step, to report T90 in seconds too.
    #[arg(long)]
    step_time_s: Option<f64>,
    /// Bytes of one expert (geometry; OLMoE-1B-7B bf16 by default).
    #[arg(long, default_value_t = OLMOE_EXPERT_BYTES)]
    expert_bytes: u64,
    /// Run adaptive policies on the in-memory executor with this many stand-in bytes per
    /// expert and verify every byte at the end.
    #[arg(long)]
    verify_bytes: Option<usize>,
    /// The map the adaptive, adaptive+shift-response and LRU rows boot from.
    #[arg(long, value_enum, default_value_t = BootArg::FirstK)]
    boot: BootArg,
    /// The link that turns host bytes into a modelled stall per step.
    #[arg(long, value_enum, default_value_t = LinkArg::H200Pcie)]
    link: LinkArg,
    /// Copy time per step that hides behind the step's off-link work, µs (links whose copies
    /// overlap the step; default 0: nothing hidden).
    #[arg(long, value_name = "US")]
    hide_us: Option<f64>,
    /// The `offline optimum` row: `auto` computes it where it takes seconds (the solver's work
    /// bound, Σ over layers of min(hot, touches) × (steps + 2 × touches), at most 5 × 10⁷: about
    /// 10 s) and says so where it is skipped. With --mode other than in-place: the in-place
    /// min-cost flows of the modes table likewise (the copy-on-miss optimum, Belady's MIN, is
    /// always computed except with `never`).
    #[arg(long, value_enum, default_value_t = OptimumArg::Auto)]
    optimum: OptimumArg,
    /// With --json: every step's bytes and stall too (the per-window series are always there).
    #[arg(long)]
    bytes_per_step: bool,
    /// Experiment (not a runtime mode): the controller rows count only run starts (an expert
    /// picked at step t and not at t − 1), each as N picks (1..=256), instead of every pick.
    #[arg(long, value_name = "N")]
    count_run_starts: Option<u32>,
    /// Put a synthetic prefill of N prompt tokens in front of each segment of the trace (its
    /// start and every shift: one per request of a joined directory), each prompt token routed
    /// like a random token of that segment (`tierkit_sim::experts::trace::prefill`), for
    /// decode-only logs. One step each; the shifts move onto the prefills.
    #[arg(long, value_name = "N")]
    prefill: Option<u32>,
    /// Seed of the --prefill prompts' draw (same seed, same trace).
    #[arg(long, default_value_t = 7, requires = "prefill")]
    prefill_seed: u64,
    /// Print the full report as JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Print every column of the table (boot map, cold share of all lookups, swaps, GB read and
    /// copied, bytes ratio); the default table has eight and fits 120 columns.
    #[arg(long, conflicts_with = "json")]
    wide: bool,
    /// Draw cold share over steps per policy to this PNG, and the modelled stall per step to a
    /// second PNG beside it (`FILE-stall.png`). The name must end in `.png` (checked before the
    /// run).
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
    #[command(flatten)]
    modes: modes::ModeArgs,
}

#[derive(Debug, Serialize)]
struct TraceInfo {
    name: String,
    shape: trace::TraceShape,
    steps: u64,
    lookups: u64,
    shifts: Vec<u64>,
    source: Source,
}

impl TraceInfo {
    /// What the replay and modes headers (and their JSON) say of a trace.
    fn of(trace: &Trace, source: Source) -> Self {
        TraceInfo {
            name: trace.name.clone(),
            shape: trace.shape,
            steps: trace.steps.len() as u64,
            lookups: trace.lookups(),
            shifts: trace.shifts.clone(),
            source,
        }
    }
}

#[derive(Debug, Serialize)]
struct ReplayOutput {
    command: &'static str,
    trace: TraceInfo,
    geometry: Geometry,
    controller: ControllerConfig,
    seed_map: String,
    boot: Boot,
    link: LinkModel,
    /// `--count-run-starts` (an experiment): the controller rows were fed run starts × N.
    #[serde(skip_serializing_if = "Option::is_none")]
    count_run_starts: Option<u32>,
    summary: Vec<ScoreRow>,
    runs: Vec<Run>,
}

/// The drain cadence and half-life the controller rows ran with, as the header states them: the
/// adapted cadence's rule where the config has one (the default), the fixed ones otherwise.
fn cadence_text(c: &ControllerConfig) -> String {
    match &c.adaptive {
        Some(a) => format!(
            "cadence adapted to the traffic ({} touched steps of an average expert and {} drains \
             per half-life, half-life {}–{} steps, at most {} steps between drains)",
            a.touches_per_half_life,
            a.drains_per_half_life,
            a.min_half_life_steps,
            a.max_half_life_steps,
            c.drain_every
        ),
        None => format!(
            "drain every {} steps, EMA half-life {} steps",
            c.drain_every, c.half_life_steps
        ),
    }
}

fn controller_config(a: &ReplayArgs) -> CliResult<ControllerConfig> {
    let mut cfg = match &a.config {
        Some(p) => input::controller_config("--config", p)?,
        None => ControllerConfig::default(),
    };
    if let Some(d) = a.drain_every {
        cfg.drain_every = d;
    }
    if let Some(h) = a.half_life_steps {
        cfg.half_life_steps = h;
    }
    cfg.validate().map_err(|e| match &a.config {
        Some(p) => input::named("--config", p, e),
        None => e.to_string(),
    })?;
    Ok(cfg)
}

fn policies(args: &[PolicyArg]) -> Vec<Policy> {
    let mut out = Vec::new();
    for p in args {
        match p {
            PolicyArg::All => out.extend(Policy::ALL),
            PolicyArg::Static => out.push(Policy::Static),
            PolicyArg::Seed => out.push(Policy::Seed),
            PolicyArg::CostAware => out.push(Policy::CostAware),
            PolicyArg::Ratio => out.push(Policy::Ratio),
            PolicyArg::RatioBest => out.push(Policy::RatioBest),
            PolicyArg::Recency => out.push(Policy::Recency),
            PolicyArg::Adaptive => out.push(Policy::Adaptive),
            PolicyArg::AdaptiveShiftResponse => out.push(Policy::AdaptiveShiftResponse),
            PolicyArg::Lru => out.push(Policy::Lru),
            PolicyArg::BestStatic => out.push(Policy::BestStatic),
            PolicyArg::StaticByPicks => out.push(Policy::StaticByPicks),
            PolicyArg::OfflineOptimum => out.push(Policy::Optimum),
        }
    }
    out
}

fn default_hot(experts: u32) -> u32 {
    (experts / 4).max(1)
}

/// The seed map: `--seed-map` (its file read up front, `file`) for geometry `g`, else fitted on
/// the trace.
fn seed_map(
    a: &ReplayArgs,
    file: Option<MapFile>,
    trace: &Trace,
    g: &Geometry,
) -> CliResult<(ResidencyMap, String)> {
    if let (Some(p), Some(file)) = (&a.seed_map, file) {
        let map = input::seed_map("--seed-map", p, file, g)?;
        return Ok((map, format!("loaded from {}", p.display())));
    }
    Ok(scoreboard::default_seed_map(trace, g)?)
}

/// `FILE.png` → `FILE-stall.png` (the stall chart beside the cold-share chart).
fn stall_plot_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or("plot".into(), |s| s.to_string_lossy());
    path.with_file_name(format!("{stem}-stall.png"))
}

/// Two charts: cold share per window at `path`, modelled stall per step (window mean, ms) at
/// [`stall_plot_path`].
fn plot_runs(path: &Path, out: &ReplayOutput) -> CliResult {
    let w = out.runs.first().map_or(1, |r| r.report.window_steps.max(1)) as u64;
    let steps = out.trace.steps;
    let series = |y: &dyn Fn(&Run, usize) -> Option<f64>| -> Vec<plot::Series> {
        out.runs
            .iter()
            .map(|r| {
                let pts = (0..r.report.cold_share_windows.len())
                    .filter_map(|i| Some(((i as f64 + 0.5) * w as f64, y(r, i)?)))
                    .collect();
                (r.label.clone(), pts)
            })
            .collect()
    };
    let markers: Vec<(f64, String)> = out
        .trace
        .shifts
        .iter()
        .map(|&s| (s as f64, format!(" shift @ {s}")))
        .collect();
    let (hot, experts) = (out.geometry.hot_per_layer, out.geometry.experts_per_layer);
    let cold = plot::ChartSpec {
        title: format!(
            "{}: cold share per {w}-step window, {hot} of {experts} experts hot per layer",
            out.trace.name
        ),
        x_label: "step".into(),
        y_label: "cold share (lookups served from host)".into(),
        series: series(&|r, i| r.report.cold_share_windows.get(i).copied()),
        markers: markers.clone(),
        size: (1400, 800),
        y_range: None,
    };
    plot::draw(path, &cold)?;
    // Mean per step of each window (the last window may be short).
    let stall = plot::ChartSpec {
        title: format!(
            "{}: stall per step, {}, {w}-step windows, {hot}/{experts} hot",
            out.trace.name, out.link.name
        ),
        x_label: "step".into(),
        y_label: "stall per step (ms)".into(),
        series: series(&|r, i| {
            let len = steps.saturating_sub(i as u64 * w).clamp(1, w);
            let us = r.report.bytes.stall_us_windows.get(i)?;
            Some(us / 1e3 / len as f64)
        }),
        markers,
        size: (1400, 800),
        y_range: None,
    };
    plot::draw(&stall_plot_path(path), &stall)
}

fn replay_cmd(a: ReplayArgs) -> CliResult {
    let quiet = a.json;
    let cfg = controller_config(&a)?;
    let mut link = match a.link {
        LinkArg::H200Pcie => LinkModel::h200_pcie(),
        LinkArg::Gb300C2c => LinkModel::gb300_c2c(),
    };
    if let Some(h) = a.hide_us {
        link.hide_us = h;
    }
    let opts = ReplayOptions {
        window_steps: a.window_steps,
        step_time_s: a.step_time_s,
        verify_bytes: a.verify_bytes,
        link,
        per_step_bytes: a.bytes_per_step,
        count_run_starts: a.count_run_starts,
        ..ReplayOptions::default()
    };
    let boot = match a.boot {
        BootArg::FirstK => Boot::FirstK,
        BootArg::Seed => Boot::Seed,
    };
    // Reject bad knobs and output paths before reading or generating the trace.
    if let Some(n) = a.count_run_starts {
        if !(1..=MAX_COUNT_RUN_STARTS).contains(&n) {
            return Err(format!(
                "--count-run-starts {n}: must be in [1, {MAX_COUNT_RUN_STARTS}] picks per run \
                 start (each run start is recorded N times: the replay's time grows with N, and \
                 a large N wraps the u32 pick counters)"
            )
            .into());
        }
    }
    opts.validate()?;
    let mode_opts = modes::check(&a, &opts.link)?;
    if let Some(p) = &a.plot {
        output::check_png("--plot", p)?;
    }
    let seed_file = match &a.seed_map {
        Some(p) => Some(input::map_file("--seed-map", p)?),
        None => None,
    };
    let (mut trace, source) = load(&a.input, quiet)?;
    if let Some(n) = a.prefill {
        trace = trace::prefill::with_prefill(&trace, n, a.prefill_seed)
            .map_err(|e| format!("--prefill {n}: {e}"))?;
    }
    let hot = a
        .hot
        .unwrap_or_else(|| default_hot(trace.shape.experts_per_layer));
    let g = Geometry::new(
        trace.shape.layers,
        trace.shape.experts_per_layer,
        hot,
        a.expert_bytes,
    )?;
    let (seed, seed_note) = seed_map(&a, seed_file, &trace, &g)?;
    if let Some(mo) = &mode_opts {
        return modes::replay(&a, mo, &trace, source, &g, &seed, seed_note, boot);
    }
    let mut wanted = policies(&a.policy);
    let mut optimum_note = None;
    if wanted.contains(&Policy::Optimum) && a.optimum != OptimumArg::Always {
        let skip = match a.optimum {
            OptimumArg::Never => Some("--optimum never".to_string()),
            _ => scoreboard::optimum_skip_reason(&trace, &g, &opts.link),
        };
        if let Some(why) = skip {
            wanted.retain(|&p| p != Policy::Optimum);
            optimum_note = Some(why);
        }
    }
    let specs = scoreboard::policy_specs_booted(&wanted, &trace, &seed, boot);
    let pb = progress::bar(specs.len() as u64, "replaying policies", quiet);
    let runs = scoreboard::run_policies(&trace, &g, &cfg, &opts, &specs, &|label| {
        if label.is_empty() {
            pb.inc(1);
        } else {
            pb.set_message(format!("replaying {label}"));
        }
    })?;
    pb.finish_and_clear();
    let out = ReplayOutput {
        command: "tierkit experts replay",
        trace: TraceInfo::of(&trace, source),
        geometry: g,
        controller: cfg,
        seed_map: seed_note,
        boot,
        link: opts.link.clone(),
        count_run_starts: opts.count_run_starts,
        summary: scoreboard::summarize(&runs),
        runs,
    };
    if let Some(p) = &a.plot {
        plot_runs(p, &out)?;
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    let t = &out.trace;
    print_trace_info(t)?;
    outln!(
        "hot {} of {} experts per layer; the default row: {}, {}, ≤{} swaps/layer/drain, ≤{} swaps/step; seed map {}",
        g.hot_per_layer,
        g.experts_per_layer,
        cadence_text(&out.controller),
        out.controller.policy,
        out.controller.max_swaps_per_layer,
        out.controller.max_swaps_per_step,
        out.seed_map
    )?;
    outln!(
        "adaptive and lru boot from the {} map; expert {} bytes; link {}",
        match boot {
            Boot::FirstK => "first-k",
            Boot::Seed => "seed",
        },
        g.expert_bytes,
        out.link.name
    )?;
    if let Some(n) = out.count_run_starts {
        outln!(
            "experiment: the controller rows count only run starts (an expert picked at step t and not at t − 1), each as {n} picks"
        )?;
    }
    outln!()?;
    if a.wide {
        outln!("{}", scoreboard::render(&out.summary))?;
    } else {
        outln!("{}", scoreboard::render_compact(&out.summary))?;
    }
    outln!("\n{}", scoreboard::legend(&opts, &trace))?;
    if !a.wide {
        outln!(
            "steady cold = steady-state cold share; vs best = its ratio to the best static map's; \
             stall ms = mean stall per step; --wide: every column, --json: the full report."
        )?;
    }
    if let Some(why) = &optimum_note {
        outln!("offline optimum not computed: {why}")?;
    }
    for r in out
        .runs
        .iter()
        .filter(|r| r.report.policy == "ratio-best-tuning")
    {
        if let Some(c) = &r.report.config {
            outln!(
                "ratio (best tuning), in hindsight on this trace: drain every {} steps, EMA half-life {} steps, {}",
                c.drain_every, c.half_life_steps, c.policy
            )?;
        }
    }
    if let Some(p) = &a.plot {
        outln!(
            "plot: {} (stall: {})",
            p.display(),
            stall_plot_path(p).display()
        )?;
    }
    Ok(())
}

/// Prints the trace's line (name, shape, lookups, shifts) and what the readers found.
fn print_trace_info(t: &TraceInfo) -> CliResult {
    outln!(
        "trace {}: {} steps, {} layers × {} experts, top-{}, {} lookups, shifts at {:?}",
        t.name,
        t.steps,
        t.shape.layers,
        t.shape.experts_per_layer,
        t.shape.top_k,
        t.lookups,
        t.shifts
    )?;
    print_read_report(&t.source)
}

/// Prints what the readers found (rows missing, passes dropped), one `read: ` line each.
fn print_read_report(source: &Source) -> CliResult {
    if let Source::Files { read, .. } = source {
        for line in read.lines() {
            outln!("read: {line}")?;
        }
    }
    Ok(())
}

/// `tierkit experts fit-seed` arguments.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["dump", "trace", "routing_counts", "eplb_counts"])))]
pub struct FitSeedArgs {
    /// Counter dump JSON (`CounterDump`: name, layers, experts_per_layer, counts row-major; at
    /// most 513 MiB).
    #[arg(long)]
    dump: Option<PathBuf>,
    #[command(flatten)]
    files: TraceFiles,
    /// Steps of the trace to count, `START..END` (default: all).
    #[arg(long, value_name = "START..END")]
    range: Option<String>,
    /// What ranks the experts of a layer: `touched` (steps in which the expert was picked at
    /// all: the link pays one read per cold expert and step, so this is the map of least stall;
    /// the default with --trace) or `picks` (lookups: the least cold share; the only ranking
    /// count inputs have, so their default).
    #[arg(long, value_enum)]
    rank: Option<RankArg>,
    /// A `routing-counts.json` (`{model: {domain: {layers, topk_counts}}}`, at most 16 MiB);
    /// unmeasured layers are derived from the measured ones as the synthetic generator does.
    #[arg(long)]
    routing_counts: Option<PathBuf>,
    /// Engine expert-load counts, JSON: vLLM's EPLB `expert_load_window`/`expert_load_pass`
    /// (`[window,] layers, physical experts`), SGLang's expert-distribution dump
    /// (`logical_count` or `records`), a bare `[layers, experts]` array, or an object keyed by
    /// layer strings (`{"1": {"0": 747, ...}, "3": ...}` or `{"1": [747, ...]}`, at the top or
    /// under one key; layers renumbered in order, the mapping printed). --experts gives the
    /// logical experts per layer when the file has no physical-to-logical map.
    #[arg(long, value_name = "FILE")]
    eplb_counts: Option<PathBuf>,
    /// Model in --routing-counts (`olmoe`: 16 × 64; `mistral`: 32 × 8; others need --layers,
    /// --experts).
    #[arg(long, default_value = "olmoe")]
    model: String,
    /// Domain in --routing-counts.
    #[arg(long, default_value = "github")]
    domain: String,
    /// Hot experts per layer (default: a quarter of the experts per layer).
    #[arg(long)]
    hot: Option<u32>,
    /// Bytes of one expert (recorded in the map's geometry).
    #[arg(long, default_value_t = OLMOE_EXPERT_BYTES)]
    expert_bytes: u64,
    /// Write the rowmap JSON here (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// With --out: print the summary as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_range(s: &str) -> CliResult<std::ops::Range<usize>> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("range {s:?} is not START..END"))?;
    let a: usize = a
        .trim()
        .parse()
        .map_err(|_| format!("bad range start in {s:?}"))?;
    let b: usize = b
        .trim()
        .parse()
        .map_err(|_| format!("bad range end in {s:?}"))?;
    if a >= b {
        return Err(format!("empty range {s:?}").into());
    }
    Ok(a..b)
}

fn fit_seed_cmd(a: FitSeedArgs) -> CliResult {
    if a.rank == Some(RankArg::Touched) && a.files.trace.is_empty() {
        return Err(
            "--rank touched needs steps (--trace); counts (--dump, --eplb-counts, \
                    --routing-counts) rank by picks"
                .into(),
        );
    }
    // Checked before the trace is read (a bad range used to fail after the whole read).
    let range = a.range.as_deref().map(parse_range).transpose()?;
    let dump = if let Some(p) = &a.dump {
        // Deserializing checks the dump (shape, lengths, counts).
        input::counter_dump("--dump", p)?
    } else if let Some(p) = &a.eplb_counts {
        let opts = trace::counts::CountsOptions {
            experts_per_layer: a.files.experts,
            layers: a.files.layers,
        };
        let (dump, report) = trace::counts::read_counts_report(p, &opts)?;
        // On stderr: stdout may hold the rowmap JSON.
        if let Some(m) = report.renumbering() {
            eprintln!(
                "{}: counts under {}, layers keyed by strings renumbered in order: {m}",
                p.display(),
                report.source
            );
        }
        dump
    } else if let Some(p) = &a.routing_counts {
        let (dl, de) = match a.model.as_str() {
            "olmoe" | "olmoe-sft" | "olmoe-dpo" => (16, 64),
            "mistral" => (32, 8),
            _ => (0, 0),
        };
        let layers = a.files.layers.unwrap_or(dl);
        let experts = a.files.experts.unwrap_or(de);
        if layers == 0 || experts == 0 {
            return Err(format!("model {:?}: give --layers and --experts", a.model).into());
        }
        input::routing_counts("--routing-counts", p, &a.model, &a.domain, layers, experts)?
    } else {
        let (t, read) = trace::read_traces_report(&a.files.trace, &a.files.options())?;
        for line in read.lines() {
            eprintln!("read: {line}");
        }
        let range = range.unwrap_or(0..t.steps.len());
        match a.rank.unwrap_or(RankArg::Touched) {
            RankArg::Touched => tierkit_sim::experts::touched_dump(&t, range)?,
            RankArg::Picks => tierkit_sim::experts::counter_dump(&t, range)?,
        }
    };
    let hot = a.hot.unwrap_or_else(|| default_hot(dump.experts_per_layer));
    let g = Geometry::new(dump.layers, dump.experts_per_layer, hot, a.expert_bytes)?;
    let map = fit_seed_map(dump.name.clone(), &g, &dump)?;
    let cov = seed_coverage(&map, &dump)?;
    match &a.out {
        None => outln!("{}", map.to_json())?,
        Some(p) => {
            map.save(p).map_err(|e| input::expert("--out", p, e))?;
            if a.json {
                #[derive(Serialize)]
                struct Out<'a> {
                    map: String,
                    dump: &'a str,
                    geometry: Geometry,
                    coverage: Coverage,
                }
                let o = Out {
                    map: p.display().to_string(),
                    dump: &dump.name,
                    geometry: g,
                    coverage: cov,
                };
                outln!("{}", serde_json::to_string_pretty(&o)?)?;
            } else {
                outln!(
                    "seed map for {} ({} layers, {} of {} hot per layer) written to {}; it serves {:.2}% of the dump's picks from HBM (cold share {:.4})",
                    dump.name,
                    g.layers,
                    hot,
                    g.experts_per_layer,
                    p.display(),
                    cov.overall * 100.0,
                    cov.cold_share()
                )?;
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OutFormat {
    /// From the extension: .json → json, .jsonl → logger-jsonl, anything else → binary.
    Auto,
    Binary,
    Json,
    LoggerJsonl,
}

/// `tierkit experts synth` arguments.
#[derive(Debug, Args)]
pub struct SynthArgs {
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutFormat::Auto)]
    format: OutFormat,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct TraceSummary {
    name: String,
    shape: trace::TraceShape,
    steps: u64,
    lookups: u64,
    shifts: Vec<u64>,
    /// Mean over layers of the previous-step reuse probability.
    mean_reuse: f64,
    reuse_per_layer: Vec<f64>,
    /// Per segment (split at shifts): mean over the layers with picks in the segment of the
    /// share of picks taken by the busiest quarter of the experts (a layer a per-layer log did
    /// not cover has no picks and is left out, not counted as 0).
    top_quarter_share_per_segment: Vec<f64>,
}

fn summarize_trace(t: &Trace) -> CliResult<TraceSummary> {
    let reuse = stats::reuse_per_layer(t)?;
    let finite: Vec<f64> = reuse.iter().copied().filter(|v| v.is_finite()).collect();
    let mean_reuse = if finite.is_empty() {
        f64::NAN
    } else {
        finite.iter().sum::<f64>() / finite.len() as f64
    };
    let mut bounds = vec![0usize];
    bounds.extend(t.shifts.iter().map(|&s| s as usize));
    bounds.push(t.steps.len());
    let q = (t.shape.experts_per_layer as usize / 4).max(1);
    let top = bounds
        .windows(2)
        .map(|w| {
            let shares = stats::pick_shares(t, w[0]..w[1])?;
            let busy: Vec<f64> = shares
                .iter()
                .filter(|s| s.iter().any(|&v| v > 0.0))
                .map(|s| stats::top_n_share(s, q))
                .collect();
            Ok(if busy.is_empty() {
                f64::NAN
            } else {
                busy.iter().sum::<f64>() / busy.len() as f64
            })
        })
        .collect::<Result<_, trace::TraceError>>()?;
    Ok(TraceSummary {
        name: t.name.clone(),
        shape: t.shape,
        steps: t.steps.len() as u64,
        lookups: t.lookups(),
        shifts: t.shifts.clone(),
        mean_reuse,
        reuse_per_layer: reuse,
        top_quarter_share_per_segment: top,
    })
}

fn print_summary(s: &TraceSummary) -> CliResult {
    outln!(
        "trace {}: {} steps, {} layers × {} experts, top-{}, {} lookups, shifts at {:?}",
        s.name,
        s.steps,
        s.shape.layers,
        s.shape.experts_per_layer,
        s.shape.top_k,
        s.lookups,
        s.shifts
    )?;
    outln!(
        "previous-step reuse: mean {:.3} (random top-{} of {}: {:.3})",
        s.mean_reuse,
        s.shape.top_k,
        s.shape.experts_per_layer,
        s.shape.top_k as f64 / s.shape.experts_per_layer as f64
    )?;
    let rows: Vec<Vec<String>> = s
        .reuse_per_layer
        .iter()
        .enumerate()
        .map(|(l, r)| vec![l.to_string(), format!("{r:.3}")])
        .collect();
    outln!("{}", table::render(&["layer", "reuse"], &rows))?;
    for (i, v) in s.top_quarter_share_per_segment.iter().enumerate() {
        outln!(
            "segment {i}: busiest quarter of the experts takes {:.1}% of picks",
            v * 100.0
        )?;
    }
    Ok(())
}

fn synth_cmd(a: SynthArgs) -> CliResult {
    let cfg = a.scenario.config()?;
    cfg.validate_in_memory()?;
    // Create the output before generating: a bad path fails at once, not after the whole run.
    let p = a.out.display().to_string();
    let mut w = std::io::BufWriter::new(
        std::fs::File::create(&a.out).map_err(|e| input::named("--out", &a.out, e))?,
    );
    let t = generate(&cfg, a.json)?;
    let fmt = match a.format {
        OutFormat::Auto => match a.out.extension().and_then(|x| x.to_str()) {
            Some("json") => OutFormat::Json,
            Some("jsonl") => OutFormat::LoggerJsonl,
            _ => OutFormat::Binary,
        },
        f => f,
    };
    let named = |e: trace::TraceError| -> Box<dyn std::error::Error> {
        match e {
            trace::TraceError::Io { source, .. } => format!("--out {p}: {source}").into(),
            other => other.into(),
        }
    };
    match fmt {
        OutFormat::Binary => {
            binary::write_binary(&t, &mut w).map_err(named)?;
        }
        OutFormat::Json => {
            serde_json::to_writer(&mut w, &t).map_err(|e| format!("--out {p}: {e}"))?;
            std::io::Write::flush(&mut w).map_err(|e| format!("--out {p}: {e}"))?;
        }
        OutFormat::LoggerJsonl => {
            logger::write_logger(&t, &mut w).map_err(named)?;
        }
        OutFormat::Auto => unreachable!("resolved above"),
    }
    let s = summarize_trace(&t)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&s)?)?;
    } else {
        print_summary(&s)?;
        outln!("written to {p} ({fmt:?})")?;
    }
    Ok(())
}

/// `tierkit experts inspect` arguments.
#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    input: TraceInput,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

fn inspect_cmd(a: InspectArgs) -> CliResult {
    let (t, source) = load(&a.input, a.json)?;
    let s = summarize_trace(&t)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&s)?)?;
    } else {
        print_summary(&s)?;
        print_read_report(&source)?;
    }
    Ok(())
}
