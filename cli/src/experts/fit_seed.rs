//! `tierkit experts fit-seed`: a seed map fitted from a counter dump, a trace or routing counts.

use super::source::TraceFiles;
use super::{default_hot, CliResult, OLMOE_EXPERT_BYTES};
use crate::input;
use clap::{Args, ValueEnum};
use expert_residency::{fit_seed_map, seed_coverage, Coverage, Geometry};
use serde::Serialize;
use std::path::PathBuf;
use tierkit_sim::experts::trace;

/// What `fit-seed` ranks experts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RankArg {
    /// Steps in which the expert was picked at all (the map of least stall).
    Touched,
    /// Picks (the map of least cold share).
    Picks,
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
    /// Steps of the trace to count, `START..END` (default: all; --trace only: counts have no steps).
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

pub(super) fn fit_seed_cmd(a: FitSeedArgs) -> CliResult {
    if a.rank == Some(RankArg::Touched) && a.files.trace.is_empty() {
        return Err(
            "--rank touched needs steps (--trace); counts (--dump, --eplb-counts, \
                    --routing-counts) rank by picks"
                .into(),
        );
    }
    // Counts have no steps to select: a --range beside them was ignored, exit 0.
    if a.range.is_some() && a.files.trace.is_empty() {
        return Err(
            "--range selects steps of a trace (--trace); counts (--dump, --eplb-counts, \
                    --routing-counts) have none: fit on the whole counts, or dump the range's"
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
            return Err(match (a.files.layers, a.files.experts) {
                // Given as 0: say so (it read as if the flags were missing).
                (Some(0), _) | (_, Some(0)) => "--layers and --experts must be at least 1".into(),
                _ => format!("model {:?}: give --layers and --experts", a.model),
            }
            .into());
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
