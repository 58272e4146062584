//! The resumable watcher against the project's API server: a resume delivers exactly the changes
//! after the saved version, deletions made while nobody watched among them; a version the server
//! no longer keeps relists and says so; timeouts, dropped streams and cut connections lose and
//! repeat nothing.

use std::time::Duration;

use futures::future::ready;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use tenure_apiserver::{ApiServerConfig, FaultScope, InjectedFault, Verb};
use tenure_kube::resume::{Backoff, ResumableWatcher, ResumeConfig, ResumeEvent};
use tenure_kube::{user_agent, ListCause};
use tenure_testkit::kube::{Cluster, PATIENCE};
use tokio::sync::mpsc;
use tokio::time::Instant;

const WATCHER: &str = "resuming-watcher";

fn pod(name: &str, app: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "registry.example/web:1"}]},
    })
}

/// Quick retries, so that tests that cut the connection do not wait for the default back-off.
fn config() -> ResumeConfig {
    ResumeConfig::default()
        .labels("app=web")
        .backoff(Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) })
}

async fn pods(cluster: &Cluster) -> Api<Pod> {
    let client = cluster.lock_config("leases", "unused").cluster.client(WATCHER).await.unwrap();
    Api::namespaced(client, "default")
}

/// An event as a test reads it: "applied a", "deleted b", "listed a,c (initial)"; bookmarks are
/// left out (the server sends them when it likes).
fn describe(event: &ResumeEvent<Pod>) -> Option<String> {
    match event {
        ResumeEvent::Applied(pod) => Some(format!("applied {}", pod.name_any())),
        ResumeEvent::Deleted(pod) => Some(format!("deleted {}", pod.name_any())),
        ResumeEvent::Progress(_) => None,
        ResumeEvent::Listed { objects, cause, .. } => {
            let mut names: Vec<String> = objects.iter().map(|pod| pod.name_any()).collect();
            names.sort();
            let why = match cause {
                ListCause::Initial => "initial",
                ListCause::Expired { .. } => "expired",
                ListCause::Invalid { .. } => "invalid",
            };
            Some(format!("listed {} ({why})", names.join(",")))
        }
    }
}

/// The next `count` events other than bookmarks; an error fails the test.
async fn next_events(watcher: &mut ResumableWatcher<Pod>, count: usize) -> Vec<String> {
    let mut seen = Vec::new();
    while seen.len() < count {
        let event = tokio::time::timeout(PATIENCE, watcher.next_event()).await.expect("an event in time");
        seen.extend(describe(&event.expect("no watch error")));
    }
    seen
}

/// A watcher already caught up after its first list of `expected`.
async fn listed_watcher(cluster: &Cluster, expected: &str) -> ResumableWatcher<Pod> {
    let mut watcher = ResumableWatcher::new(pods(cluster).await, config(), None).unwrap();
    assert_eq!(next_events(&mut watcher, 1).await, [format!("listed {expected} (initial)")]);
    watcher
}

fn current_version(cluster: &Cluster) -> String {
    cluster.server.store().current_resource_version().to_string()
}

#[tokio::test]
async fn resuming_from_a_saved_version_delivers_exactly_the_changes_since_including_deletions_made_while_nobody_watched(
) {
    let cluster = Cluster::start().await;
    for name in ["a", "b", "c"] {
        cluster.create("pods", pod(name, "web"));
    }
    cluster.create("pods", pod("other", "db"));
    let first = listed_watcher(&cluster, "a,b,c").await;
    let checkpoint = first.last_delivered_version().map(str::to_string);
    assert_eq!(checkpoint, Some(current_version(&cluster)));
    drop(first);

    // While nobody watches: "a" leaves the selector, "b" is deleted, "d" is created, and a Pod
    // outside the selector changes.
    cluster.overwrite("pods", "a", |pod| pod["metadata"]["labels"]["app"] = json!("db"));
    cluster.delete("pods", "b");
    cluster.create("pods", pod("d", "web"));
    let after_d = current_version(&cluster);
    cluster.delete("pods", "other");

    let mut resumed = ResumableWatcher::new(pods(&cluster).await, config(), checkpoint).unwrap();
    assert_eq!(next_events(&mut resumed, 3).await, ["deleted a", "deleted b", "applied d"]);
    assert_eq!(resumed.last_delivered_version(), Some(after_d.as_str()));
    // Nothing is delivered twice: the next event is the next change.
    cluster.create("pods", pod("e", "web"));
    assert_eq!(next_events(&mut resumed, 1).await, ["applied e"]);
    assert_eq!((resumed.stats().lists, resumed.stats().failed_resumes), (0, 0));
    assert_eq!(cluster.requests(WATCHER, Verb::List), 1, "only the first watcher listed");
}

