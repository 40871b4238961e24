//! `tierkit kv ...`: the elastic sparse-attention KV pool's commands (a thin layer over
//! `kv_elastic::sim` and `kv_elastic::selection`; no policy here).
//!
//! ```text
//! tierkit kv simulate                                   # built-in synthetic scenario, load 1
//! tierkit kv simulate --trace ../shared/data/kv/mooncake/conversation_trace.jsonl \
//!     --loads 0.25,0.5,1,2,4,8 --plot docs/kv
//! tierkit kv calibrate                                  # hot-cache miss rates of the selection model
//! tierkit kv fit-time kv_serving.json                   # step-time model from the GPU benchmark's steps
//! tierkit kv plot-bench kv_serving.json --out docs/kv-gpu  # its tokens/s, batch, misses vs load
//! ```

use std::path::PathBuf;

use clap::{Args, Subcommand};
use tierkit_sim::kv::selection::{measure_hot_cache_miss_rate, SelectionParams};
use tierkit_sim::kv::serving::{simulate_placement, Placement, SimConfig, SimReport};
use tierkit_sim::kv::trace::ArrivalTrace;

use crate::{output, progress};

/// How `kv fit-time` and `kv plot-bench` name their positional report files in errors.
const REPORT: &str = "report";

mod checks;
mod plots;
mod report;
use plots::{plot_bench, write_plots};
use report::{Reports, Steps};
use tierkit_sim::table;

/// `tierkit kv`: elastic sparse-attention KV pool (HiSparse-style host history, hot cache, borrowed HBM pages).
#[derive(Debug, Args)]
pub struct KvArgs {
    #[command(subcommand)]
    command: KvCommand,
}

// Parsed once per process: the size of `simulate`'s flags costs nothing worth a box (boxing it
// would only move the lint to `main`'s command enum, whose `experts` variant is as large).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum KvCommand {
    /// Serve an arrival trace with five placements (fully resident, fixed hot cache, elastic,
    /// vllm-hybrid, sglang-demote) and compare sessions admitted, decode batch, misses, bytes
    /// moved, tokens/s, TTFT and TPOT.
    Simulate(SimulateArgs),
    /// Measure the selection model's miss rates against a bare hot cache of k / 2k / 4k rows.
    Calibrate(CalibrateArgs),
    /// Fit the simulation's step-time model (`--step-base-us`, `--step-per-request-us`,
    /// `--step-per-miss-us`) to the measured steps of `kv_serving_bench` JSON reports (pooled per placement).
    FitTime(FitTimeArgs),
    /// Plot `kv_serving_bench` JSON reports: decode tokens/s, median batch and miss MB per step
    /// against the load, one line per placement (`<OUT>-tokens.png`, `-batch.png`, `-misses.png`).
    PlotBench(PlotBenchArgs),
}

#[derive(Debug, Args)]
struct PlotBenchArgs {
    /// `kv_serving_bench --out` JSON; several reports (e.g. one per load) plot together, each
    /// placement's points sorted by load (at most 64 MiB of reports together).
    #[arg(required = true)]
    reports: Vec<PathBuf>,
    /// Output prefix of the three PNG files: `<OUT>-tokens.png`, ... It ends in a file name
    /// (`dir/bench`, not `dir/`; a trailing `.png` is dropped).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct FitTimeArgs {
    /// `kv_serving_bench --out` JSON (`runs[].placement`, `runs[].steps[].{batch, misses, step_us}`);
    /// several reports pool their steps per placement (runs at different batches condition the
    /// per-request and per-miss terms, which one load's runs leave nearly collinear). At most
    /// 64 MiB of reports together.
    #[arg(required = true)]
    reports: Vec<PathBuf>,
}

