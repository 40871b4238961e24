//! PNG line charts (plotters, bitmap backend) shared by the `experts` and `kv` commands.
//!
//! Text is drawn with an embedded font (Hack, MIT + Bitstream Vera licence, shipped by the
//! `epaint_default_fonts` crate), so charts render on machines without system fonts.

use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

/// Font family name the embedded font is registered under.
const FONT: &str = "sans-serif";

/// One named series of `(x, y)` points.
pub type Series = (String, Vec<(f64, f64)>);

/// A line chart: several series, optional labelled vertical markers (e.g. domain shifts).
#[derive(Clone, Debug)]
pub struct ChartSpec {
    /// Title on top.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// The series, drawn in order with distinct colours.
    pub series: Vec<Series>,
    /// Vertical markers `(x, label)`.
    pub markers: Vec<(f64, String)>,
    /// Image size in pixels.
    pub size: (u32, u32),
    /// Y range; `None` fits the data (from 0).
    pub y_range: Option<(f64, f64)>,
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded TTF is valid; a failure would only lose text, never the chart.
        let _ = plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            epaint_default_fonts::HACK_REGULAR,
        );
    });
}

/// Largest magnitude a chart accepts on either axis (far beyond any tokens/s, bytes or share).
const MAX_PLOTTED: f64 = 1e15;

/// Series of at most this many points get a marker on every point (a benchmark's few loads);
/// longer ones (per-step curves) are lines only.
const MARKED_POINTS: usize = 24;

/// Draws `series` as a PNG line chart at `path` (1200×700 px, y from 0). Used by `tierkit kv`.
///
/// # Errors
/// Drawing or encoding errors from plotters (bad path, unwritable file), as a boxed error.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>> {
    draw(
        path,
        &ChartSpec {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: series.to_vec(),
            markers: Vec::new(),
            size: (1200, 700),
            y_range: None,
        },
    )
}

/// Draws a [`ChartSpec`] as a PNG at `path`.
///
/// # Errors
/// As [`line_chart`]; also an error for a spec without any point. Every message names the file
/// and reads as text (the output file is created first, so a bad path reports the OS error).
pub fn draw(path: &Path, spec: &ChartSpec) -> Result<(), Box<dyn std::error::Error>> {
    register_font();
    // plotters reports file errors in Rust debug form (`ImageError(IoError(Os { .. }))`) and
    // only after drawing: open the file first for a plain message.
    let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
    if !spec.series.iter().any(|s| s.1.iter().any(finite)) {
        return Err(format!("{}: nothing to plot", path.display()).into());
    }
    std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    draw_png(path, spec).map_err(|e| {
        // no half-written PNG left behind
        let _ = std::fs::remove_file(path);
        format!("{}: cannot draw the chart: {e}", path.display()).into()
    })
}

fn draw_png(path: &Path, spec: &ChartSpec) -> Result<(), Box<dyn std::error::Error>> {
    let points = spec.series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y0, mut y1) = (0.0f64, 0.0f64);
    for &(x, y) in points {
        if x.is_finite() && y.is_finite() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if !x0.is_finite() {
        return Err(format!("{}: nothing to plot", path.display()).into());
    }
    // plotters spins on ranges whose ticks overflow: refuse values no chart of ours can mean.
    if [x0, x1, y0, y1].iter().any(|v| v.abs() > MAX_PLOTTED) {
        return Err(format!(
            "{}: values beyond ±{MAX_PLOTTED:e} cannot be plotted (x {x0}..{x1}, y {y0}..{y1})",
            path.display()
        )
        .into());
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let (ylo, yhi) = spec.y_range.unwrap_or(if y1 > y0 {
        // y from 0 (or the lowest negative value), 8% of headroom
        let pad = (y1 - y0) * 0.08;
        (if y0 < 0.0 { y0 - pad } else { 0.0 }, y1 + pad)
    } else {
        (0.0, 1.0)
    });
    let root = BitMapBackend::new(path, spec.size).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&spec.title, (FONT, 26))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, ylo..yhi)?;
    chart
        .configure_mesh()
        .x_desc(&spec.x_label)
        .y_desc(&spec.y_label)
        .x_label_formatter(&|x| tick_label(*x))
        .y_label_formatter(&|y| tick_label(*y))
        .label_style((FONT, 16))
        .axis_desc_style((FONT, 18))
        .draw()?;
    for (x, label) in &spec.markers {
        let grey = RGBColor(120, 120, 120);
        chart.draw_series(LineSeries::new(
            vec![(*x, ylo), (*x, yhi)],
            grey.stroke_width(1),
        ))?;
        chart.draw_series(std::iter::once(Text::new(
            label.clone(),
            (*x, yhi - (yhi - ylo) * 0.04),
            (FONT, 16).into_font().color(&grey),
        )))?;
    }
    for (i, (name, pts)) in spec.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        // A series of few points (a benchmark's loads) shows each measured point: the lines
        // between them are not measurements.
        if pts.len() <= MARKED_POINTS {
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 16))
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// A tick label with as few decimals as the value needs (`3`, `0.25`, `0.5`), at most three.
fn tick_label(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_keep_the_decimals_they_need() {
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(3.0), "3");
        assert_eq!(tick_label(8000.0), "8000");
        assert_eq!(tick_label(-0.0001), "0");
        assert_eq!(tick_label(0.7692), "0.769");
    }

    #[test]
    fn draws_a_png_with_text() {
        let dir = std::env::temp_dir().join(format!("tierkit-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("chart.png");
        let s: Vec<Series> = vec![
            (
                "a".into(),
                (0..50)
                    .map(|i| (i as f64, (i as f64).sin().abs()))
                    .collect(),
            ),
            ("b".into(), (0..50).map(|i| (i as f64, 0.5)).collect()),
        ];
        line_chart(&p, "title", "step", "cold share", &s).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let missing = dir.join("no-such-dir").join("chart.png");
        let e = line_chart(&missing, "t", "x", "y", &s)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&missing.display().to_string()) && !e.contains("Os {"),
            "{e}"
        );
        assert!(draw(
            &p,
            &ChartSpec {
                title: String::new(),
                x_label: String::new(),
                y_label: String::new(),
                series: vec![],
                markers: vec![],
                size: (100, 100),
                y_range: None,
            }
        )
        .is_err());
        // a value too large to plot is an error, not a hang, and leaves no file
        let huge = dir.join("huge.png");
        let s: Vec<Series> = vec![("a".into(), vec![(0.0, 1.7e308), (1.0, 1.0)])];
        let e = line_chart(&huge, "t", "x", "y", &s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be plotted"), "{e}");
        assert!(!huge.exists());
        // negative values get an axis that shows them
        let neg = dir.join("neg.png");
        let s: Vec<Series> = vec![("a".into(), vec![(0.0, -3.0), (1.0, -1.0)])];
        line_chart(&neg, "t", "x", "y", &s).unwrap();
        assert!(std::fs::metadata(&neg).unwrap().len() > 0);
    }
}
