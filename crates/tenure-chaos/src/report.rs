//! The results table (backend x fault x mode), as text for people and JSON for tools.
//!
//! Why: the harness's evidence is only worth something if anyone can read it at a glance and
//! reproduce it; the table is what goes into the README, and the JSON is what CI and later
//! comparisons read.

use serde::Serialize;

use crate::checker::Verdict;

/// Failover percentiles in milliseconds (nearest rank).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// The percentiles of `seconds`, in milliseconds; `None` for no values.
    pub fn of_seconds(seconds: &[f64]) -> Option<Percentiles> {
        let mut sorted: Vec<f64> = seconds.iter().map(|s| s * 1000.0).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let rank = |p: f64| sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
        Some(Percentiles { p50: rank(0.50), p99: rank(0.99), max: sorted[sorted.len() - 1] })
    }
}

/// One line of the table: one backend, one fault, one mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// `file`, `apiserver`, `etcd`, `zookeeper`.
    pub backend: String,
    /// The fault injected each round.
    pub fault: String,
    /// `elect` (judged by `/status`) or `run` (judged by the commands' witness lines).
    pub mode: String,
    /// Faults injected.
    pub rounds: usize,
    /// Proved dual leaders.
    pub dual_leaders: usize,
    /// Terms that repeated or went back.
    pub term_regressions: usize,
    /// Commands alive at once.
    pub command_overlaps: usize,
    /// Whether commands alive at once are a documented limitation for this fault (a frozen
    /// `tenure run` thawed after the new leader started) rather than a violation.
    pub overlap_is_limitation: bool,
    /// The longest such overlap, in milliseconds.
    pub longest_command_overlap_ms: f64,
    /// Overlaps only the measurement error allows.
    pub possible_overlaps: usize,
    /// Faults that required a takeover that did not come.
    pub without_takeover: usize,
    /// Witness writes the term (fencing token) refused.
    pub fenced_writes: usize,
    /// Failover times.
    pub failover_ms: Option<Percentiles>,
    /// A control run that must show violations (clock far outside the drift bound, a broken
    /// configuration): it passes when the checker finds them.
    pub control: bool,
}

impl Row {
    /// Builds the row of one scenario from the checker's verdict.
    pub fn from_verdict(
        backend: &str,
        fault: &str,
        mode: &str,
        verdict: &Verdict,
        control: bool,
        limitation: bool,
    ) -> Row {
        Row {
            backend: backend.to_owned(),
            fault: fault.to_owned(),
            mode: mode.to_owned(),
            rounds: verdict.rounds.len(),
            dual_leaders: verdict.dual_leaders.len(),
            term_regressions: verdict.term_regressions.len(),
            command_overlaps: verdict.command_overlaps.len(),
            overlap_is_limitation: limitation,
            longest_command_overlap_ms: verdict.command_overlaps.iter().map(|o| o.seconds * 1000.0).fold(0.0, f64::max),
            possible_overlaps: verdict.possible_overlaps.len(),
            without_takeover: verdict.rounds_without_takeover(),
            fenced_writes: verdict.fenced_writes,
            failover_ms: Percentiles::of_seconds(&verdict.failovers()),
            control,
        }
    }

    /// Violations of safety: dual leaders, term regressions, and commands alive at once unless
    /// that is the documented limitation of this fault.
    pub fn violations(&self) -> usize {
        let commands = if self.overlap_is_limitation { 0 } else { self.command_overlaps };
        self.dual_leaders + self.term_regressions + commands
    }

    /// Whether the row is as it must be: no violation and no stuck round, or, for a control, at
    /// least one violation found.
    pub fn passed(&self) -> bool {
        if self.control {
            self.violations() > 0
        } else {
            self.violations() == 0 && self.without_takeover == 0
        }
    }
}

