//! A hand-written SVG line chart (no plotting dependency): `htpkv budget --plot` draws its curves
//! with it.

use std::fmt::Write as _;

/// One line of the chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub color: String,
    /// `stroke-dasharray`, e.g. `"6 4"`.
    pub dash: Option<String>,
    /// Stroke width (wider lines drawn first stay visible under narrower ones that coincide).
    pub width: f64,
    /// (x, y) points; `None` breaks the line (no value there).
    pub points: Vec<(f64, Option<f64>)>,
}

/// A vertical marker line with a label (e.g. the configured context).
#[derive(Debug, Clone)]
pub struct Marker {
    pub x: f64,
    pub label: String,
}

/// One legend entry: a bold heading or a line sample with its label.
#[derive(Debug, Clone)]
pub enum LegendItem {
    Heading(String),
    Line {
        label: String,
        color: String,
        dash: Option<String>,
        width: f64,
    },
}

impl LegendItem {
    /// The legend entry of a series.
    pub fn of(series: &Series) -> LegendItem {
        LegendItem::Line {
            label: series.label.clone(),
            color: series.color.clone(),
            dash: series.dash.clone(),
            width: series.width,
        }
    }
}

/// Chart text and geometry.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    /// The y values are bytes; the axis picks a binary unit.
    pub series: Vec<Series>,
    pub markers: Vec<Marker>,
    pub legend: Vec<LegendItem>,
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 560.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 270.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 70.0;

