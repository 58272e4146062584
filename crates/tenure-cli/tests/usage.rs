//! Bad command lines are refused with one line on standard error and exit status 2, before
//! anything is started.

mod common;

use common::run_to_end;

fn assert_usage_error(args: &[&str], mentions: &str) {
    let (code, stdout, stderr) = run_to_end(args);
    assert_eq!(code, 2, "{args:?}: exit code; stderr: {stderr}");
    assert!(stdout.is_empty(), "{args:?}: stdout: {stdout}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: not one line: {stderr}");
    assert!(stderr.contains(mentions), "{args:?}: {stderr:?} does not mention {mentions:?}");
}

#[test]
fn missing_election_is_a_usage_error() {
    assert_usage_error(&["elect"], "--election");
    assert_usage_error(&["run", "--", "true"], "--election");
    assert_usage_error(&["status"], "--election");
    assert_usage_error(&["elect", "--election", ""], "must not be empty");
}

#[test]
fn bad_lock_urls_are_usage_errors() {
    assert_usage_error(&["elect", "--election", "e", "--lock", "/tmp/x"], "not a lock URL");
    assert_usage_error(&["elect", "--election", "e", "--lock", "file:relative"], "three slashes");
    assert_usage_error(
        &["status", "--election", "e", "--lock", "kube://default/pods/e"],
        "unknown Kubernetes lock kind",
    );
    assert_usage_error(
        &["run", "--election", "e", "--lock", "gopher://x", "--", "true"],
        "unknown lock scheme 'gopher'",
    );
}

#[test]
fn bad_durations_and_timings_are_usage_errors() {
    assert_usage_error(&["elect", "--election", "e", "--ttl", "5"], "--ttl");
    assert_usage_error(&["elect", "--election", "e", "--ttl", "soon"], "--ttl");
    assert_usage_error(&["elect", "--election", "e", "--ttl", "500ms"], "out of range");
    assert_usage_error(&["run", "--election", "e", "--lock", "memory:", "--grace", "often", "--", "true"], "--grace");
}

#[test]
fn grace_that_would_let_the_command_outlive_the_kill_bound_is_refused() {
    // --ttl 10s: lease 10 s, renew deadline 5 s, so SIGKILL comes at most 3.75 s after the
    // self-fencing deadline.
    assert_usage_error(
        &["run", "--election", "e", "--lock", "memory:", "--ttl", "10s", "--grace", "3751ms", "--", "true"],
        "must be dead before another instance may lead",
    );
    let (code, _, stderr) =
        run_to_end(&["run", "--election", "e", "--lock", "memory:", "--ttl", "10s", "--grace", "3750ms", "--", "true"]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn run_help_states_when_the_command_is_killed_and_what_is_contained() {
    let (code, stdout, _) = run_to_end(&["run", "--help"]);
    assert_eq!(code, 0);
    for promise in
        ["SIGTERM comes at V at the latest", "V + 3/4 (lease - renew deadline)", "cgroup", "setsid", "Not covered"]
    {
        assert!(stdout.contains(promise), "--help does not say {promise:?}:\n{stdout}");
    }
}

#[test]
fn unknown_flags_and_subcommands_are_usage_errors() {
    assert_usage_error(&["elect", "--election", "e", "--no-such-flag"], "--no-such-flag");
    assert_usage_error(
        &["elect", "--election", "e", "--use-cluster-credentials", "--kubeconfig", "/k"],
        "cannot be combined",
    );
    assert_usage_error(&["elect", "--election", "e", "--http", "4040"], "--http");
    assert_usage_error(&["run", "--election", "e", "true"], "'true'");
    assert_usage_error(&["frobnicate"], "frobnicate");
    assert_usage_error(&["status", "--election", "e", "--output", "yaml"], "yaml");
}

#[test]
fn a_kubernetes_lock_without_a_cluster_is_a_one_line_failure() {
    for args in [
        &["status", "--election", "e", "--lock", "kube://default/leases/e"][..],
        &["elect", "--election", "e", "--use-cluster-credentials"],
        &["run", "--election", "e", "--lock-type", "leases", "--", "true"],
    ] {
        let (code, _, stderr) = run_to_end(args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: not one line: {stderr}");
        assert!(stderr.contains("kube://default/"), "{args:?}: names the lock: {stderr}");
    }
}

#[test]
fn help_and_version_exit_zero() {
    for args in [&["--help"][..], &["--version"], &["run", "--help"], &["elect", "--help"]] {
        let (code, stdout, _) = run_to_end(args);
        assert_eq!(code, 0, "{args:?}");
        assert!(!stdout.is_empty(), "{args:?}");
    }
    let (_, help, _) = run_to_end(&["run", "--help"]);
    assert!(help.contains("75"), "run --help documents the lost-leadership exit status");
    assert!(help.contains("SIGTERM"), "run --help documents signals");
}
