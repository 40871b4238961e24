//! `tierkit experts replay --plot`: the cold-share and stall charts of a replay.

use super::ReplayOutput;
use crate::experts::CliResult;
use crate::plot;
use std::path::{Path, PathBuf};
use tierkit_sim::experts::scoreboard::Run;

/// `FILE.png` → `FILE-stall.png` (the stall chart beside the cold-share chart).
pub(super) fn stall_plot_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or("plot".into(), |s| s.to_string_lossy());
    path.with_file_name(format!("{stem}-stall.png"))
}

/// Two charts: cold share per window at `path`, modelled stall per step (window mean, ms) at
/// [`stall_plot_path`].
pub(super) fn plot_runs(path: &Path, out: &ReplayOutput) -> CliResult {
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
