//! The write gate against the project's API server: what leaves the process is counted by the
//! server per client (the gated writer has a client, and so a user agent, of its own; the
//! elector's lock and the group's store have theirs, ungated), so "no write was sent" is the
//! server's word, not the client's.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;
use prometheus_client::registry::Registry;
use serde_json::json;
use tenure::Elector;
use tenure_apiserver::faults::{FaultScope, InjectedFault};
use tenure_apiserver::Verb;
use tenure_group::{conformance, Group, GroupConfig};
use tenure_kube::write_gate::object_key;
use tenure_kube::{user_agent, KubeGroupStore, RefusalReason, WriteGate, WriteGateMetrics, WriteRefused};
use tenure_testkit::kube::{Cluster, PATIENCE};

const WRITES: [Verb; 4] = [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete];

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        data: Some([("k".to_owned(), "v".to_owned())].into()),
        ..ConfigMap::default()
    }
}

/// Waits until `condition` holds, failing the test after [`PATIENCE`].
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Writes `identity` sent that reached the server, of every kind.
fn writes_of(cluster: &Cluster, identity: &str) -> u64 {
    WRITES.iter().map(|verb| cluster.requests(identity, *verb)).sum()
}

/// Why a write of a gated client failed; panics if it was not the gate.
fn refusal<T: std::fmt::Debug>(outcome: Result<T, kube::Error>) -> RefusalReason {
    let error = outcome.expect_err("the gate refuses the write");
    WriteRefused::find(&error).unwrap_or_else(|| panic!("not refused by the gate: {error}")).reason
}