#[derive(Debug, Args)]
struct SimulateArgs {
    /// Arrival trace (JSONL with `timestamp` ms, `input_length`, `output_length`, e.g. Mooncake's
    /// `conversation_trace.jsonl`). Without it: a built-in synthetic scenario (no file needed).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Use only the first N requests of the trace.
    #[arg(long)]
    requests: Option<usize>,
    /// HBM given to KV, GiB.
    #[arg(long, default_value_t = 24.0)]
    budget_gib: f64,
    /// KV bytes per token over all layers (default: DeepSeek-V3.2 fp8 MLA, 656 B × 61 layers).
    #[arg(long, default_value_t = 656 * 61)]
    kv_bytes_per_token: u64,
    /// Top-k picks per query.
    #[arg(long, default_value_t = 2048)]
    top_k: u32,
    /// Hot-cache rows per request (default 2 × top-k).
    #[arg(long)]
    hot_rows: Option<u32>,
    /// Tail rows per request (newest positions, always resident).
    #[arg(long, default_value_t = 64)]
    tail_rows: u32,
    /// Rows per elastic page.
    #[arg(long, default_value_t = 64)]
    page_rows: u32,
    /// Largest decode batch.
    #[arg(long, default_value_t = 256)]
    max_batch: u32,
    /// Largest decode batch of the elastic placement only (default: --max-batch): a manual cap
    /// (docs/kv.md: the earlier sweep on the Mooncake arrivals). The elastic placement's own
    /// admission limit is the link-share gate (--no-elastic-gate turns it off).
    #[arg(long)]
    elastic_max_batch: Option<u32>,
    /// Admit into the elastic pool under pressure regardless of the link's share (the gate is
    /// inert anyway while misses are not priced in step time: --step-per-miss-us 0).
    #[arg(long)]
    no_elastic_gate: bool,
    /// Pages handed back / lent per step between steps.
    #[arg(long, default_value_t = 1024)]
    chunk_pages: u32,
    /// Decode steps per placement and load (1 to 1,000,000).
    #[arg(long, default_value_t = 2000)]
    steps: u64,
    /// Arrival speed-ups to run (comma separated, at most 64; 2 = arrivals twice as fast as in
    /// the trace).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    loads: Vec<f64>,
    /// Placements to run (comma separated, in report order): resident, fixed, elastic,
    /// vllm-hybrid, sglang-demote (default: all).
    #[arg(long, value_delimiter = ',')]
    placements: Vec<String>,
    /// Decode step time: fixed part, µs.
    #[arg(long, default_value_t = 25_000.0)]
    step_base_us: f64,
    /// Decode step time: per request in the batch, µs.
    #[arg(long, default_value_t = 100.0)]
    step_per_request_us: f64,
    /// Decode step time: per demand miss (one token's KV fetched from host), µs. 0 keeps misses
    /// out of step time (all placements share one schedule); `kv fit-time` fits it from the H200
    /// serving benchmark (0.95–1.07 µs there).
    #[arg(long, default_value_t = 0.0)]
    step_per_miss_us: f64,
    /// Step-time models per placement fitted to a `kv_serving_bench --out` report (as `kv
    /// fit-time` prints them), and the resident admission rate it measured; replaces the
    /// --step-* flags (and --admission-gbps unless given). Repeat it to pool several reports'
    /// steps per placement (same device and scenario; each file once; at most 64 MiB together).
    #[arg(long, conflicts_with_all = ["step_base_us", "step_per_request_us", "step_per_miss_us"])]
    time_from: Vec<PathBuf>,
    /// Host → HBM rate of the fully resident placement's admission copies, GB/s (a stall before
    /// the step that follows them; 0 = free). The pools map borrowed pages after their fill and
    /// never stall.
    #[arg(long)]
    admission_gbps: Option<f64>,
    /// Seed of the selection streams and of the synthetic scenario.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Refuse a run estimated to allocate more host memory than this, GiB (the estimate counts
    /// the page tables, the arena and the admitted sessions' state that the geometry flags size;
    /// the documented scenarios take well under 1 GiB).
    #[arg(long, default_value_t = checks::DEFAULT_MAX_MEMORY_GIB)]
    max_memory_gib: f64,
    /// Write `<PREFIX>-sessions.png` and `<PREFIX>-misses.png` (needs two loads or more). PREFIX
    /// ends in a file name (`dir/run`, not `dir/`; a trailing `.png` is dropped); checked before
    /// the run.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write the full reports as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Debug, Args)]
struct CalibrateArgs {
    /// Top-k picks per query.
    #[arg(long, default_value_t = 2048)]
    top_k: u32,
    /// History length, tokens (above --top-k; a hot cache as large as the history never misses,
    /// which is warned about).
    #[arg(long, default_value_t = 32_768)]
    history: u32,
    /// Steps measured (after a warm-up of a third as many), 3 to 100,000, and at most 2^28 picks
    /// with --top-k (steps × top-k): the warm-up must be a step or more, or the first step's cold
    /// misses (every pick misses an empty cache) are measured.
    #[arg(long, default_value_t = 300)]
    steps: u32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs `tierkit kv ...`.
///
/// # Errors
/// Trace reading errors, pool errors (invalid geometry), plot/JSON write errors.
pub fn run(args: KvArgs) -> Result<(), Box<dyn std::error::Error>> {
    match args.command {
        KvCommand::Simulate(a) => simulate(a),
        KvCommand::Calibrate(a) => calibrate(a),
        KvCommand::FitTime(a) => fit_time(a),
        KvCommand::PlotBench(a) => plot_bench(a),
    }
}

/// Per-placement step-time models fitted to bench reports (`--time-from`, steps pooled per
/// placement), and the resident admission rate they measured.
fn placement_times_from(
    paths: &[PathBuf],
) -> Result<(tierkit_sim::kv::serving::PlacementTimes, Option<f64>), Box<dyn std::error::Error>> {
    use tierkit_sim::kv::serving::{PlacementTimes, TimeModel};
    let reports = Reports::load(paths, "--time-from")?;
    let by = reports.steps_by_placement_warned();
    let steps = |name: &str| {
        by.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    };
    let fit = |name: &str| -> Result<TimeModel, Box<dyn std::error::Error>> {
        let pts =
            steps(name).ok_or_else(|| format!("{}: no `{name}` runs to fit", reports.shown()))?;
        TimeModel::fit_with_misses(pts)
            .map_err(|e| format!("{}: fitting `{name}`: {e}", reports.shown()).into())
    };
    // The engines' designs run on the same pool and resolver as elastic: without runs of their
    // own in the reports they take elastic's fit.
    let fit_or_elastic = |p: Placement| match steps(p.name()) {
        Some(_) => fit(p.name()).map(Some),
        None => Ok(None),
    };
    Ok((
        PlacementTimes {
            resident: fit(Placement::FullyResident.name())?,
            fixed: fit(Placement::FixedHotCache.name())?,
            elastic: fit(Placement::Elastic.name())?,
            vllm: fit_or_elastic(Placement::VllmHybrid)?,
            sglang: fit_or_elastic(Placement::SglangDemote)?,
        },
        reports.admission_gbps(),
    ))
}

/// `s` as one shell word: as is when it has only safe characters, else single-quoted.
fn shell_word(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn fit_time(a: FitTimeArgs) -> Result<(), Box<dyn std::error::Error>> {
    use tierkit_sim::kv::serving::TimeModel;
    let reports = Reports::load(&a.reports, REPORT)?;
    outln!(
        "{}: kv_serving_bench built from commit {}",
        reports.shown(),
        reports.commits_shown()
    )?;
    let by = reports.steps_by_placement_warned();
    let mut fitted = 0;
    let pools: Steps = by
        .iter()
        .filter(|(n, _)| n != Placement::FullyResident.name())
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    for (name, pts) in by.iter().chain(std::iter::once(&(
        "pools (every hot-cache placement)".to_string(),
        pools,
    ))) {
        match TimeModel::fit_with_misses(pts) {
            Ok(m) => {
                fitted += 1;
                outln!(
                    "{name:>24}: {:>6} steps  --step-base-us {:.0} --step-per-request-us {:.1} --step-per-miss-us {:.3}",
                    pts.len(),
                    m.step_base_us,
                    m.step_per_request_us,
                    m.step_per_miss_us
                )?
            }
            Err(e) => outln!("{name:>24}: {:>6} steps  no fit: {e}", pts.len())?,
        }
    }
    if fitted == 0 {
        return Err(format!("{}: no placement could be fitted", reports.shown()).into());
    }
    if let Some(g) = reports.admission_gbps() {
        outln!("{:>24}: --admission-gbps {g:.1}", "fully resident copies")?;
    }
    outln!(
        "(kv simulate{} applies each placement's fit and the admission rate)",
        a.reports
            .iter()
            .map(|p| format!(" --time-from {}", shell_word(&p.display().to_string())))
            .collect::<String>()
    )?;
    Ok(())
}

/// Fewest `kv calibrate --steps`: a warm-up (`steps / 3`) of one step or more.
const MIN_CALIBRATE_STEPS: u32 = 3;

fn calibrate(a: CalibrateArgs) -> Result<(), Box<dyn std::error::Error>> {
    checks::top_k(a.top_k)?;
    let p = SelectionParams::calibrated(a.top_k);
    p.validate()?;
    let (Some(k2), Some(k4)) = (a.top_k.checked_mul(2), a.top_k.checked_mul(4)) else {
        return Err(format!("--top-k {}: 4 × top-k must fit in u32", a.top_k).into());
    };
    let sizes = [a.top_k, k2, k4];
    if a.steps < MIN_CALIBRATE_STEPS {
        return Err(format!(
            "--steps {}: must be >= {MIN_CALIBRATE_STEPS} (the warm-up is a third of --steps; with \
             no warm-up step the first step, where every pick misses the empty cache, is measured)",
            a.steps
        )
        .into());
    }
    if a.steps > checks::MAX_CALIBRATE_STEPS {
        return Err(format!(
            "--steps {}: must be in [{MIN_CALIBRATE_STEPS}, {}] (the run's time grows with it)",
            a.steps,
            checks::MAX_CALIBRATE_STEPS
        )
        .into());
    }
    checks::calibrate_picks(a.steps, a.top_k)?;
    if a.top_k >= a.history {
        return Err(format!(
            "--top-k {} is not below --history {}: every step picks the whole history, so no \
             hot cache can miss (nothing to measure); raise --history or lower --top-k",
            a.top_k, a.history
        )
        .into());
    }
    if let Some(&rows) = sizes.iter().find(|&&r| r >= a.history) {
        errln!(
            "warning: hot caches of {rows} rows or more hold the whole --history {}: their miss \
             rate is 0 by construction after the warm-up (raise --history)",
            a.history
        );
    }
    let total = a.steps + a.steps / 3;
    let got = measure_hot_cache_miss_rate(p, a.history, &sizes, total, a.steps / 3, a.seed)?;
    let published = ["30%", "13.4%", "6.7%"];
    let rows: Vec<Vec<String>> = sizes
        .iter()
        .zip(&got)
        .zip(published)
        .map(|((s, g), p)| vec![format!("{s}"), format!("{:.1}%", g * 100.0), p.to_string()])
        .collect();
    outln!(
        "selection model: churn {}, Zipf s {}, uniform mix {}; top-k {}, history {}",
        p.churn,
        p.zipf_s,
        p.uniform_mix,
        a.top_k,
        a.history
    )?;
    outln!(
        "{}",
        table::render(
            &[
                "hot rows",
                "miss rate (measured)",
                "HiSparse (published, k = 2048)"
            ],
            &rows
        )
    )?;
    Ok(())
}

fn simulate(a: SimulateArgs) -> Result<(), Box<dyn std::error::Error>> {
    checks::float_flags(&a)?;
    checks::sim_steps(a.steps)?;
    checks::loads(a.loads.len())?;
    let plot_prefix = match &a.plot {
        Some(p) => Some(output::chart_prefix("--plot", p)?),
        None => None,
    };
    // The charts plot against the load: with one load there is nothing to draw (this used to
    // print "plot skipped" on stdout after the whole run, exit 0).
    if let (Some(p), 0..=1) = (&a.plot, a.loads.len()) {
        return Err(format!(
            "--plot {}: the charts plot against the load and need two loads or more \
             (--loads a,b,...)",
            p.display()
        )
        .into());
    }
    let (placement_time, measured_gbps) = match a.time_from.as_slice() {
        [] => (None, None),
        p => {
            let (t, g) = placement_times_from(p)?;
            for pl in Placement::ALL {
                let m = t.get(pl);
                let own = match pl {
                    Placement::VllmHybrid => t.vllm.is_some(),
                    Placement::SglangDemote => t.sglang.is_some(),
                    _ => true,
                };
                outln!(
                    "step time of {} (fitted to {}{}): {:.0} µs + {:.1} µs × batch + {:.3} µs × miss",
                    pl.name(),
                    report::shown(p),
                    if own { "" } else { ": no runs of its own, elastic's fit" },
                    m.step_base_us,
                    m.step_per_request_us,
                    m.step_per_miss_us
                )?;
            }
            match (g, a.admission_gbps) {
                (_, Some(x)) => outln!("resident admission copies: {x} GB/s (--admission-gbps)")?,
                (Some(x), None) => outln!("resident admission copies: {x:.1} GB/s (measured)")?,
                (None, None) => outln!(
                    "resident admission copies: free (the report has no admission bytes and copy times for the resident runs; pass --admission-gbps)"
                )?,
            }
            (Some(t), g)
        }
    };
    for (i, &load) in a.loads.iter().enumerate() {
        checks::in_range(
            "--loads",
            load,
            0.0,
            true,
            f64::MAX,
            "× the trace's arrival rate",
        )?;
        if a.loads[..i].contains(&load) {
            return Err(format!("--loads: {load} given twice").into());
        }
    }
    // SimConfig::validate refuses it too; here it is named by its flags.
    if let Some(c) = a.elastic_max_batch.filter(|&c| c > a.max_batch) {
        return Err(format!(
            "--elastic-max-batch {c} is above --max-batch {} (the cap can only lower it)",
            a.max_batch
        )
        .into());
    }
    let placements = placements_named(&a.placements)?;
    if let Some(p) = &a.json {
        tierkit_sim::output::check_writable("--json", p)?;
    }
    checks::top_k(a.top_k)?;
    SelectionParams::calibrated(a.top_k).validate()?;
    let hot_rows = match a.hot_rows {
        Some(h) => h,
        None => a.top_k.checked_mul(2).ok_or_else(|| {
            format!(
                "--top-k {}: the default --hot-rows (2 × top-k) overflows u32",
                a.top_k
            )
        })?,
    };
    let mut trace = match &a.trace {
        Some(p) => ArrivalTrace::from_path(p)?,
        None => ArrivalTrace::synthetic(2000, 3.0, a.seed),
    };
    if let Some(n) = a.requests {
        if n == 0 {
            return Err("--requests must be >= 1".into());
        }
        trace.truncate(n);
    }
    for &load in &a.loads {
        trace.check_load(load)?;
    }
    let base = SimConfig {
        // Finite and > 0 (checked above); `as` saturates a huge budget, which the geometry rejects.
        hbm_budget_bytes: (a.budget_gib * (1u64 << 30) as f64) as u64,
        kv_bytes_per_token: a.kv_bytes_per_token,
        hot_rows,
        tail_rows: a.tail_rows,
        page_rows: a.page_rows,
        max_batch: a.max_batch,
        elastic_max_batch: a.elastic_max_batch,
        elastic_link_gate: !a.no_elastic_gate,
        chunk_pages: a.chunk_pages,
        time: tierkit_sim::kv::serving::TimeModel {
            step_base_us: a.step_base_us,
            step_per_request_us: a.step_per_request_us,
            step_per_miss_us: a.step_per_miss_us,
        },
        placement_time,
        admission_gbps: a.admission_gbps.or(measured_gbps).unwrap_or(0.0),
        max_steps: a.steps,
        load: 1.0,
        selection: SelectionParams::calibrated(a.top_k),
        seed: a.seed,
        // checks::memory refuses above it first, naming the flags; the library checks it too
        // (a finite GiB within range: `as` saturates)
        max_memory_bytes: (a.max_memory_gib * (1u64 << 30) as f64) as u64,
    };
    checks::geometry(&a, &base)?;
    for &load in &a.loads {
        SimConfig { load, ..base }.validate()?;
    }
    checks::memory(&a, &base, &trace)?;
    // Last of the checks: the flags' own bounds and the memory estimate name the flag first.
    checks::sim_picks(
        a.steps,
        a.max_batch,
        a.top_k,
        a.loads.len(),
        placements.len(),
    )?;
    outln!(
        "trace {} ({} requests); HBM budget {:.1} GiB = {} tokens of {} B; top-k {}, hot {} + tail {} rows, pages of {} rows",
        trace.name,
        trace.requests.len(),
        a.budget_gib,
        base.budget_rows(),
        base.kv_bytes_per_token,
        a.top_k,
        base.hot_rows,
        base.tail_rows,
        base.page_rows
    )?;
    let bar = progress::bar(
        (a.loads.len() * placements.len()) as u64,
        "simulating",
        a.quiet,
    );
    let mut reports = Vec::new();
    for &load in &a.loads {
        let cfg = SimConfig { load, ..base };
        let mut runs = Vec::new();
        for &p in &placements {
            bar.set_message(format!("load {load}, {}", p.name()));
            runs.push(simulate_placement(&trace, &cfg, p)?);
            bar.inc(1);
        }
        reports.push(SimReport {
            trace: trace.name.clone(),
            config: cfg,
            placements: runs,
        });
    }
    bar.finish_and_clear();
    print_reports(&reports)?;
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)?)
            .map_err(|e| format!("--json {}: {e}", path.display()))?;
        outln!("wrote {}", path.display())?;
    }
    if let Some(prefix) = &plot_prefix {
        write_plots(prefix, &reports)?;
    }
    Ok(())
}

