//! An SVG timeline of one run: one lane per candidate, its tenures (proved span dark, possible
//! span light), the faults shaded, dual leaders marked in red.
//!
//! Why: a table says that something went wrong; a person needs to see when and around which
//! fault. Plain SVG text keeps the harness free of a plotting dependency.

use std::fmt::Write;

use crate::checker::{Tenure, Verdict};
use crate::history::FaultSpan;

const LANE: f64 = 28.0;
const LEFT: f64 = 110.0;
const WIDTH: f64 = 1200.0;
const TOP: f64 = 30.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Draws the run. `title` goes on top; times are shown relative to the earliest event.
pub fn svg(title: &str, candidates: &[String], tenures: &[Tenure], faults: &[FaultSpan], verdict: &Verdict) -> String {
    let times = tenures
        .iter()
        .flat_map(|t| [t.possible_start, t.possible_end])
        .chain(faults.iter().flat_map(|f| [f.start, f.end]))
        .filter(|t| t.is_finite());
    let (start, end) = times.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let (start, end) = if start < end { (start, end) } else { (0.0, 1.0) };
    let scale = (WIDTH - LEFT - 20.0) / (end - start);
    let x = |t: f64| LEFT + (t.clamp(start, end) - start) * scale;
    let height = TOP + LANE * candidates.len() as f64 + 40.0;
    let lane_of = |name: &str| candidates.iter().position(|c| c == name).unwrap_or(0) as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(out, r#"<text x="10" y="18" font-size="14">{}</text>"#, escape(title));
    for fault in faults {
        let width = (x(fault.end) - x(fault.start)).max(2.0);
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{TOP}" width="{width:.1}" height="{:.1}" fill="#999" opacity="0.3"><title>{} on {}</title></rect>"##,
            x(fault.start),
            LANE * candidates.len() as f64,
            escape(&fault.kind),
            escape(&fault.target)
        );
    }
    for (i, name) in candidates.iter().enumerate() {
        let y = TOP + LANE * i as f64;
        let _ = writeln!(out, r#"<text x="10" y="{:.1}">{}</text>"#, y + LANE * 0.6, escape(name));
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            WIDTH - 20.0,
            y + LANE,
            y + LANE
        );
    }
    for tenure in tenures {
        let y = TOP + LANE * lane_of(&tenure.candidate) + 4.0;
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#9ecae1"><title>{} term {} possibly</title></rect>"##,
            x(tenure.possible_start),
            (x(tenure.possible_end) - x(tenure.possible_start)).max(1.0),
            LANE - 8.0,
            escape(&tenure.candidate),
            tenure.term
        );
        let (from, to) = tenure.certain_span().unwrap_or((tenure.first_seen(), tenure.first_seen()));
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#08519c"><title>{} term {} proved</title></rect>"##,
            x(from),
            y + 4.0,
            (x(to) - x(from)).max(1.0),
            LANE - 16.0,
            escape(&tenure.candidate),
            tenure.term
        );
    }
    for overlap in &verdict.dual_leaders {
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="red" opacity="0.6"><title>dual leader {} and {}</title></rect>"##,
            x(overlap.at),
            (overlap.seconds * scale).max(2.0),
            LANE * candidates.len() as f64,
            escape(&overlap.first.0),
            escape(&overlap.second.0)
        );
    }
    let axis = TOP + LANE * candidates.len() as f64 + 16.0;
    let step = nice_step(end - start);
    let mut tick = 0.0;
    while tick <= end - start && tick / step < 1000.0 {
        let _ =
            writeln!(out, r#"<text x="{:.1}" y="{axis:.1}" text-anchor="middle">{tick:.0}s</text>"#, x(start + tick));
        tick += step;
    }
    let _ = writeln!(
        out,
        r##"<text x="10" y="{:.1}" fill="#555">dark: proved belief; light: possible belief; grey: fault; red: dual leader</text>"##,
        axis + 18.0
    );
    out.push_str("</svg>\n");
    out
}

/// A tick step of 1, 2 or 5 times a power of ten giving about ten ticks.
fn nice_step(span: f64) -> f64 {
    let raw = (span / 10.0).max(1e-3);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|s| *s >= raw).unwrap_or(10.0 * power)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_has_a_lane_per_candidate_and_shows_faults_and_tenures() {
        let tenures = vec![Tenure {
            candidate: "c<1>".into(),
            election: "e".into(),
            term: 3,
            windows: vec![(1.0, 1.01), (2.0, 2.01)],
            possible_start: 0.9,
            possible_end: 2.5,
        }];
        let faults = vec![FaultSpan {
            kind: "sigstop".into(),
            target: "c<1>".into(),
            start: 2.2,
            end: 4.0,
            takeover_expected: true,
        }];
        let candidates = vec!["c<1>".to_owned(), "c2".to_owned()];
        let svg = svg("file & sigstop", &candidates, &tenures, &faults, &Verdict::default());
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("c&lt;1&gt; term 3 proved") && svg.contains("sigstop on c&lt;1&gt;"));
        assert!(svg.contains("file &amp; sigstop"));
        assert_eq!(nice_step(95.0), 10.0);
    }
}
