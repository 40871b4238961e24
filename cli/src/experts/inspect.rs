//! `tierkit experts inspect`: a trace's shape, reuse and skew (the summary `synth` prints too).

use super::source::{load, print_read_report, TraceInput};
use super::CliResult;
use clap::Args;
use serde::Serialize;
use tierkit_sim::experts::trace::{self, stats, Trace};
use tierkit_sim::table;

#[derive(Debug, Serialize)]
pub(super) struct TraceSummary {
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

pub(super) fn summarize_trace(t: &Trace) -> CliResult<TraceSummary> {
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

pub(super) fn print_summary(s: &TraceSummary) -> CliResult {
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

/// `tierkit experts inspect` arguments.
#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    input: TraceInput,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn inspect_cmd(a: InspectArgs) -> CliResult {
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
