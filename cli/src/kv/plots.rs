//! The charts of `tierkit kv`: `plot-bench` (a GPU serving benchmark's reports against the load)
//! and `simulate --plot` (the simulation's sessions and misses against the load).

use std::path::PathBuf;

use tierkit_sim::kv::serving::{Placement, SimReport};

use super::{PlotBenchArgs, REPORT};
use crate::kv::report::Reports;
use crate::{output, plot};

/// One chart of `plot-bench`: file suffix, title, y label, and the y value of a run.
type BenchChart<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a dyn Fn(&serde_json::Value) -> Option<f64>,
);

pub(super) fn plot_bench(a: PlotBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let prefix = output::chart_prefix("--out", &a.out)?;
    let reports = Reports::load(&a.reports, REPORT)?;
    let name = |suffix: &str| output::with_suffix(&prefix, suffix);
    let x = "log2 of the arrival speed-up (× trace rate)";
    let tokens_title = format!(
        "Decode tokens/s vs load ({}, measured)",
        reports.device.as_deref().unwrap_or("GPU")
    );
    let charts: [BenchChart; 3] = [
        ("-tokens.png", &tokens_title, "decode tokens/s", &|r| {
            r["summary"]["tokens_per_s"].as_f64()
        }),
        (
            "-batch.png",
            "Median decode batch vs load",
            "median batch",
            &|r| r["summary"]["median_batch"].as_f64(),
        ),
        (
            "-misses.png",
            "Miss traffic per decode step vs load",
            "MB fetched from host per step",
            &|r| r["miss_bytes_per_step"].as_f64().map(|b| b / 1e6),
        ),
    ];
    for (suffix, title, y, f) in charts {
        let path = name(suffix);
        let s = reports.series_by_load(f)?;
        if s.is_empty() {
            return Err(format!(
                "{}: no run has the fields this chart needs",
                reports.shown()
            )
            .into());
        }
        std::fs::File::create(&path).map_err(|e| format!("--out {}: {e}", path.display()))?;
        plot::line_chart(&path, title, x, y, &s)
            .map_err(|e| format!("--out {}: {e}", path.display()))?;
        outln!("wrote {}", path.display())?;
    }
    Ok(())
}

/// `kv simulate --plot`: peak sessions and misses per step against the load, one line per
/// placement.
pub(super) fn write_plots(
    prefix: &std::path::Path,
    reports: &[SimReport],
) -> Result<(), Box<dyn std::error::Error>> {
    let series =
        |f: &dyn Fn(&tierkit_sim::kv::serving::PlacementReport) -> f64| -> Vec<plot::Series> {
            Placement::ALL
                .iter()
                .filter_map(|&p| {
                    let mut pts: Vec<(f64, f64)> = reports
                        .iter()
                        .filter_map(|r| {
                            let run = r.placements.iter().find(|x| x.placement == p)?;
                            Some((r.config.load, f(run)))
                        })
                        .collect();
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    (!pts.is_empty()).then(|| (p.name().to_string(), pts))
                })
                .collect()
        };
    let name = |suffix: &str| output::with_suffix(prefix, suffix);
    // Open each file first so an I/O error reads as one (plotters' bitmap errors print as Rust
    // debug text), then name the file in any drawing error.
    let chart = |path: &PathBuf, title: &str, y: &str, s: &[plot::Series]| -> Result<(), String> {
        std::fs::File::create(path).map_err(|e| format!("--plot {}: {e}", path.display()))?;
        plot::line_chart(path, title, "arrival speed-up (× trace rate)", y, s)
            .map_err(|e| format!("--plot {}: {e}", path.display()))
    };
    let sessions = name("-sessions.png");
    chart(
        &sessions,
        "Peak concurrent sessions vs load (same HBM budget)",
        "sessions admitted (peak)",
        &series(&|r| r.peak_sessions as f64),
    )?;
    let misses = name("-misses.png");
    chart(
        &misses,
        "Demand misses per decode step vs load",
        "positions fetched from host per step",
        &series(&|r| r.misses_per_step),
    )?;
    outln!("wrote {} and {}", sessions.display(), misses.display())?;
    Ok(())
}