#[tokio::test]
async fn as_a_stream_it_lists_then_watches_and_each_event_carries_the_version_to_checkpoint() {
    let cluster = Cluster::start().await;
    cluster.create("pods", pod("a", "web"));
    let listed_at = current_version(&cluster);
    let watcher = ResumableWatcher::new(pods(&cluster).await, config(), None).unwrap();
    let mut events =
        std::pin::pin!(watcher.into_stream().try_filter(|e| ready(!matches!(e, ResumeEvent::Progress(_)))));
    let listed = tokio::time::timeout(PATIENCE, events.try_next()).await.unwrap().unwrap().unwrap();
    assert_eq!(describe(&listed).unwrap(), "listed a (initial)");
    assert_eq!(listed.resource_version(), Some(listed_at));
    cluster.delete("pods", "a");
    let deleted = tokio::time::timeout(PATIENCE, events.try_next()).await.unwrap().unwrap().unwrap();
    assert_eq!(describe(&deleted).unwrap(), "deleted a");
    assert_eq!(deleted.resource_version(), Some(current_version(&cluster)));
}

#[tokio::test]
async fn bookmarks_move_a_quiet_watcher_s_checkpoint_past_changes_its_selectors_filter_out() {
    let config = ApiServerConfig { bookmark_interval: Duration::from_millis(50), ..ApiServerConfig::default() };
    let cluster = Cluster::start_with(config).await;
    let mut watcher = listed_watcher(&cluster, "").await;
    // Only changes the watcher does not select: no event for it, but its checkpoint must not stay
    // behind them (it would leave the server's event window while nothing selected changes).
    cluster.create("pods", pod("db-1", "db"));
    cluster.delete("pods", "db-1");
    let newest = cluster.server.store().current_resource_version();
    let progressed = loop {
        match tokio::time::timeout(PATIENCE, watcher.next_event()).await.expect("a bookmark in time").unwrap() {
            ResumeEvent::Progress(version) if version.parse::<u64>().unwrap() >= newest => break version,
            ResumeEvent::Progress(_) => continue,
            other => panic!("expected only bookmarks, got {:?}", describe(&other)),
        }
    };
    assert_eq!(watcher.last_delivered_version(), Some(progressed.as_str()));
    cluster.create("pods", pod("web-1", "web"));
    assert_eq!(next_events(&mut watcher, 1).await, ["applied web-1"]);
}

#[tokio::test]
async fn a_saved_version_older_than_the_event_window_relists_and_flags_the_failed_resume() {
    let cluster = Cluster::start_with(ApiServerConfig { event_log_capacity: 2, ..ApiServerConfig::default() }).await;
    for name in ["a", "b", "c"] {
        cluster.create("pods", pod(name, "web"));
    }
    let checkpoint = listed_watcher(&cluster, "a,b,c").await.last_delivered_version().map(str::to_string);
    cluster.delete("pods", "b");
    for name in ["d", "e", "f"] {
        cluster.create("pods", pod(name, "web"));
    }

    let mut resumed = ResumableWatcher::new(pods(&cluster).await, config(), checkpoint.clone()).unwrap();
    let event = tokio::time::timeout(PATIENCE, resumed.next_event()).await.unwrap().unwrap();
    // The deletion of "b" cannot be delivered any more: "b" is only missing from the list.
    assert_eq!(describe(&event).unwrap(), "listed a,c,d,e,f (expired)");
    let ResumeEvent::Listed { cause, version, .. } = event else { unreachable!() };
    assert!(cause.resume_failed());
    assert_eq!(cause, ListCause::Expired { requested: checkpoint.unwrap() });
    assert_eq!(version, current_version(&cluster));
    assert_eq!(resumed.stats().failed_resumes, 1);
    // Watching goes on from the list.
    cluster.create("pods", pod("g", "web"));
    assert_eq!(next_events(&mut resumed, 1).await, ["applied g"]);
}

