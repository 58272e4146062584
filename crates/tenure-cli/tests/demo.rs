//! `tenure demo` runs to completion with no setup, measures failover and handover, and cleans up,
//! also when interrupted.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Tenure, TENURE};

fn demo_dirs_of(pid: i32) -> Vec<PathBuf> {
    let prefix = format!("tenure-demo-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
        .collect()
}

fn elect_children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { return false };
            let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
            fields.get(1).and_then(|ppid| ppid.parse::<i32>().ok()) == Some(pid) && fields.first() != Some(&"Z")
        })
        .collect()
}

#[test]
fn demo_runs_to_completion_and_prints_measured_failover_and_handover() {
    let started = Instant::now();
    let mut demo = Tenure::start("demo", &["demo"]);
    let code = demo.exit_code(Duration::from_secs(50));
    let output = demo.output();
    assert_eq!(code, 0, "stdout:\n{output}\nstderr:\n{}", demo.log());
    assert!(started.elapsed() < Duration::from_secs(30), "the demo took {:?}", started.elapsed());
    let summary = &output[output.find("Summary").expect("a summary")..];
    assert!(summary.contains("failover after SIGKILL"), "{summary}");
    assert!(summary.contains("handover after SIGTERM"), "{summary}");
    for term in ["term 1", "term 2", "term 3"] {
        assert!(summary.contains(term), "no {term} in {summary}");
    }
    assert!(demo_dirs_of(demo.pid()).is_empty(), "the demo left its temporary directory behind");
}

#[test]
fn an_interrupted_demo_stops_its_replicas_and_removes_its_directory() {
    let mut demo = Tenure::start("demo", &["demo"]);
    common::wait_until(Duration::from_secs(10), || demo.output().contains("acquired the lock").then_some(()))
        .unwrap_or_else(|| panic!("the demo did not get going:\n{}\n{}", demo.output(), demo.log()));
    let pid = demo.pid();
    assert_eq!(elect_children_of(pid).len(), 3, "three replicas run");
    demo.signal(libc::SIGINT);
    assert_eq!(demo.exit_code(Duration::from_secs(10)), 128 + libc::SIGINT, "{}", demo.output());
    assert!(elect_children_of(pid).is_empty(), "replicas survived the demo");
    assert!(demo_dirs_of(pid).is_empty(), "the demo left its temporary directory behind");
    let _ = TENURE;
}
