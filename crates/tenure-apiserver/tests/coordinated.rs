//! Coordinated Leader Election against the in-server coordinator, through the HTTP API as a client
//! of LeaseCandidates sees it: raw JSON requests, kubectl for discovery and printing. Every test
//! starts its own server; nothing waits by sleeping, every wait is on a condition with a deadline.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tenure_apiserver::resources::lease_candidates;
use tenure_apiserver::store::{WatchMessage, WatchStart};
use tenure_apiserver::{ApiServer, ApiServerConfig, CoordinatorConfig};

mod common;
use common::{kubectl, server};

const CANDIDATES: &str = "/apis/coordination.k8s.io/v1beta1/namespaces/default/leasecandidates";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";

/// How long a condition may take: generous, as the machine may be loaded; conditions usually hold
/// within milliseconds (or the configured ping timeout).
const DEADLINE: Duration = Duration::from_secs(30);

/// Short coordinator timings, so that a ping is answered or missed within a test.
fn config(coordinator: CoordinatorConfig) -> ApiServerConfig {
    ApiServerConfig { coordinator, ..ApiServerConfig::default() }
}

fn quick() -> CoordinatorConfig {
    CoordinatorConfig {
        ping_after: Duration::from_secs(3),
        ping_timeout: Duration::from_secs(1),
        candidate_expiry: Duration::from_secs(600),
        ..CoordinatorConfig::default()
    }
}

/// One HTTP/1.1 request on its own connection: the status code and the body as JSON (`null` if none).
async fn raw(address: SocketAddr, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let (code, text) = common::raw(address, method, path, &body).await;
    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `MicroTime` `seconds` from now.
fn micro_time(seconds: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(seconds)).format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

fn candidate(name: &str, lease: &str, binary: &str, emulation: &str, renewed_seconds_ago: i64) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1beta1",
        "kind": "LeaseCandidate",
        "metadata": {"name": name},
        "spec": {"leaseName": lease, "binaryVersion": binary, "emulationVersion": emulation,
            "strategy": "OldestEmulationVersion", "renewTime": micro_time(-renewed_seconds_ago)},
    })
}

async fn create(server: &ApiServer, collection: &str, object: Value) -> Value {
    let (code, created) = raw(server.address(), "POST", collection, &object).await;
    assert_eq!(code, 201, "{created}");
    created
}

async fn get(server: &ApiServer, collection: &str, name: &str) -> Option<Value> {
    let (code, object) = raw(server.address(), "GET", &format!("{collection}/{name}"), &Value::Null).await;
    match code {
        200 => Some(object),
        404 => None,
        _ => panic!("GET {collection}/{name}: {code} {object}"),
    }
}

/// Polls `check` until it yields a value, or fails the test after [`DEADLINE`] saying what it waited for.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, mut check: impl FnMut() -> F) -> T {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the Lease `name` satisfies `condition`, and returns it.
async fn lease_where(server: &ApiServer, name: &str, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
    eventually(what, || async { get(server, LEASES, name).await.filter(|lease| condition(lease)) }).await
}

fn holder(lease: &Value) -> &str {
    lease["spec"]["holderIdentity"].as_str().unwrap_or("")
}

fn preferred(lease: &Value) -> &str {
    lease["spec"]["preferredHolder"].as_str().unwrap_or("")
}

fn time(value: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(value.as_str().expect("a time")).expect("RFC 3339").into()
}