#[tokio::test]
async fn a_resume_refused_with_an_http_410_relists_and_flags_the_failed_resume() {
    let cluster = Cluster::start().await;
    cluster.create("pods", pod("a", "web"));
    let checkpoint = listed_watcher(&cluster, "a").await.last_delivered_version().map(str::to_string);
    cluster.create("pods", pod("b", "web"));
    let once = FaultScope { client: Some(user_agent(WATCHER)), verbs: vec![Verb::Watch], times: Some(1) };
    cluster.server.faults().inject(once, InjectedFault::Expired);

    let mut resumed = ResumableWatcher::new(pods(&cluster).await, config(), checkpoint).unwrap();
    assert_eq!(next_events(&mut resumed, 1).await, ["listed a,b (expired)"]);
    assert_eq!(resumed.stats().failed_resumes, 1);
    cluster.create("pods", pod("c", "web"));
    assert_eq!(next_events(&mut resumed, 1).await, ["applied c"]);
}

#[tokio::test]
async fn a_server_refusing_even_the_version_of_its_own_list_gets_relists_only_after_back_off() {
    let cluster = Cluster::start().await;
    let every_watch = FaultScope { client: Some(user_agent(WATCHER)), verbs: vec![Verb::Watch], times: None };
    cluster.server.faults().inject(every_watch, InjectedFault::Expired);
    let patient =
        ResumeConfig::default().backoff(Backoff { initial: Duration::from_secs(3600), max: Duration::from_secs(3600) });
    let mut watcher = ResumableWatcher::new(pods(&cluster).await, patient, None).unwrap();
    assert_eq!(next_events(&mut watcher, 1).await, ["listed  (initial)"]);
    // The watch from the list's version is refused: the watcher waits out its back-off instead of
    // listing again at once (and again, and again).
    let waiting = tokio::time::timeout(Duration::from_millis(300), watcher.next_event()).await;
    assert!(
        waiting.is_err(),
        "expected the watcher to be backing off, got {:?}",
        waiting.map(|e| e.map(|e| describe(&e)))
    );
    assert_eq!(cluster.requests(WATCHER, Verb::Watch), 1);
    assert_eq!(cluster.requests(WATCHER, Verb::List), 1);
}

#[tokio::test]
async fn a_saved_version_the_server_cannot_parse_is_treated_as_absent_and_flagged() {
    let cluster = Cluster::start().await;
    cluster.create("pods", pod("a", "web"));
    let mut resumed =
        ResumableWatcher::new(pods(&cluster).await, config(), Some("checkpoint-of-another-tool".into())).unwrap();
    assert_eq!(next_events(&mut resumed, 1).await, ["listed a (invalid)"]);
    cluster.create("pods", pod("b", "web"));
    assert_eq!(next_events(&mut resumed, 1).await, ["applied b"]);
}

/// Drives a watcher in a task of its own (a watcher only re-opens while it is polled), handing
/// over each event with the version the watcher had delivered after it.
fn drive(mut watcher: ResumableWatcher<Pod>) -> mpsc::UnboundedReceiver<(String, Option<String>)> {
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let described = match watcher.next_event().await {
                Ok(event) => describe(&event),
                Err(error) => Some(format!("error {error}")),
            };
            let version = watcher.last_delivered_version().map(str::to_string);
            if let Some(text) = described {
                if sender.send((text, version)).is_err() {
                    return;
                }
            }
        }
    });
    receiver
}

async fn received(events: &mut mpsc::UnboundedReceiver<(String, Option<String>)>, count: usize) -> Vec<String> {
    let mut seen = Vec::new();
    while seen.len() < count {
        let (text, _) = tokio::time::timeout(PATIENCE, events.recv()).await.expect("an event in time").unwrap();
        seen.push(text);
    }
    seen
}

