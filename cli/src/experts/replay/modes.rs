//! `tierkit experts replay --mode ...`: the engine modes' table (`tierkit_sim::experts::modes`).
//! `--mode in-place` (the default) is the scoreboard as before; any other mode replays the
//! modes' policies in that mode (`all`: every mode) and prints one table whose first column names
//! the mode each row assumes.

use clap::{Args, ValueEnum};
use expert_residency::{Geometry, ResidencyMap};
use serde::Serialize;
use tierkit_sim::experts::modes::{self, CpuChannel, EngineMode, ModeOptima, ModeOptions, ModeRow};
use tierkit_sim::experts::scoreboard::Boot;
use tierkit_sim::experts::trace::Trace;
use tierkit_sim::experts::LinkModel;

use super::{
    print_trace_info, progress, CliResult, OptimumArg, PolicyArg, ReplayArgs, Source, TraceInfo,
};

/// How the engine serves a cold expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum ModeArg {
    /// Read in place over the link, copies at step boundaries: the scoreboard (as before).
    InPlace,
    /// A miss is copied into HBM and computed there in the same step (LRU bank per layer or
    /// shared; the policies' maps as admission and eviction).
    CopyOnMiss,
    /// Per expert and step, read in place or copy, whichever the link prices lower given the
    /// expected reuse.
    ReadOrCopy,
    /// Cold experts split between the link and the host CPU, in parallel.
    Cpu,
    /// Every mode, in-place included, in one table.
    All,
}

/// `--mode` and the CPU channel's prices.
#[derive(Debug, Args)]
pub(super) struct ModeArgs {
    /// Engine mode: in-place prints the scoreboard; the others print the modes table (static,
    /// seed, cost-aware, recency, LRU per-layer and shared bank) in that mode, all in every mode.
    #[arg(long, value_enum, default_value_t = ModeArg::InPlace)]
    mode: ModeArg,
    /// CPU channel (--mode cpu, all): GB/s of expert weights the host CPU computes through
    /// (default 50.7, measured on the H200 machine).
    #[arg(long, value_name = "GB/S")]
    cpu_gbps: Option<f64>,
    /// CPU channel (--mode cpu, all): fraction of its solo rate each of the link and the CPU
    /// keeps while both run (default 0.90, measured on the H200 machine).
    #[arg(long, value_name = "F")]
    cpu_together: Option<f64>,
}

impl ModeArgs {
    /// The modes of the table; `None` for `in-place` (the scoreboard).
    fn modes(&self) -> Option<Vec<EngineMode>> {
        match self.mode {
            ModeArg::InPlace => None,
            ModeArg::CopyOnMiss => Some(vec![EngineMode::CopyOnMiss]),
            ModeArg::ReadOrCopy => Some(vec![EngineMode::ReadOrCopy]),
            ModeArg::Cpu => Some(vec![EngineMode::Cpu]),
            ModeArg::All => Some(EngineMode::ALL.to_vec()),
        }
    }
}

