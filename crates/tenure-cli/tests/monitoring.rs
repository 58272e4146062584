//! `deploy/monitoring/`: the alerting rules and the Grafana dashboard an SRE drops in.
//!
//! What a user would notice if they were wrong: an alert on a misspelled metric never fires, a
//! dashboard panel stays empty, a rule file Prometheus refuses to load. So the rules must pass
//! `promtool` (syntax and the unit tests that show each alert firing and staying silent), and
//! every metric named by a rule or a panel must be one a real `tenure elect --http` serves.
//!
//! promtool comes from Debian's `prometheus` package (`./scripts/test` installs it). Without it
//! the promtool tests print "skipped", unless `CI=true`, where they fail.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{get, metric, start_elect, wait_until, TempDir};
use serde_json::Value;

const RULES: &str = "deploy/monitoring/tenure-alerts.yaml";
const RULE_TESTS: &str = "deploy/monitoring/tenure-alerts.test.yaml";
const DASHBOARD: &str = "deploy/monitoring/tenure-dashboard.json";

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    let path = repository_root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The path of promtool; `None` (after saying so) when it is missing outside CI.
fn promtool() -> Option<&'static str> {
    let runs = Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if runs {
        return Some("promtool");
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("promtool is not installed and CI=true: install Debian's `prometheus` package (./scripts/test does)");
    }
    eprintln!("skipped: promtool not installed (Debian package `prometheus`)");
    None
}

/// Runs `promtool ARGS` in the repository root; panics with its output unless it succeeds.
fn run_promtool(promtool: &str, args: &[&str]) -> String {
    let output = Command::new(promtool).args(args).current_dir(repository_root()).output().expect("run promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {} failed:\n{text}", args.join(" "));
    text
}

