//! PNG line charts (plotters, bitmap backend) shared by the `experts` and `kv` commands.
//!
//! Text is drawn with an embedded font (Hack, MIT + Bitstream Vera licence, shipped by the
//! `epaint_default_fonts` crate), so charts render on machines without system fonts.

use plotters::coord::types::RangedCoordf64;
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
    /// The series, drawn in order with distinct colour-blind-safe colours (Okabe-Ito) and marker
    /// shapes; earlier series are drawn wider, so one that a later one covers stays visible. A
    /// series identical to a later one (same points) is drawn as a wide band with large marks
    /// under it and its legend entry names the series on top (`fixed hot cache (= elastic)`).
    pub series: Vec<Series>,
    /// Vertical markers `(x, label)`.
    pub markers: Vec<(f64, String)>,
    /// Image size in pixels.
    pub size: (u32, u32),
    /// Y range; `None` fits the data: from 0 when the data reaches down near 0 (its lowest value
    /// below its spread), else around the data (so 150-210 ms is not squeezed at the top).
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
/// longer ones (per-step curves) get about [`MARKS_PER_LONG_SERIES`] markers, each series' marks
/// shifted along the line, so series that coincide still show every series' marker.
const MARKED_POINTS: usize = 24;

/// Markers on a series longer than [`MARKED_POINTS`].
const MARKS_PER_LONG_SERIES: usize = 12;

/// The Okabe-Ito colour-blind-safe palette (Okabe & Ito, "Color Universal Design", 2008) with
/// two more for charts of up to ten series (grey, and Paul Tol's "wine"), in the order series get
/// them: blue, vermillion, bluish green, reddish purple, orange, sky blue, black, grey, wine, and
/// yellow last (the weakest on white). Series beyond ten reuse them with another marker.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(128, 128, 128),
    RGBColor(136, 34, 85),
    RGBColor(240, 228, 66),
];

/// Marker shapes, by series index (with the colour, a series is told apart in grey print too).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    Circle,
    Triangle,
    Square,
    Cross,
    Diamond,
}

const SHAPES: [Shape; 5] = [
    Shape::Circle,
    Shape::Triangle,
    Shape::Square,
    Shape::Cross,
    Shape::Diamond,
];

/// Colour, marker and line width of series `i` of `n`: from 4 px for the first series down to
/// 2 px for the last, so a later series drawn on top of an earlier one leaves its edges visible.
fn style_of(i: usize, n: usize) -> (RGBColor, Shape, u32) {
    let width =
        2 + (2 * (n.saturating_sub(1).saturating_sub(i)) / n.saturating_sub(1).max(1)) as u32;
    (
        PALETTE[i % PALETTE.len()],
        SHAPES[(i + i / PALETTE.len()) % SHAPES.len()],
        width,
    )
}

/// Indices of the points of series `i` (of `n`) that get a marker: all of a short series; about
/// [`MARKS_PER_LONG_SERIES`] of a long one, the series' marks shifted by `i / n` of the gap.
fn marked(len: usize, i: usize, n: usize) -> Vec<usize> {
    if len <= MARKED_POINTS {
        return (0..len).collect();
    }
    let gap = len.div_ceil(MARKS_PER_LONG_SERIES).max(1);
    let start = gap * i / n.max(1);
    (start..len).step_by(gap).collect()
}

/// For each series, the later series with exactly the same points (drawn on top of it, they hide
/// it): the first of them and how many there are; `None` for a series nothing covers.
fn covered_by(series: &[Series]) -> Vec<Option<(usize, u32)>> {
    (0..series.len())
        .map(|i| {
            let same: Vec<usize> = (i + 1..series.len())
                .filter(|&j| series[j].1 == series[i].1)
                .collect();
            Some((*same.first()?, same.len() as u32))
        })
        .collect()
}

/// Extra line width and marker size, in pixels, of a series per later identical one covering it
/// (nested bands: each copy stays visible around the one on top of it).
const COVERED_EXTRA_PX: u32 = 5;

/// The y range that fits `y0..=y1` (the data's lowest and highest values): from 0 when the
/// lowest value is below the spread (or negative: from below it), else a band around the data;
/// 8% of headroom either side.
fn fit_y(y0: f64, y1: f64) -> (f64, f64) {
    if y1 <= y0 {
        return if y0 == 0.0 {
            (0.0, 1.0)
        } else {
            let pad = y0.abs() * 0.08;
            (y0 - pad, y1 + pad)
        };
    }
    let pad = (y1 - y0) * 0.08;
    if y0 < 0.0 {
        (y0 - pad, y1 + pad)
    } else if y0 <= y1 - y0 {
        (0.0, y1 + pad)
    } else {
        (y0 - pad, y1 + pad)
    }
}

/// Draws `shape` of `color` at every point of `pts`.
fn draw_marks<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    pts: &[(f64, f64)],
    shape: Shape,
    color: RGBColor,
    grow: u32,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let style = color.filled();
    let line = color.stroke_width(2 + grow / 2);
    let it = pts.iter().copied();
    let g = grow as i32;
    match shape {
        Shape::Circle => chart.draw_series(it.map(|p| Circle::new(p, 5 + grow, style)))?,
        Shape::Triangle => {
            chart.draw_series(it.map(|p| TriangleMarker::new(p, 6 + grow, style)))?
        }
        Shape::Square => chart.draw_series(it.map(|p| {
            EmptyElement::at(p) + Rectangle::new([(-4 - g, -4 - g), (4 + g, 4 + g)], style)
        }))?,
        Shape::Cross => chart.draw_series(it.map(|p| Cross::new(p, 5 + grow, line)))?,
        Shape::Diamond => chart.draw_series(it.map(|p| {
            let r = 6 + g;
            EmptyElement::at(p) + Polygon::new(vec![(0, -r), (r, 0), (0, r), (-r, 0)], style)
        }))?,
    };
    Ok(())
}