/// Checks the mode flags against the rest of `a` before any trace is read: the CPU prices, and
/// no scoreboard-only flag beside a mode table. `Some(options)` when a modes table is asked for.
pub(super) fn check(a: &ReplayArgs, link: &LinkModel) -> CliResult<Option<ModeOptions>> {
    let m = &a.modes;
    if m.modes().is_none() {
        if m.cpu_gbps.is_some() || m.cpu_together.is_some() {
            return Err(
                "--cpu-gbps and --cpu-together price the CPU channel of --mode cpu or all; \
                        not with --mode in-place"
                    .into(),
            );
        }
        return Ok(None);
    }
    let only: [(&str, bool); 7] = [
        ("--policy", a.policy != [PolicyArg::All]),
        ("--plot", a.plot.is_some()),
        ("--verify-bytes", a.verify_bytes.is_some()),
        ("--count-run-starts", a.count_run_starts.is_some()),
        ("--bytes-per-step", a.bytes_per_step),
        ("--config", a.config.is_some()),
        (
            "--drain-every/--half-life-steps",
            a.drain_every.is_some() || a.half_life_steps.is_some(),
        ),
    ];
    if let Some((flag, _)) = only.iter().find(|(_, given)| *given) {
        return Err(format!(
            "{flag} applies to the in-place scoreboard; --mode {} prints the modes table \
             (its rows: static, seed, cost-aware (default), recency, lru per-layer and shared)",
            m.mode
                .to_possible_value()
                .expect("no skipped value")
                .get_name()
        )
        .into());
    }
    let modes = m.modes().expect("checked above: a modes table");
    if (m.cpu_gbps.is_some() || m.cpu_together.is_some()) && !modes.contains(&EngineMode::Cpu) {
        return Err(format!(
            "--cpu-gbps and --cpu-together price the CPU channel of --mode cpu or all; not with \
             --mode {} (it has no CPU channel)",
            m.mode
                .to_possible_value()
                .expect("no skipped value")
                .get_name()
        )
        .into());
    }
    // `--optimum always` on a mode with an optimum (every mode but cpu): refused up front where
    // the link makes it impossible (it used to print "not computed" and exit 0).
    if a.optimum == OptimumArg::Always && modes.iter().any(|&m| m != EngineMode::Cpu) {
        tierkit_sim::experts::check_optimum_link(link)
            .map_err(|e| format!("--optimum always: {e} (--hide-us 0), or --optimum auto"))?;
    }
    let d = CpuChannel::h200();
    let opts = ModeOptions {
        link: link.clone(),
        cpu: CpuChannel {
            cpu_gbps: m.cpu_gbps.unwrap_or(d.cpu_gbps),
            together: m.cpu_together.unwrap_or(d.together),
        },
    };
    opts.cpu
        .validate()
        .map_err(|e| format!("--cpu-gbps/--cpu-together: {e}"))?;
    Ok(Some(opts))
}

#[derive(Debug, Serialize)]
struct ModesOutput {
    command: &'static str,
    trace: TraceInfo,
    geometry: Geometry,
    seed_map: String,
    boot: Boot,
    modes: Vec<EngineMode>,
    options: ModeOptions,
    rows: Vec<ModeRow>,
    /// The offline optimum per mode and bank (`vs_optimum` of `rows` divides by these), and why
    /// any is not computed.
    optima: ModeOptima,
}

/// The modes table of `a.modes` on `trace` (everything else as the scoreboard's replay).
#[allow(clippy::too_many_arguments)]
pub(super) fn replay(
    a: &ReplayArgs,
    opts: &ModeOptions,
    trace: &Trace,
    source: Source,
    g: &Geometry,
    seed: &ResidencyMap,
    seed_note: String,
    boot: Boot,
) -> CliResult {
    let modes = a.modes.modes().expect("checked: a modes table");
    let policies = modes::mode_policies(trace, g, seed, boot)?;
    let pb = progress::spinner("replaying engine modes", a.json);
    let mut rows = modes::mode_rows(trace, g, &policies, &modes, opts)?;
    let optima = match a.optimum {
        OptimumArg::Never => ModeOptima {
            rows: vec![],
            notes: vec!["offline optima not computed: --optimum never".into()],
        },
        OptimumArg::Auto => modes::mode_optima(
            trace,
            g,
            &modes,
            opts,
            Some(tierkit_sim::experts::OPTIMUM_AUTO_MAX_WORK),
        )?,
        OptimumArg::Always => modes::mode_optima(trace, g, &modes, opts, None)?,
    };
    optima.fill(&mut rows);
    pb.finish_and_clear();
    let out = ModesOutput {
        command: "tierkit experts replay --mode",
        trace: TraceInfo::of(trace, source),
        geometry: *g,
        seed_map: seed_note,
        boot,
        modes,
        options: opts.clone(),
        rows,
        optima,
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    let t = &out.trace;
    print_trace_info(t)?;
    outln!(
        "hot {} of {} experts per layer; seed map {}; adaptive and lru boot from the {} map; expert {} bytes; link {}",
        g.hot_per_layer,
        g.experts_per_layer,
        out.seed_map,
        match boot {
            Boot::FirstK => "first-k",
            Boot::Seed => "seed",
        },
        g.expert_bytes,
        opts.link.name
    )?;
    outln!(
        "engine modes: {}",
        out.modes
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    outln!()?;
    outln!("{}", modes::render_modes(&out.rows, &out.optima.rows))?;
    for n in &out.optima.notes {
        outln!("offline optimum {n}")?;
    }
    outln!("\n{}", modes::modes_legend(opts))?;
    Ok(())
}