/// One write of each kind, `round` choosing which.
async fn write(configmaps: &Api<ConfigMap>, round: usize, name: &str) -> Result<(), kube::Error> {
    match round % 4 {
        0 => configmaps.create(&PostParams::default(), &configmap(name)).await.map(drop),
        1 => configmaps.replace(name, &PostParams::default(), &configmap(name)).await.map(drop),
        2 => {
            let patch = Patch::Merge(json!({"data": {"round": round.to_string()}}));
            configmaps.patch(name, &PatchParams::default(), &patch).await.map(drop)
        }
        _ => configmaps.delete(name, &DeleteParams::default()).await.map(drop),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_sends_no_write_and_its_write_in_flight_is_cancelled() {
    let cluster = Cluster::start().await;
    let elector = Elector::builder("leader-a", cluster.lock("leases", "gated", "leader-a").await)
        .timing(tenure_testkit::kube::timing())
        .spawn()
        .unwrap();
    let mut registry = Registry::default();
    let metrics = WriteGateMetrics::register(&mut registry);
    let writer = "writer-a";
    let gated = WriteGate::leader(&elector).with_metrics(metrics.clone()).client(cluster.client(writer).await);
    let configmaps: Api<ConfigMap> = Api::default_namespaced(gated);
    tokio::time::timeout(PATIENCE, elector.acquired()).await.expect("leader-a leads").unwrap();

    // Leading: every kind of write goes through.
    for round in 0..4 {
        write(&configmaps, round, "cm-0").await.unwrap_or_else(|e| panic!("round {round} while leading: {e}"));
    }
    assert_eq!(writes_of(&cluster, writer), 4);

    // A write in flight: the server holds the writer's next create without answering.
    let faults = cluster.server.faults();
    let scope = FaultScope { client: Some(user_agent(writer)), verbs: vec![Verb::Create], times: Some(1) };
    faults.inject(scope, InjectedFault::Hang);
    let in_flight = {
        let configmaps = configmaps.clone();
        tokio::spawn(async move { configmaps.create(&PostParams::default(), &configmap("held")).await })
    };
    until("the held create reached the server", || cluster.requests(writer, Verb::Create) == 2).await;

    // Deposed: the elector's own client is cut off from the server; it fences itself at its
    // renew deadline, and the write in flight is dropped then.
    faults.partition(&user_agent("leader-a"));
    let outcome = tokio::time::timeout(PATIENCE, in_flight).await.expect("the held create ends").unwrap();
    assert_eq!(refusal(outcome), RefusalReason::Cancelled);
    assert_eq!(elector.is_leader(), None);
    assert_eq!(metrics.rejections_for(RefusalReason::Cancelled), 1);

    // Not leading: N writes of every kind, none of which reaches the server.
    let sent = writes_of(&cluster, writer);
    const N: usize = 40;
    for round in 0..N {
        assert_eq!(refusal(write(&configmaps, round, "cm-0").await), RefusalReason::NotLeader, "round {round}");
    }
    assert_eq!(writes_of(&cluster, writer), sent, "a write reached the server while not leading");
    assert_eq!(metrics.rejections_for(RefusalReason::NotLeader), N as u64);
    // Reads still go through.
    let gets = cluster.requests(writer, Verb::Get);
    configmaps.get("cm-0").await.expect_err("cm-0 was deleted in round 3");
    assert_eq!(cluster.requests(writer, Verb::Get), gets + 1);

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains(&format!("tenure_write_gate_rejections_total{{reason=\"not_leader\"}} {N}")), "{text}");
    assert!(text.contains("tenure_write_gate_rejections_total{reason=\"cancelled\"} 1"), "{text}");

    // Back in touch: leading again under a new term, the gate lets writes through again.
    faults.heal(&user_agent("leader-a"));
    tokio::time::timeout(PATIENCE, elector.acquired()).await.expect("leader-a leads again").unwrap();
    write(&configmaps, 0, "cm-1").await.expect("written after leading again");
    assert_eq!(writes_of(&cluster, writer), sent + 1);
    elector.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_sends_writes_only_for_objects_whose_partition_it_owns() {
    let cluster = Cluster::start().await;
    let config = GroupConfig { timing: conformance::timing(), partition_count: 16, weight: 1 };
    let mut members = Vec::new();
    for identity in ["member-a", "member-b"] {
        // The group's records are written with a client of its own, never gated.
        let store = KubeGroupStore::new(cluster.client(identity).await, "default", "writers");
        members.push(Group::builder(identity, store).config(config).join().unwrap());
    }
    let (a, b) = (&members[0], &members[1]);
    until("the members share the partitions", || {
        a.assignment().borrow().owned.len() == 8 && b.assignment().borrow().owned.len() == 8
    })
    .await;
    let owned_by = |group: &Group, count: usize| -> Vec<String> {
        (0..1000)
            .map(|i| format!("cm-{i}"))
            .filter(|name| group.belongs_to_self(&object_key(Some("default"), name)).is_some())
            .take(count)
            .collect()
    };
    let (mine, theirs) = (owned_by(a, 4), owned_by(b, 4));
    for name in &theirs {
        cluster.create("configmaps", json!({"metadata": {"name": name}}));
    }

    let writer = "writer-a";
    let gate = WriteGate::owner(a.ownership());
    let configmaps: Api<ConfigMap> = Api::default_namespaced(gate.client(cluster.client(writer).await));
    // member-b's objects: refused before they leave, whatever the kind of write.
    for (round, name) in theirs.iter().enumerate() {
        for kind in 0..4 {
            assert_eq!(refusal(write(&configmaps, round * 4 + kind, name).await), RefusalReason::NotOwner, "{name}");
        }
        let status = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
        let outcome = configmaps.patch_status(name, &PatchParams::default(), &status).await;
        assert_eq!(refusal(outcome), RefusalReason::NotOwner, "{name}/status");
    }
    assert_eq!(writes_of(&cluster, writer), 0, "a write of another member's object reached the server");
    assert_eq!(gate.metrics().rejections_for(RefusalReason::NotOwner), 4 * 5);

    // Its own: created (the name read from the body), patched and deleted.
    for (round, name) in mine.iter().enumerate() {
        for kind in [0, 2, 3] {
            write(&configmaps, round * 4 + kind, name).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    assert_eq!(cluster.requests(writer, Verb::Create), 4);
    assert_eq!(writes_of(&cluster, writer), 12);
    // Another member's objects were not touched; member-b's own gated client writes them.
    let b_configmaps: Api<ConfigMap> =
        Api::default_namespaced(WriteGate::owner(b.ownership()).client(cluster.client("writer-b").await));
    for (round, name) in theirs.iter().enumerate() {
        assert!(cluster.object("configmaps", name).is_some(), "{name} is still there");
        write(&b_configmaps, 2 + round * 4, name).await.expect("member-b owns it");
    }
    assert_eq!(writes_of(&cluster, "writer-b"), 4);
    for group in members {
        group.leave().await.unwrap();
    }
}
