//! `tierkit experts replay`: every policy replayed over one trace, the scoreboard table or JSON,
//! and (`plot`) its charts; `--mode` other than in-place goes to `modes`.

use super::source::{load, print_read_report, Source, TraceInput};
use super::{default_hot, CliResult, OLMOE_EXPERT_BYTES};
use crate::{input, output, progress};
use clap::{Args, ValueEnum};
use expert_residency::{ControllerConfig, Geometry, MapFile, ResidencyMap};
use serde::Serialize;
use std::path::PathBuf;
use tierkit_sim::experts::scoreboard::{self, Boot, Policy, Run, ScoreRow};
use tierkit_sim::experts::trace::{self, Trace};
use tierkit_sim::experts::{LinkModel, ReplayOptions};

mod modes;
mod plot;

use plot::{plot_runs, stall_plot_path};

/// Most `--count-run-starts`: a run start counted as up to the picks of a 256-token decode
/// batch (the largest batch of the documented scenarios). Each run start is recorded that many
/// times, and a drain's counter deltas must stay below 2^31.
const MAX_COUNT_RUN_STARTS: u32 = 256;

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

pub(super) fn replay_cmd(a: ReplayArgs) -> CliResult {
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
    // `--optimum always` computes the optimum or fails: where the link makes it impossible, fail
    // before the trace and the other rows (the scoreboard failed after replaying every other
    // policy; a modes table's check is `modes::check`'s).
    if a.optimum == OptimumArg::Always
        && mode_opts.is_none()
        && policies(&a.policy).contains(&Policy::Optimum)
    {
        tierkit_sim::experts::check_optimum_link(&opts.link)
            .map_err(|e| format!("--optimum always: {e} (--hide-us 0), or --optimum auto"))?;
    }
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