/// The placements `--placements` names (`resident`, `fixed`, `elastic`, `vllm-hybrid`,
/// `sglang-demote`; each once), in report order; all of them when none is named.
fn placements_named(names: &[String]) -> Result<Vec<Placement>, String> {
    const NAMES: [&str; 5] = [
        "resident",
        "fixed",
        "elastic",
        "vllm-hybrid",
        "sglang-demote",
    ];
    if names.is_empty() {
        return Ok(Placement::ALL.to_vec());
    }
    let mut out: Vec<Placement> = Vec::new();
    for n in names {
        let Some(i) = NAMES.iter().position(|x| x == n) else {
            return Err(format!(
                "--placements: unknown placement {n:?} (one of {})",
                NAMES.join(", ")
            ));
        };
        if out.contains(&Placement::ALL[i]) {
            return Err(format!("--placements: {n} given twice"));
        }
        out.push(Placement::ALL[i]);
    }
    out.sort_by_key(|p| Placement::ALL.iter().position(|q| q == p));
    Ok(out)
}

fn print_reports(reports: &[SimReport]) -> Result<(), Box<dyn std::error::Error>> {
    let header = [
        "load",
        "placement",
        "peak sessions",
        "median batch",
        "misses / step",
        "miss % of picks",
        "MB fetched / step",
        "MB page fill / step",
        "zero-miss steps",
        "pages reclaimed",
        "pages handed back",
        "finished",
        "sim s",
    ];
    let mut rows = Vec::new();
    for rep in reports {
        for r in &rep.placements {
            rows.push(vec![
                format!("{}", rep.config.load),
                r.placement.name().to_string(),
                r.peak_sessions.to_string(),
                r.median_batch.to_string(),
                format!("{:.0}", r.misses_per_step),
                format!(
                    "{:.2}",
                    100.0 * r.misses_per_step / r.picks_per_step.max(1.0)
                ),
                format!("{:.1}", r.fetched_bytes_per_step / 1e6),
                format!("{:.1}", r.fill_bytes_per_step / 1e6),
                format!("{:.0}%", 100.0 * r.zero_miss_steps),
                r.pages_reclaimed.to_string(),
                r.pages_handed_back.to_string(),
                r.completed.to_string(),
                format!("{:.0}", r.sim_seconds),
            ]);
        }
    }
    outln!("{}", table::render(&header, &rows))?;
    let timed = |c: &SimConfig| {
        c.placement_time.is_some()
            || c.time.step_per_miss_us > 0.0
            || c.admission_gbps > 0.0
            || c.elastic_max_batch.is_some()
    };
    for rep in reports {
        let by = |p: Placement| rep.placements.iter().find(|r| r.placement == p);
        let (Some(full), Some(fixed), Some(el)) = (
            by(Placement::FullyResident),
            by(Placement::FixedHotCache),
            by(Placement::Elastic),
        ) else {
            continue;
        };
        outln!(
            "load {}: elastic admits {}× the fully resident peak ({} vs {}); misses/step elastic {:.0} vs fixed {:.0} ({})",
            rep.config.load,
            ratio(el.peak_sessions as f64, full.peak_sessions as f64),
            el.peak_sessions,
            full.peak_sessions,
            el.misses_per_step,
            fixed.misses_per_step,
            if el.misses_per_step <= fixed.misses_per_step { "elastic ≤ fixed" } else { "ELASTIC > FIXED" }
        )?;
        if timed(&rep.config) {
            let others: Vec<String> = rep
                .placements
                .iter()
                .filter(|r| r.placement != Placement::Elastic)
                .map(|r| {
                    format!(
                        "÷ {} {}",
                        r.placement.name(),
                        ratio(el.tokens_per_s, r.tokens_per_s)
                    )
                })
                .collect();
            outln!(
                "load {}: elastic decode tokens/s {:.0} ({})",
                rep.config.load,
                el.tokens_per_s,
                others.join(", ")
            )?;
        }
    }
    if reports.iter().any(|r| timed(&r.config)) {
        outln!("{}", serving_table(reports))?;
    }
    Ok(())
}

