//! A hand-written SVG of a run: CDFs of TTFT, TPOT and end-to-end latency, and output
//! throughput over time.

use std::fmt::Write as _;

use super::report::Report;

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 720.0;
/// Most points drawn per CDF.
const MAX_POINTS: usize = 1000;
/// Bins of the throughput curve.
const BINS: usize = 60;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// A plot area in SVG coordinates with data ranges.
struct Panel {
    left: f64,
    top: f64,
    width: f64,
    height: f64,
    x_max: f64,
    y_max: f64,
}

impl Panel {
    fn px(&self, x: f64) -> f64 {
        self.left + (x / self.x_max).clamp(0.0, 1.0) * self.width
    }
    fn py(&self, y: f64) -> f64 {
        self.top + self.height - (y / self.y_max).clamp(0.0, 1.0) * self.height
    }
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) for about `ticks` ticks up to `max`.
fn tick_step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    mag * if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 || (v.abs() >= 0.1 && v.fract().abs() < 1e-9) || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{}", (v * 1e6).round() / 1e6)
    }
}

/// Draws a panel's frame, ticks, labels and title; returns the panel for plotting.
fn frame(
    svg: &mut String,
    slot: (f64, f64),
    title: &str,
    x_label: &str,
    y_label: &str,
    x_max: f64,
    y_max: f64,
) -> Panel {
    let x_step = tick_step(x_max, 5.0);
    let y_step = tick_step(y_max, 5.0);
    let p = Panel {
        left: slot.0 + 70.0,
        top: slot.1 + 40.0,
        width: WIDTH / 2.0 - 100.0,
        height: HEIGHT / 2.0 - 100.0,
        x_max: (x_max / x_step).ceil().max(1.0) * x_step,
        y_max: (y_max / y_step).ceil().max(1.0) * y_step,
    };
    let (l, t, w, h) = (p.left, p.top, p.width, p.height);
    let _ = writeln!(
        svg,
        r##"<rect x="{l}" y="{t}" width="{w}" height="{h}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
        l + w / 2.0,
        t - 14.0,
        escape(title)
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        l + w / 2.0,
        t + h + 38.0,
        escape(x_label)
    );
    let (yx, yy) = (l - 52.0, t + h / 2.0);
    let _ = writeln!(
        svg,
        r#"<text x="{yx}" y="{yy}" text-anchor="middle" transform="rotate(-90 {yx} {yy})">{}</text>"#,
        escape(y_label)
    );
    let mut x = 0.0;
    while x <= p.x_max + x_step * 1e-6 {
        let sx = p.px(x);
        let _ = writeln!(
            svg,
            r##"<line x1="{sx}" y1="{t}" x2="{sx}" y2="{}" stroke="#ddd"/>"##,
            t + h
        );
        let _ = writeln!(
            svg,
            r#"<text x="{sx}" y="{}" text-anchor="middle" font-size="11">{}</text>"#,
            t + h + 16.0,
            fmt_tick(x)
        );
        x += x_step;
    }
    let mut y = 0.0;
    while y <= p.y_max + y_step * 1e-6 {
        let sy = p.py(y);
        let _ = writeln!(
            svg,
            r##"<line x1="{l}" y1="{sy}" x2="{}" y2="{sy}" stroke="#ddd"/>"##,
            l + w
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end" font-size="11">{}</text>"#,
            l - 6.0,
            sy + 4.0,
            fmt_tick(y)
        );
        y += y_step;
    }
    p
}

fn polyline(svg: &mut String, p: &Panel, points: &[(f64, f64)], color: &str) {
    if points.is_empty() {
        return;
    }
    let mut d = String::new();
    for &(x, y) in points {
        let _ = write!(d, "{:.2},{:.2} ", p.px(x), p.py(y));
    }
    let _ = writeln!(
        svg,
        r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.8"/>"#,
        d.trim_end()
    );
}

/// Step points of the empirical CDF of `values`, thinned to at most `MAX_POINTS`.
pub fn cdf_points(values: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let stride = n.div_ceil(MAX_POINTS).max(1);
    let mut out = Vec::with_capacity(2 * n / stride + 2);
    let mut prev = 0.0;
    for (i, x) in v.iter().enumerate() {
        if i % stride == 0 || i + 1 == n {
            out.push((*x, prev));
            prev = (i + 1) as f64 / n as f64;
            out.push((*x, prev));
        }
    }
    out
}

/// Output tokens per second in `BINS` equal bins over the run, from chunk arrival times
/// (each chunk carries an equal share of its request's output tokens).
pub fn throughput_points(report: &Report) -> Vec<(f64, f64)> {
    let dur_s = report.summary.duration_s.max(1e-3);
    let bin_s = dur_s / BINS as f64;
    let mut bins = vec![0.0f64; BINS];
    for r in report.requests.iter().filter(|r| r.ok()) {
        let times = r.chunk_times_ms();
        let share = r.output_tokens as f64 / times.len().max(1) as f64;
        for t in times {
            let b = ((t / 1e3 / bin_s) as usize).min(BINS - 1);
            bins[b] += share;
        }
    }
    let mut out = Vec::with_capacity(2 * BINS);
    for (i, tokens) in bins.iter().enumerate() {
        let rate = tokens / bin_s;
        out.push((i as f64 * bin_s, rate));
        out.push(((i + 1) as f64 * bin_s, rate));
    }
    out
}

/// The SVG document of `report`.
pub fn svg(report: &Report) -> String {
    let ok: Vec<_> = report.requests.iter().filter(|r| r.ok()).collect();
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="15">{}</text>"#,
        WIDTH / 2.0,
        escape(&format!("kiln bench: {}", report.run.label))
    );
    let series: [(&str, Vec<f64>); 3] = [
        ("TTFT", ok.iter().filter_map(|r| r.ttft_ms).collect()),
        ("TPOT", ok.iter().filter_map(|r| r.tpot_ms).collect()),
        ("End-to-end latency", ok.iter().map(|r| r.e2e_ms).collect()),
    ];
    let slots = [
        (0.0, 20.0),
        (WIDTH / 2.0, 20.0),
        (0.0, HEIGHT / 2.0 + 10.0),
        (WIDTH / 2.0, HEIGHT / 2.0 + 10.0),
    ];
    for (i, (name, values)) in series.iter().enumerate() {
        let x_max = values.iter().copied().fold(0.0, f64::max).max(1e-3);
        let p = frame(
            &mut svg,
            slots[i],
            &format!("{name} CDF (n = {})", values.len()),
            "ms",
            "fraction of requests",
            x_max,
            1.0,
        );
        polyline(&mut svg, &p, &cdf_points(values), COLORS[i]);
    }
    let tp = throughput_points(report);
    let y_max = tp.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3);
    let p = frame(
        &mut svg,
        slots[3],
        "Output throughput over time",
        "seconds since start",
        "tokens / s",
        report.summary.duration_s.max(1e-3),
        y_max,
    );
    polyline(&mut svg, &p, &tp, COLORS[3]);
    svg.push_str("</svg>\n");
    svg
}