fn yaml(path: &str) -> serde_yaml::Value {
    serde_yaml::from_str(&read(path)).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

/// (alert name, expression) of every alerting rule.
fn alert_rules() -> Vec<(String, String)> {
    let rules = yaml(RULES);
    let groups = rules["groups"].as_sequence().expect("a groups list");
    let rules: Vec<(String, String)> = groups
        .iter()
        .flat_map(|group| group["rules"].as_sequence().expect("a rules list of each group"))
        .map(|rule| {
            let alert = rule["alert"].as_str().expect("only alerting rules, each named");
            (alert.to_owned(), rule["expr"].as_str().expect("an expression").to_owned())
        })
        .collect();
    assert!(!rules.is_empty(), "{RULES} has no rules");
    rules
}

/// The dashboard's queries: every `expr` of a panel target, and the metric of every
/// `label_values(metric, label)` variable (rewritten as a selector of that metric).
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn walk(value: &Value, queries: &mut Vec<String>) {
        match value {
            Value::Object(fields) => {
                for (key, field) in fields {
                    match (key.as_str(), field) {
                        ("expr", Value::String(expr)) => queries.push(expr.clone()),
                        ("definition", Value::String(query)) => {
                            let inner = query
                                .strip_prefix("label_values(")
                                .and_then(|rest| rest.split(',').next())
                                .unwrap_or_else(|| panic!("unexpected variable query {query:?}"));
                            queries.push(inner.trim().to_owned());
                        }
                        _ => walk(field, queries),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, queries)),
            _ => {}
        }
    }
    let mut queries = Vec::new();
    walk(dashboard, &mut queries);
    queries
}

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// A dashboard query as Prometheus receives it: Grafana's variables replaced by what Grafana
/// sends for them.
fn as_prometheus_receives_it(query: &str) -> String {
    let query = query
        .replace("$__rate_interval", "1m")
        .replace("$__interval", "30s")
        .replace("$__range", "6h")
        .replace("$election", ".+");
    assert!(!query.contains('$'), "a Grafana variable this test does not know in {query:?}");
    query
}

/// The metric names a PromQL expression selects: identifiers that are not functions,
/// aggregations, keywords, label names, strings, durations or Grafana variables.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];
    const OPERATORS: &str = "and or unless bool offset atan2 inf nan sum min max avg group stddev stdvar count \
                             count_values bottomk topk quantile limitk limit_ratio";
    let chars: Vec<char> = expr.chars().collect();
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let next_visible = |from: usize| chars[from..].iter().copied().find(|c| !c.is_whitespace());
    // The index after the bracket closing the one at `open`, skipping quoted strings.
    let skip_group = |open: usize, close: char| {
        let mut i = open + 1;
        while i < chars.len() && chars[i] != close {
            if matches!(chars[i], '"' | '\'' | '`') {
                let quote = chars[i];
                i += 1;
                while i < chars.len() && chars[i] != quote {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
            }
            i += 1;
        }
        i + 1
    };
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_group(i, c);
        } else if c == '{' {
            i = skip_group(i, '}');
        } else if c == '[' {
            i = skip_group(i, ']');
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                i = skip_group(i, '}');
            }
            while i < chars.len() && is_word(chars[i]) {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (is_word(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if is_word(c) {
            let start = i;
            while i < chars.len() && is_word(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = next_visible(i);
            if GROUPING.contains(&word.as_str()) {
                if next == Some('(') {
                    let open = i + chars[i..].iter().position(|&c| c == '(').unwrap_or(0);
                    i = skip_group(open, ')');
                }
            } else if !OPERATORS.split_whitespace().any(|op| op == word) && next != Some('(') {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn promql_metric_names_leave_out_functions_labels_keywords_and_variables() {
    let expr = r#"sum by (namespace, name) (rate(tenure_renews_total{name=~"$election", x="a{b}"}[5m] offset 1m))
        / on (name) group_left (pod) max without (le) (a:recorded:rate5m) > 0.25 * ${var} and bool up"#;
    let names: Vec<String> = metric_names(expr).into_iter().collect();
    assert_eq!(names, ["a:recorded:rate5m", "tenure_renews_total", "up"]);
}

#[test]
fn alert_rules_load_in_prometheus_and_their_unit_tests_pass() {
    let Some(promtool) = promtool() else { return };
    let checked = run_promtool(promtool, &["check", "rules", RULES]);
    assert!(checked.contains(&format!("SUCCESS: {} rules found", alert_rules().len())), "{checked}");
    let tested = run_promtool(promtool, &["test", "rules", RULE_TESTS]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_alert_has_unit_tests_where_it_fires_and_where_it_stays_silent() {
    let tests = yaml(RULE_TESTS);
    assert_eq!(tests["rule_files"][0].as_str(), Some("tenure-alerts.yaml"), "the tests load the shipped rules");
    // alert name -> (some evaluation expects it firing, some evaluation expects silence)
    let mut seen: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for test in tests["tests"].as_sequence().expect("a tests list") {
        for check in test["alert_rule_test"].as_sequence().into_iter().flatten() {
            let alert = check["alertname"].as_str().expect("alertname").to_owned();
            let fires = check["exp_alerts"].as_sequence().is_some_and(|alerts| !alerts.is_empty());
            let entry = seen.entry(alert).or_default();
            if fires {
                entry.0 = true;
            } else {
                entry.1 = true;
            }
        }
    }
    for (alert, _) in alert_rules() {
        assert_eq!(seen.get(&alert), Some(&(true, true)), "{alert}: (fires somewhere, silent somewhere)");
    }
}

#[test]
fn dashboard_queries_are_promql_that_prometheus_accepts() {
    let Some(promtool) = promtool() else { return };
    let queries = dashboard_queries(&dashboard());
    // promtool checks expressions of rule files only: give it each query as a recording rule.
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, query)| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": as_prometheus_receives_it(query)}))
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = TempDir::new("dashboard-promql");
    let path = dir.join("dashboard-queries.yaml");
    std::fs::write(&path, serde_yaml::to_string(&file).unwrap()).unwrap();
    let checked = run_promtool(promtool, &["check", "rules", path.to_str().unwrap()]);
    assert!(checked.contains(&format!("SUCCESS: {} rules found", queries.len())), "{checked}");
}

#[test]
fn dashboard_panels_are_complete_and_use_the_chosen_data_source() {
    let dashboard = dashboard();
    assert!(dashboard["uid"].as_str().is_some_and(|uid| !uid.is_empty()), "a stable uid, so re-imports replace it");
    let variables = dashboard["templating"]["list"].as_array().expect("template variables");
    assert!(variables
        .iter()
        .any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"));
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(ids.insert(panel["id"].as_u64().expect("a numeric id")), "{title}: duplicate id");
        assert!(panel["gridPos"]["w"].as_u64().is_some_and(|w| w > 0 && w <= 24), "{title}: gridPos");
        assert!(panel["description"].as_str().is_some_and(|d| !d.is_empty()), "{title}: says what it shows");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}: the data source variable");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            assert!(target["expr"].as_str().is_some_and(|e| !e.is_empty()), "{title}: a query");
        }
    }
}

/// Every metric name (sample name, as a query selects it) in a `/metrics` answer.
fn exported_names(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| line.split(['{', ' ']).next().unwrap_or_default().to_owned())
        .collect()
}

/// The `/metrics` answers of a leader and a follower of election "monitoring" on a file lock,
/// once every series is there (the latency needs a renew, the follower's term a read).
fn scrape_a_leader_and_a_follower() -> (String, String) {
    let dir = TempDir::new("monitoring-metrics");
    let lock = common::file_url(&dir.join("lock.json"));
    let (_leader, leader) = start_elect("a", "monitoring", &lock, "2s");
    let latency = r#"tenure_renew_latency_seconds{name="monitoring"}"#;
    wait_until(Duration::from_secs(10), || metric(&leader, latency))
        .unwrap_or_else(|| panic!("no {latency} within 10 s: {:?}", get(&leader, "/metrics")));
    let (_follower, follower) = start_elect("b", "monitoring", &lock, "2s");
    let term = r#"tenure_term{name="monitoring"}"#;
    wait_until(Duration::from_secs(10), || metric(&follower, term))
        .unwrap_or_else(|| panic!("the follower knows no term within 10 s: {:?}", get(&follower, "/metrics")));
    let scrape = |address: &str| get(address, "/metrics").expect("an answer from /metrics").1;
    let (leader, follower) = (scrape(&leader), scrape(&follower));
    assert!(leader.contains("leader_election_master_status{name=\"monitoring\"} 1\n"), "{leader}");
    assert!(follower.contains("leader_election_master_status{name=\"monitoring\"} 0\n"), "{follower}");
    (leader, follower)
}

/// The `/metrics` answer of a `tenure member` of group "monitoring" on a directory, once it owns
/// its partitions.
fn scrape_a_member() -> String {
    let dir = TempDir::new("monitoring-member");
    let url = common::file_url(&dir.join("group"));
    let args = ["member", "--group", "monitoring", "--http", "127.0.0.1:0", "--id", "m", "--ttl", "2s", "--lock", &url];
    let member = common::Tenure::start("member", &args);
    let address = member.http_address();
    let owned = r#"tenure_group_owned_partitions{group="monitoring"}"#;
    wait_until(Duration::from_secs(10), || metric(&address, owned).filter(|owned| *owned > 0.0))
        .unwrap_or_else(|| panic!("the member owns nothing within 10 s: {:?}", get(&address, "/metrics")));
    get(&address, "/metrics").expect("an answer from /metrics").1
}

#[test]
fn rules_and_dashboard_name_only_metrics_that_tenure_elect_and_member_export() {
    let (elect, _) = scrape_a_leader_and_a_follower();
    let member = scrape_a_member();
    let elect_names = exported_names(&elect);
    let exported: BTreeSet<String> = elect_names.union(&exported_names(&member)).cloned().collect();
    let body = format!("{elect}{member}");

    let mut used = BTreeSet::new();
    for (alert, expr) in alert_rules() {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "{alert} selects no metric: {expr}");
        for name in names {
            assert!(exported.contains(&name), "{alert} uses {name}, which tenure elect and member do not export:\n{body}");
            used.insert(name);
        }
    }
    for query in dashboard_queries(&dashboard()) {
        let names = metric_names(&query);
        assert!(!names.is_empty(), "a dashboard query selects no metric: {query}");
        for name in names {
            assert!(exported.contains(&name), "the dashboard uses {name}, which tenure elect does not export:\n{body}");
            used.insert(name);
        }
    }
    // Every election metric is on a panel or in an alert (the dashboard is about elections).
    let unshown: Vec<&String> = elect_names.difference(&used).collect();
    assert!(unshown.is_empty(), "exported but on no panel or alert: {unshown:?}");
}

/// The samples of a `/metrics` answer as promtool input series of target `instance` (job
/// "tenure"), each holding its scraped value for 20 minutes of 15 s scrapes, or the value
/// `edit(series, value)` returns.
fn input_series(body: &str, instance: &str, edit: impl Fn(&str, f64) -> f64) -> Vec<Value> {
    body.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample is `series value`");
            let labels = format!(r#"job="tenure",instance="{instance}"}}"#);
            let series = match series.strip_suffix('}') {
                Some(open) => format!("{open},{labels}"),
                None => format!("{series}{{{labels}"),
            };
            let value: f64 = value.parse().expect("a numeric sample");
            serde_json::json!({"series": series, "values": format!("{}x80", edit(line, value))})
        })
        .collect()
}

#[test]
fn the_alert_expressions_judge_real_scrapes_of_a_healthy_leaderless_split_and_lonely_election() {
    let Some(promtool) = promtool() else { return };
    let (leader, follower) = scrape_a_leader_and_a_follower();
    let as_is = |_: &str, value: f64| value;
    let status = |forced: f64| {
        move |line: &str, value: f64| if line.starts_with("leader_election_master_status") { forced } else { value }
    };
    let silent: Vec<Value> = alert_rules()
        .into_iter()
        .map(|(alert, _)| serde_json::json!({"eval_time": "20m", "alertname": alert, "exp_alerts": []}))
        .collect();
    let fires = |alert: &str, severity: &str| {
        let labels = serde_json::json!({"severity": severity, "name": "monitoring"});
        vec![serde_json::json!({"eval_time": "20m", "alertname": alert, "exp_alerts": [{"exp_labels": labels}]})]
    };
    let case = |name: &str, series: Vec<Vec<Value>>, checks: Vec<Value>| serde_json::json!({"name": name, "interval": "15s", "input_series": series.concat(), "alert_rule_test": checks});
    let tests = vec![
        case(
            "healthy: one leader, one follower",
            vec![input_series(&leader, "a", as_is), input_series(&follower, "b", as_is)],
            silent,
        ),
        case(
            "the leader's scrapes say it no longer leads",
            vec![input_series(&leader, "a", status(0.0)), input_series(&follower, "b", as_is)],
            fires("TenureNoLeader", "critical"),
        ),
        case(
            "the follower's scrapes say it leads too",
            vec![input_series(&leader, "a", as_is), input_series(&follower, "b", status(1.0))],
            fires("TenureMultipleLeaders", "critical"),
        ),
        case("the leader alone", vec![input_series(&leader, "a", as_is)], fires("TenureNoStandby", "warning")),
    ];

    // The shipped rules without their annotations, so that the checks compare labels only.
    let mut rules = yaml(RULES);
    for group in rules["groups"].as_sequence_mut().expect("groups") {
        for rule in group["rules"].as_sequence_mut().expect("rules") {
            rule.as_mapping_mut().expect("a rule is a mapping").remove("annotations");
        }
    }
    let dir = TempDir::new("monitoring-real-scrapes");
    std::fs::write(dir.join("rules.yaml"), serde_yaml::to_string(&rules).unwrap()).unwrap();
    let file = serde_json::json!({"rule_files": ["rules.yaml"], "evaluation_interval": "15s", "tests": tests});
    std::fs::write(dir.join("tests.yaml"), serde_yaml::to_string(&file).unwrap()).unwrap();
    let tests_path = dir.join("tests.yaml");
    let tested = run_promtool(promtool, &["test", "rules", tests_path.to_str().unwrap()]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}