/// What a live candidate does (the client side of a ping): whenever one of `names` has been pinged
/// after its last renewal, it renews, through the API. Driven by the store's watch, not by polling.
fn answer_pings(server: &ApiServer, names: &'static [&'static str]) -> tokio::task::JoinHandle<()> {
    let (first, mut changes) =
        server.store().watch(lease_candidates(), Some("default".into()), WatchStart::CurrentState, false).unwrap();
    let address = server.address();
    tokio::spawn(async move {
        let mut backlog = first.into_iter();
        loop {
            let message = match backlog.next() {
                Some(message) => message,
                None => match changes.recv().await {
                    Some(message) => message,
                    None => return,
                },
            };
            let WatchMessage::Change(change) = message else { continue };
            let object = &*change.object;
            let name = object["metadata"]["name"].as_str().unwrap_or("");
            let spec = &object["spec"];
            let pinged = match (spec["pingTime"].as_str(), spec["renewTime"].as_str()) {
                (Some(_), None) => true,
                (Some(_), Some(_)) => time(&spec["pingTime"]) > time(&spec["renewTime"]),
                _ => false,
            };
            if names.contains(&name) && pinged {
                let mut renewed = object.clone();
                renewed["spec"]["renewTime"] = json!(micro_time(0));
                // A lost race is followed by the event of the write that won, answered in turn.
                raw(address, "PUT", &format!("{CANDIDATES}/{name}"), &renewed).await;
            }
        }
    })
}

/// A Lease held by a client that is not a candidate, for `duration` seconds from now.
fn held_lease(name: &str, holder: &str, renewed_seconds_ago: i64, duration: i64) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": micro_time(-renewed_seconds_ago),
            "acquireTime": micro_time(-renewed_seconds_ago), "leaseTransitions": 2},
    })
}

/// The holder's side of a graceful handover: it releases the Lease it holds by clearing
/// `holderIdentity`, a compare-and-swap on the version it read.
async fn release(server: &ApiServer, lease: &Value) {
    let mut released = lease.clone();
    released["spec"].as_object_mut().unwrap().remove("holderIdentity");
    let name = lease["metadata"]["name"].as_str().unwrap();
    let (code, answer) = raw(server.address(), "PUT", &format!("{LEASES}/{name}"), &released).await;
    assert_eq!(code, 200, "{answer}");
}

#[tokio::test]
async fn a_vacant_lease_goes_to_the_candidate_with_the_oldest_emulation_version() {
    let server = server(config(quick())).await;
    let _answers = answer_pings(&server, &["v11", "v10"]);
    // Held by a client that is not a candidate, so that both candidates are in before the election.
    create(&server, LEASES, held_lease("lock", "outsider", 0, 3600)).await;
    create(&server, CANDIDATES, candidate("v11", "lock", "1.1", "1.1", 0)).await;
    create(&server, CANDIDATES, candidate("v10", "lock", "1.1", "1.0", 0)).await;
    let marked = lease_where(&server, "lock", "the oldest candidate preferred", |l| preferred(l) == "v10").await;
    assert_eq!(holder(&marked), "outsider", "a preferred holder does not remove the holder");
    assert_eq!(marked["spec"]["strategy"], "OldestEmulationVersion");

    // The Lease goes away: elected anew, to the oldest.
    let (code, answer) = raw(server.address(), "DELETE", &format!("{LEASES}/lock"), &Value::Null).await;
    assert_eq!(code, 200, "{answer}");
    let elected = lease_where(&server, "lock", "an election", |l| !holder(l).is_empty()).await;
    assert_eq!(holder(&elected), "v10");
    let spec = &elected["spec"];
    assert_eq!(
        (&spec["strategy"], &spec["leaseDurationSeconds"], &spec["leaseTransitions"]),
        (&json!("OldestEmulationVersion"), &json!(15), &json!(0))
    );
    assert_eq!(spec["acquireTime"], spec["renewTime"]);
    assert!(spec.get("preferredHolder").is_none(), "{elected}");
    let metrics = server.coordinator_metrics();
    assert!(metrics.elections >= 1 && metrics.preferred_holder_updates >= 1, "{metrics:?}");
}

