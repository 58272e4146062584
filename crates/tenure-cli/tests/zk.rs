//! `tenure elect`, `run` and `status` on `zk://` URLs against a real ZooKeeper server: the same
//! commands, the same answers as on the file lock.

mod common;

use common::run_to_end;
use tenure_testkit::zookeeper;

/// A `zk://` URL of the test server, on a path of its own for `test`.
fn url(test: &str) -> Option<String> {
    let server = zookeeper::server()?;
    Some(format!("zk://127.0.0.1:{}{}", server.port, zookeeper::unique_path(test)))
}

#[test]
fn elect_and_status_on_zookeeper_agree_and_hand_over_on_sigterm() {
    let Some(url) = url("cli-elect") else { return };
    common::assert_status_agrees_and_sigterm_hands_over("z", &url, || {});
}

#[test]
fn run_on_zookeeper_passes_the_term_and_the_exit_status() {
    let Some(url) = url("cli-run") else { return };
    common::assert_run_passes_the_term_and_the_exit_status("z", &url);
}

#[test]
fn a_malformed_zookeeper_url_is_a_one_line_usage_error() {
    let (code, _, stderr) = run_to_end(&["status", "--election", "z", "--lock", "zk://127.0.0.1/x"]);
    assert_eq!(code, 2);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("every server needs a port"), "{stderr}");
}

#[test]
fn status_watch_on_zookeeper_prints_the_handover() {
    let Some(url) = url("cli-watch") else { return };
    common::assert_watch_follows_a_handover("z", &url);
}

#[test]
fn tenure_write_on_zookeeper_sets_the_node_only_under_the_leaders_term() {
    let Some(url) = url("cli-write") else { return };
    let server = zookeeper::server().expect("the server of url()");
    let node = zookeeper::unique_path("cli-write-state");
    let read = || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        runtime.block_on(async {
            let client = tenure_zk::zk::Client::connect(&format!("127.0.0.1:{}", server.port)).await.ok()?;
            client.get_data(&node).await.ok().map(|(data, _)| data)
        })
    };
    common::assert_write_is_fenced("w", &url, &node, read);
}
