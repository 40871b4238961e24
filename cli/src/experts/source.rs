//! Where `experts` commands get a trace: trace files (`--trace`, read through
//! `tierkit_sim::experts::trace`) or the synthetic scenario (`--preset`, ...).

use super::CliResult;
use crate::progress;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use tierkit_sim::experts::scoreboard;
use tierkit_sim::experts::trace::{self, synth, MissingRows, ReadOptions, Trace, TraceFormat};

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
    pub(super) trace: Vec<PathBuf>,
    /// Trace format (default: detected). Lost (token, layer) rows are counted and printed, never
    /// a refusal.
    #[arg(long, value_enum, default_value_t = FormatArg::Auto)]
    format: FormatArg,
    /// Warm-up forward passes to drop from the start of each file.
    #[arg(long, default_value_t = 0)]
    skip_steps: u64,
    /// MoE layers (default: from the file, Mixtral 32, or inferred).
    #[arg(long)]
    pub(super) layers: Option<u32>,
    /// Experts per layer (default: from the file, Mixtral 8, or inferred).
    #[arg(long)]
    pub(super) experts: Option<u32>,
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

    pub(super) fn options(&self) -> ReadOptions {
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
    pub(super) fn config(&self) -> CliResult<synth::SynthConfig> {
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
pub(super) enum Source {
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
pub(super) fn generate(cfg: &synth::SynthConfig, quiet: bool) -> CliResult<Trace> {
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

pub(super) fn load(input: &TraceInput, quiet: bool) -> CliResult<(Trace, Source)> {
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

/// Prints what the readers found (rows missing, passes dropped), one `read: ` line each.
pub(super) fn print_read_report(source: &Source) -> CliResult {
    if let Source::Files { read, .. } = source {
        for line in read.lines() {
            outln!("read: {line}")?;
        }
    }
    Ok(())
}