#[tokio::test]
async fn a_candidate_that_does_not_answer_its_ping_is_not_electable_until_it_renews() {
    let server = server(config(quick())).await;
    let _answers = answer_pings(&server, &["alive"]);
    create(&server, LEASES, held_lease("lock", "outsider", 0, 3600)).await;
    // The oldest candidate, last renewed a minute ago: it must answer a ping first, and does not.
    create(&server, CANDIDATES, candidate("silent", "lock", "1.0.0", "1.0.0", 60)).await;
    create(&server, CANDIDATES, candidate("alive", "lock", "1.1.0", "1.1.0", 0)).await;
    let marked = lease_where(&server, "lock", "a preferred holder", |l| !preferred(l).is_empty()).await;
    assert_eq!(preferred(&marked), "alive", "the silent candidate is not electable");
    let silent = get(&server, CANDIDATES, "silent").await.unwrap();
    assert!(time(&silent["spec"]["pingTime"]) > time(&silent["spec"]["renewTime"]), "pinged, unanswered: {silent}");

    // It answers at last (renewTime at or after pingTime): it is the best again.
    let mut answer = silent.clone();
    answer["spec"]["renewTime"] = json!(micro_time(0));
    let (code, body) = raw(server.address(), "PUT", &format!("{CANDIDATES}/silent"), &answer).await;
    assert_eq!(code, 200, "{body}");
    lease_where(&server, "lock", "the renewed candidate preferred", |l| preferred(l) == "silent").await;
    assert!(server.coordinator_metrics().pings >= 1);
}

#[tokio::test]
async fn a_holder_with_a_newer_version_is_asked_to_hand_over_and_a_release_hands_over() {
    let server = server(config(quick())).await;
    let _answers = answer_pings(&server, &["new", "old"]);
    create(&server, CANDIDATES, candidate("new", "lock", "1.31.0", "1.31.0", 0)).await;
    let first = lease_where(&server, "lock", "the only candidate elected", |l| holder(l) == "new").await;
    assert_eq!(first["spec"]["leaseTransitions"], 0);

    create(&server, CANDIDATES, candidate("old", "lock", "1.31.0", "1.30.0", 0)).await;
    let marked = lease_where(&server, "lock", "the older candidate preferred", |l| preferred(l) == "old").await;
    assert_eq!(holder(&marked), "new", "the holder is expected to hand over, not removed");

    // The holder's graceful handover: it finishes its work, then releases the Lease.
    release(&server, &marked).await;
    let handed = lease_where(&server, "lock", "the preferred holder elected", |l| holder(l) == "old").await;
    assert!(handed["spec"].get("preferredHolder").is_none(), "{handed}");
    assert_eq!(handed["spec"]["leaseTransitions"], 1);
}

#[tokio::test]
async fn a_preferred_holder_naming_a_missing_candidate_never_stalls_the_election() {
    let server = server(config(quick())).await;
    let _answers = answer_pings(&server, &["a", "b"]);
    let with_ghost = |lease: Value| {
        let mut lease = lease;
        lease["spec"]["strategy"] = json!("OldestEmulationVersion");
        lease["spec"]["preferredHolder"] = json!("ghost");
        lease
    };
    // Held and current: the stray preferred holder is cleared (the holder is the best there is).
    create(&server, LEASES, with_ghost(held_lease("held", "a", 0, 3600))).await;
    create(&server, CANDIDATES, candidate("a", "held", "1.0.0", "1.0.0", 0)).await;
    let cleared = lease_where(&server, "held", "the ghost cleared", |l| preferred(l).is_empty()).await;
    assert_eq!(holder(&cleared), "a");

    // Expired, its holder the best candidate (the holder stopped renewing for the ghost): a new
    // term for it rather than a Lease left expired for good.
    let expired = create(&server, LEASES, with_ghost(held_lease("expired", "b", 60, 15))).await;
    create(&server, CANDIDATES, candidate("b", "expired", "1.0.0", "1.0.0", 0)).await;
    let renewed = lease_where(&server, "expired", "a new term", |l| preferred(l).is_empty()).await;
    assert_eq!(holder(&renewed), "b");
    assert!(time(&renewed["spec"]["renewTime"]) > time(&expired["spec"]["renewTime"]));
    assert_eq!(renewed["spec"]["leaseTransitions"], 2, "the same holder: no transition");
}