fn millis(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

/// The table as aligned text.
pub fn text_table(rows: &[Row]) -> String {
    let header = [
        "backend",
        "fault",
        "mode",
        "rounds",
        "violations",
        "no-takeover",
        "possible",
        "cmd-overlap",
        "fenced",
        "p50 ms",
        "p99 ms",
        "max ms",
        "verdict",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let overlap = if row.command_overlaps == 0 {
                "0".to_owned()
            } else {
                let note = if row.overlap_is_limitation { " (limitation)" } else { "" };
                format!("{} max {:.0}ms{note}", row.command_overlaps, row.longest_command_overlap_ms)
            };
            let verdict = match (row.passed(), row.control) {
                (true, false) => "ok",
                (true, true) => "ok (control: violations found)",
                (false, false) => "FAIL",
                (false, true) => "FAIL (control: no violation found)",
            };
            vec![
                row.backend.clone(),
                row.fault.clone(),
                row.mode.clone(),
                row.rounds.to_string(),
                row.violations().to_string(),
                row.without_takeover.to_string(),
                row.possible_overlaps.to_string(),
                overlap,
                row.fenced_writes.to_string(),
                millis(row.failover_ms.map(|p| p.p50)),
                millis(row.failover_ms.map(|p| p.p99)),
                millis(row.failover_ms.map(|p| p.max)),
                verdict.to_owned(),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| cells.iter().map(|c| c[i].len()).chain([header[i].len()]).max().unwrap_or(0))
        .collect();
    let line = |values: Vec<&str>| {
        values.iter().zip(&widths).map(|(v, w)| format!("{v:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_owned()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for row in &cells {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// The table as JSON, with the measurement settings that produced it.
pub fn json_table(rows: &[Row], settings: &serde_json::Value) -> String {
    let value = serde_json::json!({ "settings": settings, "rows": rows });
    serde_json::to_string_pretty(&value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::{Overlap, RoundOutcome};
    use crate::history::FaultSpan;

    fn verdict(failovers: &[Option<f64>], dual: usize) -> Verdict {
        let fault =
            FaultSpan { kind: "sigkill".into(), target: "a".into(), start: 0.0, end: 0.0, takeover_expected: true };
        let overlap = Overlap { first: ("a".into(), 1), second: ("b".into(), 2), at: 0.0, seconds: 0.1 };
        Verdict {
            dual_leaders: vec![overlap; dual],
            rounds: failovers.iter().map(|f| RoundOutcome { fault: fault.clone(), failover: *f }).collect(),
            ..Verdict::default()
        }
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<f64> = (1..=200).map(|ms| ms as f64 / 1000.0).collect();
        let p = Percentiles::of_seconds(&values).unwrap();
        assert_eq!((p.p50.round(), p.p99.round(), p.max.round()), (100.0, 198.0, 200.0));
        assert_eq!(Percentiles::of_seconds(&[]), None);
    }

    #[test]
    fn a_row_fails_on_a_violation_or_a_stuck_round_and_a_control_fails_without_one() {
        let clean = Row::from_verdict("file", "sigkill", "elect", &verdict(&[Some(1.0), Some(1.2)], 0), false, false);
        assert!(clean.passed());
        assert_eq!(clean.failover_ms.unwrap().max, 1200.0);
        assert!(!Row::from_verdict("file", "sigkill", "elect", &verdict(&[Some(1.0)], 1), false, false).passed());
        assert!(!Row::from_verdict("file", "sigkill", "elect", &verdict(&[None], 0), false, false).passed());
        assert!(Row::from_verdict("file", "clock x0.1", "elect", &verdict(&[Some(1.0)], 2), true, false).passed());
        assert!(!Row::from_verdict("file", "clock x0.1", "elect", &verdict(&[Some(1.0)], 0), true, false).passed());
    }

    #[test]
    fn the_text_table_names_failures() {
        let rows = vec![
            Row::from_verdict("file", "sigkill", "elect", &verdict(&[Some(1.0)], 0), false, false),
            Row::from_verdict("etcd", "sigstop", "elect", &verdict(&[Some(1.0)], 1), false, false),
        ];
        let table = text_table(&rows);
        assert!(table.lines().nth(1).unwrap().ends_with("ok"), "{table}");
        assert!(table.lines().nth(2).unwrap().ends_with("FAIL"), "{table}");
        let json: serde_json::Value =
            serde_json::from_str(&json_table(&rows, &serde_json::json!({"ttl": "1s"}))).unwrap();
        assert_eq!(json["rows"][1]["dual_leaders"], 1);
    }
}
