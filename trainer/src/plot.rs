//! Loss curves as a self-contained SVG file (no plotting dependency).
//!
//! ```
//! let series = vec![("rank 0".to_string(), vec![(0.0, 2.3), (10.0, 1.1), (20.0, 0.6)])];
//! let svg = localsgd_trainer::plot::loss_svg(&series, "training loss");
//! assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Width of the SVG viewBox.
pub const WIDTH: f64 = 800.0;
/// Height of the SVG viewBox.
pub const HEIGHT: f64 = 500.0;

const LEFT: f64 = 70.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// A plot file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write plot {path}: {source}")]
pub struct PlotError {
    /// The file.
    pub path: PathBuf,
    /// The underlying I/O error.
    #[source]
    pub source: std::io::Error,
}

/// Writes [`loss_svg`] of `series` to `path`.
pub fn write_loss_svg(
    path: &Path,
    series: &[(String, Vec<(f64, f64)>)],
    title: &str,
) -> Result<(), PlotError> {
    localsgd_pipeline::atomic::write_atomic(path, loss_svg(series, title)).map_err(|source| {
        PlotError {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// An SVG document plotting each `(name, [(step, loss), ...])` series as one polyline, with
/// ticked axes, a title and a legend.
///
/// Points whose step or loss is not finite are skipped; a series with no finite point gets a
/// legend entry marked "no data" and no polyline. Without any finite point the axes span `[0, 1]`.
pub fn loss_svg(series: &[(String, Vec<(f64, f64)>)], title: &str) -> String {
    let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
    let points = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().filter(|p| finite(p)));
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for &(x, y) in points {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    let ((x_ticks, x_dec), (y_ticks, y_dec)) = (nice_ticks(x0, x1), nice_ticks(y0, y1));
    let (x_lo, x_hi) = (x_ticks[0], x_ticks[x_ticks.len() - 1]);
    let (y_lo, y_hi) = (y_ticks[0], y_ticks[y_ticks.len() - 1]);
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let sx = |x: f64| LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w;
    let sy = |y: f64| TOP + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h;

    let mut svg = String::new();
    // Writing to a String cannot fail, so the fmt::Results below are ignored.
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="16">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    for &t in &x_ticks {
        let x = sx(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.2}" y1="{TOP}" x2="{x:.2}" y2="{:.2}" stroke="#e0e0e0"/><text x="{x:.2}" y="{:.2}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0,
            fmt_tick(t, x_dec)
        );
    }
    for &t in &y_ticks {
        let y = sy(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.2}" x2="{:.2}" y2="{y:.2}" stroke="#e0e0e0"/><text x="{:.2}" y="{:.2}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(t, y_dec)
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.2}" y="{:.2}" text-anchor="middle">step</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 10.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="16" y="{:.2}" text-anchor="middle" transform="rotate(-90 16 {:.2})">loss</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let coords: Vec<String> = pts
            .iter()
            .filter(|p| finite(p))
            .map(|&(x, y)| format!("{:.2},{:.2}", sx(x), sy(y)))
            .collect();
        if !coords.is_empty() {
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
                coords.join(" ")
            );
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = WIDTH - RIGHT + 15.0;
        let label = if coords.is_empty() {
            format!("{} (no data)", escape(name))
        } else {
            escape(name)
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{label}</text>"#,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Round tick values covering `[lo, hi]` (steps of 1, 2 or 5 times a power of ten), at least
/// two of them, and the number of decimals that shows the step. An empty or degenerate range is
/// widened first; a range too wide for f64 arithmetic gets just its two ends.
fn nice_ticks(lo: f64, hi: f64) -> (Vec<f64>, usize) {
    let (lo, hi) = if !(lo.is_finite() && hi.is_finite()) {
        (0.0, 1.0)
    } else if hi - lo <= f64::EPSILON * lo.abs().max(1.0) {
        let pad = (lo.abs() * 0.1).max(0.5);
        (lo - pad, hi + pad)
    } else {
        (lo, hi)
    };
    let raw = (hi - lo) / 5.0;
    if !raw.is_finite() {
        return (vec![lo, hi], 0);
    }
    let exponent = raw.log10().floor();
    let magnitude = 10f64.powf(exponent);
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * magnitude);
    let first = (lo / step).floor();
    let last = (hi / step).ceil();
    let ticks = (0..=((last - first) as usize))
        .map(|k| (first + k as f64) * step)
        .collect();
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    (ticks, decimals)
}

/// A tick label with `decimals` decimals (scientific notation for very large or small values).
fn fmt_tick(v: f64, decimals: usize) -> String {
    if v != 0.0 && (v.abs() >= 1e7 || decimals > 6) {
        format!("{v:.2e}")
    } else {
        format!("{v:.decimals$}")
    }
}

/// `text` with XML's special characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