/// The serving comparison per load: tokens/s, sessions, TTFT p50/p90 over the requests every
/// placement finished, TPOT p50/p99 (requests finished in the run), miss and host-write traffic,
/// device bytes.
fn serving_table(reports: &[SimReport]) -> String {
    use tierkit_sim::kv::schedule::{common_finished, quantiles_ms, RequestTiming};
    let header = [
        "load",
        "placement",
        "tokens/s",
        "÷ elastic",
        "peak sessions",
        "mean batch",
        "TTFT p50 / p90 (ms, common)",
        "TPOT p50 / p99 (ms)",
        "miss MB/step",
        "host-write MB/step",
        "device GiB peak / mean",
    ];
    let mut rows = Vec::new();
    for rep in reports {
        let runs: Vec<&[RequestTiming]> = rep
            .placements
            .iter()
            .map(|r| r.requests.as_slice())
            .collect();
        let common = common_finished(&runs);
        let el = rep
            .placements
            .iter()
            .find(|r| r.placement == Placement::Elastic)
            .map_or(0.0, |r| r.tokens_per_s);
        let gib = (1u64 << 30) as f64;
        for r in &rep.placements {
            let ttft = quantiles_ms(&r.requests, &common, RequestTiming::ttft_us, &[0.5, 0.9]);
            rows.push(vec![
                format!("{}", rep.config.load),
                r.placement.name().to_string(),
                format!("{:.0}", r.tokens_per_s),
                ratio(r.tokens_per_s, el),
                r.peak_sessions.to_string(),
                format!("{:.1}", r.mean_batch),
                format!("{:.0} / {:.0} ({} req)", ttft[0], ttft[1], common.len()),
                format!("{:.2} / {:.2}", r.tpot_p50_ms, r.tpot_p99_ms),
                format!("{:.1}", r.fetched_bytes_per_step / 1e6),
                format!(
                    "{:.1}",
                    (r.mirror_bytes_per_step + r.writeback_bytes_per_step) / 1e6
                ),
                format!(
                    "{:.2} / {:.2}",
                    r.device_bytes_peak as f64 / gib,
                    r.device_bytes_mean / gib
                ),
            ]);
        }
    }
    table::render(&header, &rows)
}

/// `a ÷ b` to two decimals, `n/a` when `b` is not positive or the ratio is not a number to print.
fn ratio(a: f64, b: f64) -> String {
    let r = a / b;
    if b > 0.0 && r.is_finite() && r < 1e6 {
        format!("{r:.2}")
    } else {
        "n/a".to_string()
    }
}