/// The outline of `shape`'s legend mark around (0, 0), in pixels (a polygon for every shape, so
/// the legend entries are of one type).
fn legend_outline(shape: Shape) -> Vec<(i32, i32)> {
    match shape {
        Shape::Circle => vec![
            (5, 0),
            (4, 4),
            (0, 5),
            (-4, 4),
            (-5, 0),
            (-4, -4),
            (0, -5),
            (4, -4),
        ],
        Shape::Triangle => vec![(0, -6), (6, 4), (-6, 4)],
        Shape::Square => vec![(-4, -4), (4, -4), (4, 4), (-4, 4)],
        Shape::Cross => vec![
            (-5, -4),
            (-4, -5),
            (0, -1),
            (4, -5),
            (5, -4),
            (1, 0),
            (5, 4),
            (4, 5),
            (0, 1),
            (-4, 5),
            (-5, 4),
            (-1, 0),
        ],
        Shape::Diamond => vec![(0, -6), (6, 0), (0, 6), (-6, 0)],
    }
}

/// Draws `series` as a PNG line chart at `path` (1200×700 px, y fitted as [`ChartSpec::y_range`]
/// says). Used by `tierkit kv`.
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
    let (mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in points {
        if x.is_finite() && y.is_finite() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if !x0.is_finite() || !y0.is_finite() {
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
    let (ylo, yhi) = spec.y_range.unwrap_or_else(|| fit_y(y0, y1));
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
    let n = spec.series.len();
    let covered = covered_by(&spec.series);
    for (i, (name, pts)) in spec.series.iter().enumerate() {
        let (color, shape, width) = style_of(i, n);
        // A series hidden under a later identical one: a band wider than the line on top, large
        // marks, and a legend entry naming the series on top.
        let (grow, label) = match covered[i] {
            Some((j, copies)) => (
                COVERED_EXTRA_PX * copies,
                format!("{name} (= {})", spec.series[j].0),
            ),
            None => (0, name.clone()),
        };
        let pts: Vec<(f64, f64)> = pts
            .iter()
            .copied()
            .filter(|&(x, y)| x.is_finite() && y.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(
                pts.iter().copied(),
                color.stroke_width(width + grow),
            ))?
            .label(label)
            .legend(move |(x, y)| {
                let mark = legend_outline(shape)
                    .into_iter()
                    .map(|(dx, dy)| (dx + 14, dy));
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (28, 0)], color.stroke_width(width))
                    + Polygon::new(mark.collect::<Vec<_>>(), color.filled())
            });
        // A series of few points (a benchmark's loads) shows each measured point: the lines
        // between them are not measurements. A long one shows a few, shifted per series.
        let marks: Vec<(f64, f64)> = marked(pts.len(), i, n)
            .into_iter()
            .map(|k| pts[k])
            .collect();
        draw_marks(&mut chart, &marks, shape, color, grow)?;
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
    fn y_axis_fits_the_data() {
        // 150-210 ms: a band around the data, not from 0
        let (lo, hi) = fit_y(150.0, 210.0);
        assert!(
            lo > 140.0 && lo < 150.0 && hi > 210.0 && hi < 220.0,
            "{lo}..{hi}"
        );
        // shares from 0.1 to 0.6 reach down near 0: from 0
        assert_eq!(fit_y(0.1, 0.6).0, 0.0);
        // negative values are shown; a flat series gets a band
        assert!(fit_y(-3.0, -1.0).0 < -3.0);
        let (lo, hi) = fit_y(5.0, 5.0);
        assert!(lo < 5.0 && hi > 5.0);
        assert_eq!(fit_y(0.0, 0.0), (0.0, 1.0));
    }

    #[test]
    fn series_get_distinct_styles_and_shifted_marks() {
        let n = 10;
        let styles: Vec<_> = (0..n).map(|i| style_of(i, n)).collect();
        for i in 0..n {
            for j in i + 1..n {
                assert!(styles[i].0 != styles[j].0, "colours {i} and {j}");
            }
        }
        // earlier series are at least as wide, so a later one drawn on top leaves edges
        assert!(styles.windows(2).all(|w| w[0].2 >= w[1].2) && styles[0].2 > styles[n - 1].2);
        // yellow (the weakest on white) is the last colour
        assert_eq!(PALETTE[9], RGBColor(240, 228, 66));
        assert_eq!((styles[0].2, styles[n - 1].2), (4, 2));
        // short series: every point; long ones: ~12 marks, shifted per series
        assert_eq!(marked(5, 3, 6), vec![0, 1, 2, 3, 4]);
        let (a, b) = (marked(585, 0, 2), marked(585, 1, 2));
        assert!(a.len() >= 10 && a.len() <= 13 && b.len() >= 10, "{a:?}");
        assert!(a.iter().all(|k| !b.contains(k)), "{a:?} {b:?}");
        assert!(b.iter().all(|&k| k < 585));
    }

    #[test]
    fn identical_series_are_found_under_the_last_copy() {
        let a: Vec<(f64, f64)> = vec![(0.0, 1.0), (1.0, 2.0)];
        let b: Vec<(f64, f64)> = vec![(0.0, 1.0), (1.0, 3.0)];
        let s: Vec<Series> = vec![
            ("fixed".into(), a.clone()),
            ("other".into(), b),
            ("elastic".into(), a.clone()),
            ("again".into(), a),
        ];
        assert_eq!(covered_by(&s), vec![Some((2, 2)), None, Some((3, 1)), None]);
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