#[tokio::test]
async fn candidates_that_stop_renewing_are_collected_and_live_ones_are_kept() {
    let expiry = CoordinatorConfig {
        ping_after: Duration::from_secs(1),
        ping_timeout: Duration::from_millis(500),
        candidate_expiry: Duration::from_secs(3),
        ..CoordinatorConfig::default()
    };
    let server = server(config(expiry)).await;
    let _answers = answer_pings(&server, &["live"]);
    create(&server, CANDIDATES, candidate("long-gone", "lock", "1.0.0", "1.0.0", 3600)).await;
    create(&server, CANDIDATES, candidate("live", "lock", "1.1.0", "1.1.0", 0)).await;
    create(&server, CANDIDATES, candidate("dead", "lock", "1.1.0", "1.1.0", 0)).await;
    eventually("the long gone candidate collected", || async {
        get(&server, CANDIDATES, "long-gone").await.is_none().then_some(())
    })
    .await;
    eventually("the dead candidate collected", || async {
        get(&server, CANDIDATES, "dead").await.is_none().then_some(())
    })
    .await;
    // Pinged before it would have been collected, it answered and stays.
    eventually("the live candidate asked and answering", || async {
        let live = get(&server, CANDIDATES, "live").await.expect("a candidate that answers its pings stays");
        let spec = &live["spec"];
        (spec["pingTime"].is_string() && time(&spec["renewTime"]) >= time(&spec["pingTime"])).then_some(())
    })
    .await;
    assert!(server.coordinator_metrics().candidates_collected >= 2);
}

