//! An SVG chart of comparisons: for each trace and disk, one bar per
//! policy and one for the bound, of the bytes pulled again. Each group has
//! its own scale (workloads differ by orders of magnitude); the figure is
//! written beside each bar.

use std::fmt::Write;

use super::compare::Comparison;

const WIDTH: f64 = 760.0;
const LABEL: f64 = 210.0;
const BAR: f64 = 16.0;
const GAP: f64 = 4.0;
const GROUP_GAP: f64 = 26.0;
const COLORS: [&str; 5] = ["#1f77b4", "#6baed6", "#d62728", "#2ca02c", "#7f7f7f"];

/// The chart of `groups`: `(title, comparison)` pairs, in order.
pub fn svg(groups: &[(String, &Comparison)]) -> String {
    let rows: usize = groups.iter().map(|(_, c)| c.policies.len() + 1).sum();
    let height = 40.0 + groups.len() as f64 * (GROUP_GAP + 18.0) + rows as f64 * (BAR + GAP);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<text x="8" y="20" font-size="14">Bytes pulled again (GB), per workload and disk</text>"#
    );
    let mut y = 40.0;
    for (title, comparison) in groups {
        let _ = writeln!(
            out,
            r#"<text x="8" y="{:.0}" font-weight="bold">{}</text>"#,
            y + 12.0,
            escape(title)
        );
        y += 18.0;
        let mut bars: Vec<(&str, u64)> = comparison
            .policies
            .iter()
            .map(|t| (t.policy.as_str(), t.repulled_bytes))
            .collect();
        bars.push(("bound", comparison.bound.repulled_bytes));
        let largest = bars.iter().map(|b| b.1).max().unwrap_or(0).max(1) as f64;
        for (n, (name, bytes)) in bars.iter().enumerate() {
            let length = (WIDTH - LABEL - 90.0) * (*bytes as f64 / largest);
            let color = COLORS[n.min(COLORS.len() - 1)];
            let _ = writeln!(
                out,
                r#"<text x="{:.0}" y="{:.0}" text-anchor="end">{}</text><rect x="{LABEL}" y="{y:.0}" width="{length:.1}" height="{BAR}" fill="{color}"/><text x="{:.1}" y="{:.0}">{:.2}</text>"#,
                LABEL - 6.0,
                y + BAR - 4.0,
                escape(name),
                LABEL + length + 4.0,
                y + BAR - 4.0,
                *bytes as f64 / 1e9,
            );
            y += BAR + GAP;
        }
        y += GROUP_GAP;
    }
    out.push_str("</svg>\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
