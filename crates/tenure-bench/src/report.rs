//! The output of a benchmark: a short table for people, then one line of JSON for the README.
//!
//! Why both: a person reading a terminal wants aligned numbers with the goal next to them and a
//! verdict; the README's numbers are pasted from the JSON line, which `tail -n 1` picks out.

use serde_json::{json, Map, Value};

use crate::stats::Summary;

/// One measured number, with its goal if the issue set one.
#[derive(Debug, Clone)]
struct Row {
    key: String,
    label: String,
    value: f64,
    unit: &'static str,
    /// The goal: the value must be at most this.
    at_most: Option<f64>,
}

impl Row {
    fn passes(&self) -> Option<bool> {
        self.at_most.map(|goal| self.value <= goal)
    }
}

/// The results of one benchmark, printed with [`Report::print`].
#[derive(Debug)]
pub struct Report {
    bench: String,
    rows: Vec<Row>,
    notes: Vec<String>,
    extra: Map<String, Value>,
}

impl Report {
    /// An empty report of the benchmark `bench` (its `--bench` name).
    pub fn new(bench: &str) -> Report {
        Report { bench: bench.to_owned(), rows: Vec::new(), notes: Vec::new(), extra: Map::new() }
    }

    /// A number without a goal. `key` names it in the JSON summary, `label` in the table.
    pub fn info(&mut self, key: &str, label: &str, value: f64, unit: &'static str) -> &mut Self {
        self.rows.push(Row { key: key.to_owned(), label: label.to_owned(), value, unit, at_most: None });
        self
    }

    /// A number that must be at most `at_most` (same unit).
    pub fn goal(&mut self, key: &str, label: &str, value: f64, unit: &'static str, at_most: f64) -> &mut Self {
        self.rows.push(Row { key: key.to_owned(), label: label.to_owned(), value, unit, at_most: Some(at_most) });
        self
    }

    /// The p50, p99 and max of a distribution as three rows, the goal (if any) applying to p99.
    pub fn distribution(
        &mut self, key: &str, label: &str, summary: &Summary, unit: &'static str, p99_at_most: Option<f64>,
    ) -> &mut Self {
        self.info(&format!("{key}_p50"), &format!("{label} p50"), summary.p50, unit);
        match p99_at_most {
            Some(goal) => self.goal(&format!("{key}_p99"), &format!("{label} p99"), summary.p99, unit, goal),
            None => self.info(&format!("{key}_p99"), &format!("{label} p99"), summary.p99, unit),
        };
        self.info(&format!("{key}_max"), &format!("{label} max"), summary.max, unit);
        self.extra(&format!("{key}_n"), json!(summary.count));
        self
    }

    /// A line of explanation printed under the table (method, caveats).
    pub fn note(&mut self, text: impl Into<String>) -> &mut Self {
        self.notes.push(text.into());
        self
    }

    /// A value that only goes into the JSON summary (settings, counts); its floating-point
    /// numbers are rounded to three decimals.
    pub fn extra(&mut self, key: &str, value: Value) -> &mut Self {
        self.extra.insert(key.to_owned(), rounded(value));
        self
    }

    /// True when every goal is met.
    pub fn passes(&self) -> bool {
        self.rows.iter().all(|r| r.passes() != Some(false))
    }

    /// The table and notes as text.
    pub fn table(&self) -> String {
        let label_width = self.rows.iter().map(|r| r.label.len()).max().unwrap_or(6).max(6);
        let mut out = format!("\n== {}\n", self.bench);
        out += &format!("{:<label_width$}  {:>12}  {:>12}  {:>8}  {}\n", "metric", "value", "goal", "ratio", "verdict");
        for row in &self.rows {
            let value = format!("{} {}", number(row.value), row.unit);
            let (goal, ratio, verdict) = match row.at_most {
                Some(goal) => {
                    let ratio = if goal > 0.0 { format!("{:.2}x", row.value / goal) } else { "-".to_owned() };
                    let verdict = if row.value <= goal { "PASS" } else { "MISS" };
                    (format!("<= {} {}", number(goal), row.unit), ratio, verdict)
                }
                None => (String::new(), String::new(), ""),
            };
            out += &format!("{:<label_width$}  {value:>12}  {goal:>12}  {ratio:>8}  {verdict}\n", row.label);
        }
        for note in &self.notes {
            out += &format!("  - {note}\n");
        }
        out
    }

    /// The one-line JSON summary: `{"bench", "pass", "results": {key: value}, "goals": {key:
    /// {"at_most", "pass"}}, ...extra}`.
    pub fn json(&self) -> Value {
        let mut results = Map::new();
        let mut goals = Map::new();
        for row in &self.rows {
            results.insert(row.key.clone(), json!(round(row.value)));
            if let (Some(at_most), Some(pass)) = (row.at_most, row.passes()) {
                goals.insert(row.key.clone(), json!({ "at_most": at_most, "unit": row.unit, "pass": pass }));
            }
        }
        let (bench, pass) = (json!(self.bench), json!(self.passes()));
        let fixed = [("bench", bench), ("pass", pass), ("results", results.into()), ("goals", goals.into())];
        let mut summary: Map<String, Value> = fixed.into_iter().map(|(key, value)| (key.to_owned(), value)).collect();
        summary.extend(self.extra.clone());
        Value::Object(summary)
    }

    /// Prints the table, then the JSON summary as the last line of standard output.
    pub fn print(&self) {
        print!("{}", self.table());
        println!("{}", self.json());
    }
}

/// A number with about four significant digits, without trailing noise.
fn number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1000.0 || magnitude == 0.0 {
        format!("{value:.0}")
    } else if magnitude >= 100.0 {
        format!("{value:.1}")
    } else if magnitude >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

/// Rounds to three decimals for the JSON summary.
fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// `value` with every floating-point number in it rounded to three decimals.
fn rounded(value: Value) -> Value {
    match value {
        Value::Number(n) if n.is_f64() => n.as_f64().map_or(Value::Number(n), |f| json!(round(f))),
        Value::Array(items) => Value::Array(items.into_iter().map(rounded).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, rounded(v))).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_decide_the_verdict() {
        let mut report = Report::new("x");
        report.goal("cpu", "CPU", 5.0, "%", 10.0).info("n", "count", 3.0, "");
        assert!(report.passes());
        assert!(report.table().contains("PASS"));
        report.goal("rss", "RSS", 120.0, "MiB", 100.0);
        assert!(!report.passes());
        let json = report.json();
        assert_eq!(json["pass"], json!(false));
        assert_eq!(json["goals"]["rss"]["pass"], json!(false));
        assert_eq!(json["results"]["cpu"], json!(5.0));
        assert!(report.table().contains("1.20x"));
    }

    #[test]
    fn distributions_put_the_goal_on_p99() {
        let mut report = Report::new("x");
        let summary = Summary::of(&[1.0, 2.0, 3.0]).expect("samples");
        report.distribution("lat", "latency", &summary, "ms", Some(2.5));
        let json = report.json();
        assert_eq!(json["results"]["lat_p50"], json!(2.0));
        assert_eq!(json["goals"]["lat_p99"]["pass"], json!(false));
        assert_eq!(json["lat_n"], json!(3));
    }

    #[test]
    fn extras_are_rounded() {
        let mut report = Report::new("x");
        report.extra("nested", json!({"a": [1.23456789, 7], "b": "text"}));
        assert_eq!(report.json()["nested"], json!({"a": [1.235, 7], "b": "text"}));
    }
}