#[tokio::test]
async fn lease_candidates_and_the_coordination_fields_of_leases_are_validated() {
    let server = server(config(CoordinatorConfig { enabled: false, ..CoordinatorConfig::default() })).await;
    let address = server.address();
    let causes = |status: &Value| -> Vec<String> {
        assert_eq!((&status["reason"], &status["code"]), (&json!("Invalid"), &json!(422)), "{status}");
        status["details"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["field"].as_str().unwrap().to_string())
            .collect()
    };

    let (code, status) = raw(address, "POST", CANDIDATES, &json!({"metadata": {"name": "c"}, "spec": {}})).await;
    assert_eq!(code, 422);
    assert_eq!(causes(&status), ["spec.leaseName", "spec.binaryVersion", "spec.strategy"]);
    assert_eq!(status["details"]["kind"], "LeaseCandidate");
    assert_eq!(status["details"]["group"], "coordination.k8s.io");
    assert!(
        status["message"].as_str().unwrap().starts_with("LeaseCandidate.coordination.k8s.io \"c\" is invalid: ["),
        "{status}"
    );

    let mut no_emulation = candidate("c", "lock", "1.30.0", "", 0);
    no_emulation["spec"].as_object_mut().unwrap().remove("emulationVersion");
    let (_, status) = raw(address, "POST", CANDIDATES, &no_emulation).await;
    assert_eq!(causes(&status), ["spec.emulationVersion"]);
    let (_, status) = raw(address, "POST", CANDIDATES, &candidate("c", "lock", "1.30.x", "1.30.0", 0)).await;
    assert_eq!(causes(&status), ["spec.binaryVersion"]);
    assert!(status["message"].as_str().unwrap().contains("must be a valid semantic version"), "{status}");
    let mut unknown = candidate("c", "lock", "1.30.0", "1.30.0", 0);
    unknown["spec"]["strategy"] = json!("NewestEmulationVersion");
    let (_, status) = raw(address, "POST", CANDIDATES, &unknown).await;
    assert_eq!(causes(&status), ["spec.strategy"]);
    assert_eq!(status["details"]["causes"][0]["reason"], "FieldValueNotSupported");
    let (code, status) =
        raw(address, "POST", CANDIDATES, &json!({"metadata": {"name": "c"}, "spec": {"renewTime": "soon"}})).await;
    assert_eq!(code, 400, "{status}");

    // Valid, then its Lease cannot change.
    let created = create(&server, CANDIDATES, candidate("Pod_A.1", "lock", "1.30.0", "1.30.0", 0)).await;
    let mut moved = created.clone();
    moved["spec"]["leaseName"] = json!("other");
    let (_, status) = raw(address, "PUT", &format!("{CANDIDATES}/Pod_A.1"), &moved).await;
    assert_eq!(causes(&status), ["spec.leaseName"]);

    let lease = |spec: Value| json!({"metadata": {"name": "l"}, "spec": spec});
    let (_, status) =
        raw(address, "POST", LEASES, &lease(json!({"holderIdentity": "a", "preferredHolder": "b"}))).await;
    assert_eq!(causes(&status), ["spec.preferredHolder"]);
    assert_eq!(status["details"]["causes"][0]["reason"], "FieldValueForbidden");
    let (_, status) = raw(address, "POST", LEASES, &lease(json!({"strategy": "Oldest", "preferredHolder": "b"}))).await;
    assert_eq!(causes(&status), ["spec.strategy"]);
    let (_, status) = raw(address, "POST", LEASES, &lease(json!({"strategy": "Example.com/x"}))).await;
    assert_eq!(causes(&status), ["spec.strategy"]);
    for strategy in ["OldestEmulationVersion", "example.com/custom"] {
        let (code, body) =
            raw(address, "PUT", &format!("{LEASES}/l"), &lease(json!({"strategy": strategy, "preferredHolder": "b"})))
                .await;
        assert!(code == 200 || code == 201, "{strategy}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_and_lists_lease_candidates_and_shows_the_elected_holder() {
    let server = server(config(quick())).await;
    let directory = std::env::temp_dir().join(format!("tenure-apiserver-cle-kubectl-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let kubeconfig = directory.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let run = |args: Vec<String>, stdin: Option<String>| {
        let path = kubeconfig.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl(&path, &args, stdin.as_deref())
        })
    };
    let args = |text: &str| text.split(' ').map(str::to_string).collect::<Vec<_>>();

    let manifest = format!(
        "apiVersion: coordination.k8s.io/v1beta1\nkind: LeaseCandidate\nmetadata:\n  name: scheduler-a\nspec:\n  leaseName: kube-scheduler\n  binaryVersion: 1.31.0\n  emulationVersion: 1.30.0\n  strategy: OldestEmulationVersion\n  renewTime: \"{}\"\n",
        micro_time(0)
    );
    let (ok, out) = run(args("apply -f -"), Some(manifest)).await.unwrap();
    assert!(ok && out.contains("leasecandidate.coordination.k8s.io/scheduler-a created"), "{out}");
    let (ok, out) = run(args("get leasecandidates"), None).await.unwrap();
    let header: Vec<&str> = out.lines().next().unwrap_or("").split_whitespace().collect();
    assert!(ok && header == ["NAME", "LEASENAME", "BINARYVERSION", "EMULATIONVERSION", "AGE"], "{out}");
    assert!(out.contains("scheduler-a") && out.contains("kube-scheduler") && out.contains("1.30.0"), "{out}");
    let (ok, out) = run(args("get leasecandidates -o wide"), None).await.unwrap();
    assert!(ok && out.contains("RENEWTIME") && out.contains("PINGTIME"), "{out}");
    let (ok, out) = run(args("api-resources --api-group=coordination.k8s.io"), None).await.unwrap();
    assert!(ok && out.contains("leasecandidates") && out.contains("coordination.k8s.io/v1beta1"), "{out}");

    // The only candidate is elected (pinged first if the machine is slow: nobody answers then, so
    // answer for it).
    let _answers = answer_pings(&server, &["scheduler-a"]);
    lease_where(&server, "kube-scheduler", "an election", |l| holder(l) == "scheduler-a").await;
    let (ok, out) = run(args("get lease kube-scheduler"), None).await.unwrap();
    assert!(ok && out.contains("scheduler-a"), "{out}");
    std::fs::remove_dir_all(&directory).ok();
}