/// The next `count` events from [`drive`] that are not errors.
async fn received_ignoring_errors(
    events: &mut mpsc::UnboundedReceiver<(String, Option<String>)>,
    count: usize,
) -> Vec<String> {
    let mut seen = Vec::new();
    while seen.len() < count {
        seen.extend(received(events, 1).await.into_iter().filter(|text| !text.starts_with("error ")));
    }
    seen
}

/// Polls until `condition` holds, failing the test after [`PATIENCE`].
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_watch_that_times_out_is_reopened_from_the_last_delivered_version_without_loss_or_repetition() {
    let cluster = Cluster::start().await;
    cluster.create("pods", pod("a", "web"));
    let watcher = ResumableWatcher::new(pods(&cluster).await, config().timeout_seconds(1), None).unwrap();
    let mut events = drive(watcher);
    assert_eq!(received(&mut events, 1).await, ["listed a (initial)"]);
    cluster.create("pods", pod("b", "web"));
    assert_eq!(received(&mut events, 1).await, ["applied b"]);

    // Hold the re-opened watch at the server for a while, and change things while it is held:
    // these changes come after the first watch ended and before the second one started.
    let faults = cluster.server.faults();
    let client = user_agent(WATCHER);
    faults.set_client_latency(&client, Duration::from_millis(500));
    eventually("the watch to be re-opened after its timeout", || faults.request_count(&client, Verb::Watch) >= 2).await;
    cluster.delete("pods", "a");
    cluster.create("pods", pod("c", "web"));
    faults.set_client_latency(&client, Duration::ZERO);

    assert_eq!(received(&mut events, 2).await, ["deleted a", "applied c"]);
    cluster.create("pods", pod("d", "web"));
    assert_eq!(received(&mut events, 1).await, ["applied d"]);
    assert_eq!(faults.request_count(&client, Verb::List), 1, "a timeout never causes a relist");
}

#[tokio::test]
async fn a_watcher_dropped_mid_stream_is_succeeded_by_one_resuming_from_its_last_delivered_version() {
    let cluster = Cluster::start().await;
    let mut first = listed_watcher(&cluster, "").await;
    let names: Vec<String> = (1..=10).map(|n| format!("p{n}")).collect();
    for name in &names {
        cluster.create("pods", pod(name, "web"));
    }
    // Four events processed, six more already on their way when the watcher vanishes.
    assert_eq!(next_events(&mut first, 4).await, ["applied p1", "applied p2", "applied p3", "applied p4"]);
    let checkpoint = first.last_delivered_version().map(str::to_string);
    drop(first);
    cluster.delete("pods", "p2");

    let mut successor = ResumableWatcher::new(pods(&cluster).await, config(), checkpoint).unwrap();
    let expected: Vec<String> =
        names[4..].iter().map(|name| format!("applied {name}")).chain(["deleted p2".to_string()]).collect();
    assert_eq!(next_events(&mut successor, expected.len()).await, expected);
    cluster.create("pods", pod("p11", "web"));
    assert_eq!(next_events(&mut successor, 1).await, ["applied p11"]);
}

#[tokio::test]
async fn a_watch_cut_off_by_the_server_is_resumed_after_back_off_without_loss_or_repetition() {
    let cluster = Cluster::start().await;
    let mut watcher = listed_watcher(&cluster, "").await;
    cluster.create("pods", pod("a", "web"));
    assert_eq!(next_events(&mut watcher, 1).await, ["applied a"]);

    // The server drops the watch mid-stream and hangs the watcher's new requests until healed.
    let faults = cluster.server.faults();
    let client = user_agent(WATCHER);
    let watches_before = faults.request_count(&client, Verb::Watch);
    faults.partition(&client);
    let mut events = drive(watcher);
    eventually("the watcher to try again", || faults.request_count(&client, Verb::Watch) > watches_before).await;
    cluster.delete("pods", "a");
    cluster.create("pods", pod("b", "web"));
    faults.heal(&client);

    // The hung request fails when the partition heals; errors are allowed, losses and repeats not.
    assert_eq!(received_ignoring_errors(&mut events, 2).await, ["deleted a", "applied b"]);
    cluster.create("pods", pod("c", "web"));
    assert_eq!(received_ignoring_errors(&mut events, 1).await, ["applied c"]);
    assert_eq!(faults.request_count(&client, Verb::List), 1, "a cut connection never causes a relist");
}