/// A "nice" tick step (1, 2 or 5 x 10^k) giving about `target` ticks over `range`.
fn nice_step(range: f64, target: f64) -> f64 {
    if range <= 0.0 || !range.is_finite() {
        return 1.0;
    }
    let raw = range / target;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Formats a tick value without trailing zeros.
fn tick_label(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

impl Chart {
    /// Renders the chart as a standalone SVG document.
    pub fn render(&self) -> String {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
        for x in xs.chain(self.markers.iter().map(|m| m.x)) {
            x_min = x_min.min(x);
            x_max = x_max.max(x);
        }
        if !x_min.is_finite() {
            (x_min, x_max) = (0.0, 1.0);
        }
        x_min = x_min.min(0.0);
        let y_max_bytes = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|p| p.1))
            .fold(0.0f64, f64::max);
        let (unit, unit_name) = [
            (1024f64.powi(4), "TiB"),
            (1024f64.powi(3), "GiB"),
            (1024f64.powi(2), "MiB"),
            (1024.0, "KiB"),
        ]
        .into_iter()
        .find(|(u, _)| y_max_bytes >= *u)
        .unwrap_or((1.0, "B"));
        let y_top = (y_max_bytes / unit).max(1e-9);
        let y_step = nice_step(y_top, 6.0);
        let y_max = (y_top / y_step).ceil() * y_step;
        let x_step = nice_step(x_max - x_min, 8.0);
        let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
        let px = |x: f64| LEFT + (x - x_min) / (x_max - x_min).max(1e-9) * pw;
        let py = |y: f64| TOP + ph - y / unit / y_max * ph;

        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">
<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>
<text x="{}" y="32" text-anchor="middle" font-size="18" font-weight="bold">{}</text>"#,
            LEFT + pw / 2.0,
            escape(&self.title)
        );
        // Grid and ticks.
        let mut y = 0.0;
        while y <= y_max + y_step / 2.0 {
            let yy = TOP + ph - y / y_max * ph;
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e0e0e0"/><line x1="{}" y1="{yy:.1}" x2="{LEFT}" y2="{yy:.1}" stroke="black"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 5.0,
                LEFT - 8.0,
                yy + 4.0,
                tick_label(y)
            );
            y += y_step;
        }
        let mut x = (x_min / x_step).ceil() * x_step;
        while x <= x_max * (1.0 + 1e-9) {
            let xx = px(x);
            let _ = writeln!(
                svg,
                r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#e0e0e0"/><line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="black"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph,
                TOP + ph + 5.0,
                TOP + ph + 20.0,
                tick_label(x)
            );
            x += x_step;
        }
        // Axes and their labels.
        let _ = writeln!(
            svg,
            r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="black"/><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>
<text x="22" y="{:.1}" text-anchor="middle" transform="rotate(-90 22 {:.1})">KV region ({unit_name})</text>"#,
            TOP + ph,
            TOP + ph,
            LEFT + pw,
            TOP + ph,
            LEFT + pw / 2.0,
            HEIGHT - 22.0,
            escape(&self.x_label),
            TOP + ph / 2.0,
            TOP + ph / 2.0,
        );
        // Markers.
        for (i, m) in self.markers.iter().enumerate() {
            let xx = px(m.x);
            let label_y = TOP + 14.0 + 15.0 * i as f64;
            let _ = writeln!(
                svg,
                r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#888888" stroke-dasharray="3 3"/><text x="{:.1}" y="{:.1}" fill="#555555" font-size="12">{}</text>"##,
                TOP + ph,
                xx + 4.0,
                label_y,
                escape(&m.label)
            );
        }
        // Lines.
        for s in &self.series {
            let mut path = String::new();
            let mut pen_down = false;
            for &(x, y) in &s.points {
                match y {
                    Some(y) => {
                        let _ = write!(
                            path,
                            "{}{:.1},{:.1} ",
                            if pen_down { "L" } else { "M" },
                            px(x),
                            py(y)
                        );
                        pen_down = true;
                    }
                    None => pen_down = false,
                }
            }
            if path.is_empty() {
                continue;
            }
            let dash = s
                .dash
                .as_ref()
                .map(|d| format!(r#" stroke-dasharray="{d}""#))
                .unwrap_or_default();
            let _ = writeln!(
                svg,
                r#"<path d="{}" fill="none" stroke="{}" stroke-width="{}" stroke-opacity="0.9"{dash}/>"#,
                path.trim_end(),
                s.color,
                s.width
            );
        }
        // Legend.
        let lx = LEFT + pw + 20.0;
        for (i, item) in self.legend.iter().enumerate() {
            let ly = TOP + 4.0 + 22.0 * i as f64;
            match item {
                LegendItem::Heading(text) => {
                    let _ = writeln!(
                        svg,
                        r#"<text x="{lx}" y="{ly:.1}" font-weight="bold">{}</text>"#,
                        escape(text)
                    );
                }
                LegendItem::Line {
                    label,
                    color,
                    dash,
                    width,
                } => {
                    let dash = dash
                        .as_ref()
                        .map(|d| format!(r#" stroke-dasharray="{d}""#))
                        .unwrap_or_default();
                    let _ = writeln!(
                        svg,
                        r#"<line x1="{lx}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="{color}" stroke-width="{}"{dash}/><text x="{}" y="{ly:.1}">{}</text>"#,
                        ly - 4.0,
                        lx + 34.0,
                        ly - 4.0,
                        width.min(4.0),
                        lx + 42.0,
                        escape(label)
                    );
                }
            }
        }
        svg.push_str("</svg>\n");
        svg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(4000.0, 8.0), 500.0);
        assert_eq!(nice_step(4096.0, 8.0), 1000.0);
        assert_eq!(nice_step(0.7, 6.0), 0.2);
    }

    #[test]
    fn renders_lines_legend_and_breaks() {
        let chart = Chart {
            title: "a <title>".into(),
            x_label: "context".into(),
            series: vec![Series {
                label: "one".into(),
                color: "#123456".into(),
                dash: Some("6 4".into()),
                width: 2.0,
                points: vec![
                    (1.0, Some(2048.0)),
                    (2.0, Some(4096.0)),
                    (3.0, None),
                    (4.0, Some(8192.0)),
                ],
            }],
            markers: vec![Marker {
                x: 2.0,
                label: "S = 2".into(),
            }],
            legend: vec![LegendItem::Heading("strategy".into())],
        };
        let chart = Chart {
            legend: vec![
                LegendItem::Heading("strategy".into()),
                LegendItem::of(&chart.series[0]),
            ],
            ..chart
        };
        let svg = chart.render();
        assert!(svg.starts_with("<?xml") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;title&gt;"));
        assert!(svg.contains("KV region (KiB)"));
        // Two subpaths: the None point breaks the line.
        let d = svg.split("<path d=\"").nth(1).unwrap();
        assert_eq!(d.split('"').next().unwrap().matches('M').count(), 2);
        assert!(svg.contains(">one</text>"));
    }
}
