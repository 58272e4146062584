//! The API server as unmodified real clients see it: kube-rs for the protocol and semantics, kubectl
//! for discovery and printing. Every test starts its own server on a free loopback port.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::{PartialObjectMeta, Status};
use kube::{Api, Client, Config};
use serde_json::json;
use tenure_apiserver::{ApiServer, ApiServerConfig, FaultScope, InjectedFault, Verb, CLIENT_HEADER};

mod common;
use common::{kubectl, server};

const WAIT: Duration = Duration::from_secs(10);

/// A kube-rs client that names itself `name` to the server's request counts and faults.
fn client(server: &ApiServer, name: &str) -> Client {
    let mut config = Config::new(server.url().parse().expect("the server URL is a URI"));
    config.default_namespace = "default".into();
    config.read_timeout = Some(Duration::from_secs(2));
    // The server's answers as they are: no retry of a 429 or 503 inside the client.
    config.default_retry = false;
    config.headers.push((CLIENT_HEADER.parse().unwrap(), name.parse().unwrap()));
    Client::try_from(config).expect("a client")
}

/// One HTTP/1.1 request on its own connection: the status code and the body.
async fn raw(server: &ApiServer, method: &str, path: &str, body: &str) -> (u16, String) {
    common::raw(server.address(), method, path, body).await
}

fn lease(name: &str, holder: &str, duration: i32) -> Lease {
    Lease {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            ..Default::default()
        }),
    }
}

fn api_error(error: kube::Error) -> Status {
    match error {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test]
async fn writes_are_compare_and_swap_on_one_resource_version_sequence() {
    let server = server(ApiServerConfig::default()).await;
    let leases: Api<Lease> = Api::namespaced(client(&server, "t"), "kube-system");
    let created = leases.create(&PostParams::default(), &lease("lock", "a", 10)).await.unwrap();
    let first_version: u64 = created.metadata.resource_version.clone().unwrap().parse().unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));

    let duplicate = api_error(leases.create(&PostParams::default(), &lease("lock", "b", 10)).await.unwrap_err());
    assert_eq!((duplicate.code, duplicate.reason.as_str()), (409, "AlreadyExists"));

    let mut renewed = created.clone();
    renewed.spec.as_mut().unwrap().holder_identity = Some("a2".into());
    let replaced = leases.replace("lock", &PostParams::default(), &renewed).await.unwrap();
    let second_version: u64 = replaced.metadata.resource_version.clone().unwrap().parse().unwrap();
    assert!(second_version > first_version);
    assert_eq!(replaced.metadata.generation, Some(2));
    assert_eq!(replaced.metadata.uid, created.metadata.uid);

    // The same stale version again: the write lost the race.
    let stale = api_error(leases.replace("lock", &PostParams::default(), &renewed).await.unwrap_err());
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    assert!(stale.message.contains("the object has been modified"), "{}", stale.message);

    // One sequence across objects and types.
    let config_maps: Api<ConfigMap> = Api::namespaced(client(&server, "t"), "default");
    let map = config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: kube::api::ObjectMeta { name: Some("m".into()), ..Default::default() },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let third_version: u64 = map.metadata.resource_version.unwrap().parse().unwrap();
    assert_eq!(third_version, second_version + 1);

    // A PUT to a Lease that is gone: with the old uid a conflict, without one a create (as the
    // real registry does for types that allow create-on-update).
    leases.delete("lock", &DeleteParams::default()).await.unwrap();
    let gone = api_error(leases.replace("lock", &PostParams::default(), &replaced).await.unwrap_err());
    assert_eq!((gone.code, gone.reason.as_str()), (409, "Conflict"));
    let mut fresh = replaced.clone();
    fresh.metadata.uid = None;
    let recreated = leases.replace("lock", &PostParams::default(), &fresh).await.unwrap();
    assert_ne!(recreated.metadata.uid, replaced.metadata.uid);

    // A resourceVersion that is not a string is refused, not read as "none".
    let body = r#"{"metadata":{"name":"lock","resourceVersion":1},"spec":{"holderIdentity":"x"}}"#;
    let (code, answer) =
        raw(&server, "PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/lock", body).await;
    assert_eq!(code, 400, "{answer}");

    let missing = api_error(leases.get("nope").await.unwrap_err());
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert_eq!(missing.message, "leases.coordination.k8s.io \"nope\" not found");

    let invalid = api_error(leases.create(&PostParams::default(), &lease("bad", "a", 0)).await.unwrap_err());
    assert_eq!((invalid.code, invalid.reason.as_str()), (422, "Invalid"));
    assert!(invalid.message.contains("spec.leaseDurationSeconds"), "{}", invalid.message);

    let no_namespace: Api<Lease> = Api::namespaced(client(&server, "t"), "nowhere");
    let absent = api_error(no_namespace.create(&PostParams::default(), &lease("x", "a", 10)).await.unwrap_err());
    assert_eq!((absent.code, absent.message.as_str()), (404, "namespaces \"nowhere\" not found"));
}

#[tokio::test]
async fn patches_deletes_and_selectors_behave_as_kubernetes_does() {
    let server = server(ApiServerConfig::default()).await;
    let client = client(&server, "t");
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for (name, tier) in [("a", "front"), ("b", "back"), ("c", "front")] {
        let object = json!({"metadata": {"name": name, "labels": {"tier": tier}}, "data": {"k": "v"}});
        maps.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
    }
    let front = maps.list(&ListParams::default().labels("tier=front")).await.unwrap();
    let names: Vec<_> = front.items.iter().map(|m| m.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["a", "c"]);
    let one = maps.list(&ListParams::default().fields("metadata.name=b")).await.unwrap();
    assert_eq!(one.items.len(), 1);

    let merged =
        maps.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": null, "n": "1"}}))).await.unwrap();
    assert_eq!(merged.data.unwrap().into_iter().collect::<Vec<_>>(), [("n".to_string(), "1".to_string())]);
    let stale = json!({"metadata": {"resourceVersion": "1"}, "data": {"x": "y"}});
    let conflict = api_error(maps.patch("a", &PatchParams::default(), &Patch::Merge(stale)).await.unwrap_err());
    assert_eq!(conflict.code, 409);
    let version = maps.get("b").await.unwrap().metadata.resource_version.unwrap();
    let precondition = |version: String| DeleteParams {
        preconditions: Some(kube::api::Preconditions { resource_version: Some(version), uid: None }),
        ..DeleteParams::default()
    };
    let wrong = precondition("1".into());
    assert_eq!(api_error(maps.delete("b", &wrong).await.unwrap_err()).code, 409);
    let right = precondition(version);
    maps.delete("b", &right).await.unwrap();
    assert_eq!(api_error(maps.get("b").await.unwrap_err()).code, 404);

    // Deleting a namespace deletes what is in it.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "scratch"}})).unwrap())
        .await
        .unwrap();
    let scratch: Api<Endpoints> = Api::namespaced(client.clone(), "scratch");
    scratch
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "e"}})).unwrap())
        .await
        .unwrap();
    namespaces.delete("scratch", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_error(scratch.get("e").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn watches_filter_resume_bookmark_and_expire() {
    // A zero bookmark interval means no bookmarks, not a server that stops.
    let quiet = server(ApiServerConfig { bookmark_interval: Duration::ZERO, ..ApiServerConfig::default() }).await;
    let (code, _) = raw(&quiet, "GET", "/version", "").await;
    assert_eq!(code, 200);
    let server = server(ApiServerConfig {
        event_log_capacity: 4,
        bookmark_interval: Duration::from_millis(50),
        ..ApiServerConfig::default()
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(client(&server, "t"), "default");
    let first = leases.create(&PostParams::default(), &lease("watched", "a", 10)).await.unwrap();
    let start = first.metadata.resource_version.clone().unwrap();
    leases.create(&PostParams::default(), &lease("other", "a", 10)).await.unwrap();
    let mut renewed = first.clone();
    renewed.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases.replace("watched", &PostParams::default(), &renewed).await.unwrap();

    // Resumed from the first version, filtered to one name: only the change to it, then bookmarks.
    let params = WatchParams::default().fields("metadata.name=watched").timeout(5);
    let mut events = leases.watch(&params, &start).await.unwrap().boxed();
    let event = tokio::time::timeout(WAIT, events.try_next()).await.unwrap().unwrap().unwrap();
    let WatchEvent::Modified(modified) = event else { panic!("expected MODIFIED, got {event:?}") };
    assert_eq!(modified.spec.unwrap().holder_identity.as_deref(), Some("b"));
    let event = tokio::time::timeout(WAIT, events.try_next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(event, WatchEvent::Bookmark(_)), "expected a bookmark, got {event:?}");

    leases.delete("watched", &DeleteParams::default()).await.unwrap();
    let deleted = loop {
        match tokio::time::timeout(WAIT, events.try_next()).await.unwrap().unwrap().unwrap() {
            WatchEvent::Bookmark(_) => continue,
            other => break other,
        }
    };
    assert!(matches!(deleted, WatchEvent::Deleted(_)), "expected DELETED, got {deleted:?}");

    // Push the start out of the four-change log: the watch answers 410 Expired in the stream.
    for name in ["x1", "x2", "x3", "x4"] {
        leases.create(&PostParams::default(), &lease(name, "a", 10)).await.unwrap();
    }
    let mut expired = leases.watch(&WatchParams::default(), &start).await.unwrap().boxed();
    match tokio::time::timeout(WAIT, expired.try_next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Error(status) => assert_eq!((status.code, status.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Expired, got {other:?}"),
    }
}

#[tokio::test]
async fn metadata_only_clients_get_partial_object_metadata_from_get_list_watch_and_patch() {
    let server = server(ApiServerConfig::default()).await;
    let client = client(&server, "t");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let data = [("big".to_string(), "x".repeat(1000))].into_iter().collect();
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some("a".into()), ..Default::default() },
        data: Some(data),
        ..Default::default()
    };
    configmaps.create(&PostParams::default(), &cm).await.unwrap();
    // kube-rs's metadata requests (Accept: ...;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1).
    let metadata: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client, "default");

    let one = metadata.get("a").await.unwrap();
    assert_eq!(one.types.as_ref().map(|t| t.kind.as_str()), Some("PartialObjectMetadata"));
    assert_eq!(one.metadata.name.as_deref(), Some("a"));
    let list = metadata.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let (code, body) = raw(&server, "GET", "/api/v1/namespaces/default/configmaps", "").await;
    assert_eq!(code, 200);
    assert!(body.contains(&"x".repeat(1000)), "a plain list still carries the objects' data");

    let start = list.metadata.resource_version.clone().unwrap();
    let mut events = metadata.watch(&WatchParams::default().timeout(5), &start).await.unwrap().boxed();
    let patch = Patch::Merge(json!({"metadata": {"labels": {"k": "v"}}}));
    let patched = metadata.patch("a", &PatchParams::default(), &patch).await.unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["k"], "v");
    let event = tokio::time::timeout(WAIT, events.try_next()).await.unwrap().unwrap().unwrap();
    let WatchEvent::Modified(modified) = event else { panic!("expected MODIFIED, got {event:?}") };
    assert_eq!(modified.types.map(|t| t.kind), Some("PartialObjectMetadata".into()));
    assert_eq!(modified.metadata.labels.unwrap()["k"], "v");
    let stored = configmaps.get("a").await.unwrap();
    assert_eq!(stored.data.unwrap()["big"].len(), 1000, "a metadata patch leaves the data alone");
}

#[tokio::test]
async fn a_watch_ends_at_the_servers_cap_even_when_it_asked_for_longer() {
    let capped = ApiServerConfig { max_watch_duration: Some(Duration::from_millis(200)), ..ApiServerConfig::default() };
    let server = server(capped).await;
    let leases: Api<Lease> = Api::namespaced(client(&server, "t"), "default");
    leases.create(&PostParams::default(), &lease("l", "a", 10)).await.unwrap();
    let mut watch = leases.watch(&WatchParams::default().timeout(290), "0").await.unwrap().boxed();
    assert!(matches!(tokio::time::timeout(WAIT, watch.try_next()).await.unwrap(), Ok(Some(WatchEvent::Added(_)))));
    let ended = tokio::time::timeout(WAIT, async { while let Ok(Some(_)) = watch.try_next().await {} }).await;
    assert!(ended.is_ok(), "a watch asking for 290 s ends at the 200 ms cap");
}

#[tokio::test]
async fn faults_count_delay_fail_and_partition_per_client() {
    let server = server(ApiServerConfig::default()).await;
    let a: Api<Lease> = Api::namespaced(client(&server, "a"), "default");
    let b: Api<Lease> = Api::namespaced(client(&server, "b"), "default");
    a.create(&PostParams::default(), &lease("l", "a", 10)).await.unwrap();
    a.get("l").await.unwrap();
    b.get("l").await.unwrap();
    b.get("l").await.unwrap();
    assert_eq!(server.faults().request_count("a", Verb::Create), 1);
    assert_eq!(server.faults().request_count("a", Verb::Get), 1);
    assert_eq!(server.faults().request_count("b", Verb::Get), 2);

    server.faults().inject(
        FaultScope { client: Some("a".into()), verbs: vec![Verb::Get], times: Some(1) },
        InjectedFault::InternalError,
    );
    assert_eq!(api_error(a.get("l").await.unwrap_err()).code, 500);
    a.get("l").await.expect("a fault with times=1 clears itself");

    server.faults().inject(FaultScope::client("b"), InjectedFault::TooManyRequests { retry_after_seconds: 3 });
    assert_eq!(api_error(b.get("l").await.unwrap_err()).code, 429);
    a.get("l").await.expect("faults apply only to their client");
    server.faults().clear_errors();

    // A partitioned client's requests go unanswered (its client times out) and its watch is cut.
    let mut watch = b.watch(&WatchParams::default().timeout(30), "0").await.unwrap().boxed();
    assert!(matches!(tokio::time::timeout(WAIT, watch.try_next()).await.unwrap(), Ok(Some(WatchEvent::Added(_)))));
    server.faults().partition("b");
    let ended = tokio::time::timeout(WAIT, async { while let Ok(Some(_)) = watch.try_next().await {} }).await;
    assert!(ended.is_ok(), "the partition ends the watch");
    assert!(b.get("l").await.is_err(), "a partitioned client gets no answer");
    a.get("l").await.expect("other clients are served");
    server.faults().heal("b");
    b.get("l").await.expect("a healed client is served again");

    server.faults().set_client_latency("a", Duration::from_millis(300));
    let started = std::time::Instant::now();
    a.get("l").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_gets_describes_and_deletes() {
    let server = server(ApiServerConfig::default()).await;
    let directory = std::env::temp_dir().join(format!("tenure-apiserver-kubectl-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let kubeconfig = directory.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let path = kubeconfig.clone();
    let run = move |args: &'static [&'static str], stdin: Option<&'static str>| {
        let path = path.clone();
        tokio::task::spawn_blocking(move || kubectl(&path, args, stdin))
    };
    let lease = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: ctl\n  namespace: kube-system\nspec:\n  holderIdentity: pod-a\n  leaseDurationSeconds: 5\n";
    let (ok, out) = run(&["apply", "-f", "-"], Some(lease)).await.unwrap();
    assert!(ok && out.contains("created"), "{out}");
    let (ok, out) = run(&["apply", "-f", "-"], Some(lease)).await.unwrap();
    assert!(ok && out.contains("unchanged"), "{out}");
    let (ok, out) = run(&["get", "lease", "-n", "kube-system"], None).await.unwrap();
    assert!(ok && out.contains("HOLDER") && out.contains("pod-a"), "{out}");

    let endpoints = "apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: kuryr-controller\n  namespace: kube-system\n  annotations:\n    control-plane.alpha.kubernetes.io/leader: '{\"holderIdentity\":\"pod-a\",\"leaseDurationSeconds\":5,\"acquireTime\":\"2026-01-01T00:00:00Z\",\"renewTime\":\"2026-01-01T00:00:03Z\",\"leaderTransitions\":0}'\n";
    let (ok, out) = run(&["create", "-f", "-"], Some(endpoints)).await.unwrap();
    assert!(ok, "{out}");
    let (ok, out) = run(&["describe", "ep", "kuryr-controller", "-n", "kube-system"], None).await.unwrap();
    assert!(ok && out.contains("control-plane.alpha.kubernetes.io/leader") && out.contains("pod-a"), "{out}");
    let (ok, out) = run(&["api-resources"], None).await.unwrap();
    assert!(ok && out.contains("leases") && out.contains("endpoints"), "{out}");
    let (ok, out) = run(
        &[
            "patch",
            "lease",
            "ctl",
            "-n",
            "kube-system",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/holderIdentity","value":"pod-b"}]"#,
        ],
        None,
    )
    .await
    .unwrap();
    assert!(ok, "{out}");
    let (ok, out) = run(&["get", "lease", "ctl", "-n", "kube-system", "-o", "jsonpath={.spec.holderIdentity}"], None)
        .await
        .unwrap();
    assert!(ok && out == "pod-b", "{out}");
    let (ok, out) = run(&["delete", "lease", "ctl", "-n", "kube-system"], None).await.unwrap();
    assert!(ok && out.contains("deleted"), "{out}");
    let (ok, out) = run(&["get", "lease", "ctl", "-n", "kube-system"], None).await.unwrap();
    assert!(!ok && out.contains("NotFound"), "{out}");
    std::fs::remove_dir_all(&directory).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_fields_of_the_wrong_type_are_refused_on_every_write_path() {
    let server = server(ApiServerConfig::default()).await;
    let leases: Api<Lease> = Api::namespaced(client(&server, "t"), "default");
    leases.create(&PostParams::default(), &lease("typed", "pod-a", 5)).await.unwrap();
    let bad_spec = json!({"spec": {"leaseDurationSeconds": "abc"}});
    let error = api_error(leases.patch("typed", &PatchParams::default(), &Patch::Merge(&bad_spec)).await.unwrap_err());
    assert_eq!((error.code, error.reason.as_str()), (422, "Invalid"), "{}", error.message);
    let path = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let (code, body) = raw(&server, "POST", path, r#"{"metadata":{"name":"b"},"spec":{"leaseTransitions":"1"}}"#).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("LeaseSpec.spec.leaseTransitions of type int32"), "{body}");
    let (code, body) =
        raw(&server, "PUT", &format!("{path}/typed"), r#"{"metadata":{"name":"typed"},"spec":{"renewTime":"soon"}}"#)
            .await;
    assert_eq!(code, 400, "{body}");
    let stored = leases.get("typed").await.unwrap();
    assert_eq!(stored.spec.unwrap().lease_duration_seconds, Some(5), "nothing refused was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_keeps_the_holder_column_on_every_row() {
    use std::io::BufRead;
    let server = server(ApiServerConfig::default()).await;
    let directory = std::env::temp_dir().join(format!("tenure-apiserver-kubectl-watch-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let kubeconfig = directory.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let leases: Api<Lease> = Api::namespaced(client(&server, "t"), "default");
    leases.create(&PostParams::default(), &lease("watched", "pod-a", 5)).await.unwrap();

    let mut child = std::process::Command::new("kubectl")
        .args(["get", "lease", "watched", "-w"])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl is installed (scripts/test checks for it)");
    // kubectl's complaints, for the failure message.
    let complaints = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let stderr = child.stderr.take().unwrap();
    let sink = complaints.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    // kubectl is a large program that makes discovery requests before it prints: on a loaded
    // machine its first line can take a while, hence a generous bound (it answers in ~0.1 s).
    async fn next_line(
        lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
        complaints: &std::sync::Mutex<String>,
    ) -> String {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.recv()).await.ok().flatten();
        line.unwrap_or_else(|| panic!("kubectl printed no further line; its stderr: {}", complaints.lock().unwrap()))
    }
    let mut seen = Vec::new();
    let header = next_line(&mut lines, &complaints).await;
    assert!(header.contains("HOLDER"), "{header}");
    seen.push(next_line(&mut lines, &complaints).await);
    assert!(seen[0].contains("pod-a"), "{seen:?}");
    // kubectl prints the object it got, then watches from resourceVersion=0 and skips the first
    // ADDED event (the object it already printed). A change made before that watch is open would
    // be that skipped event, so change the holder only once kubectl watches, and again if the
    // first change raced the watch's opening.
    let watching = || {
        server
            .faults()
            .request_counts()
            .iter()
            .any(|((client, verb), n)| client.starts_with("kubectl") && *verb == Verb::Watch && *n > 0)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !watching() {
        assert!(tokio::time::Instant::now() < deadline, "kubectl never watched: {}", complaints.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut shown = false;
    for attempt in 0..3 {
        let holder = format!("pod-b{attempt}");
        let moved = json!({"spec": {"holderIdentity": holder}});
        leases.patch("watched", &PatchParams::default(), &Patch::Merge(&moved)).await.unwrap();
        while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(10), lines.recv()).await {
            let found = line.contains(&holder);
            seen.push(line);
            if found {
                shown = true;
                break;
            }
        }
        if shown {
            break;
        }
    }
    assert!(shown, "no row with the new holder: {seen:?}; kubectl's stderr: {}", complaints.lock().unwrap());
    child.kill().ok();
    child.wait().ok();
    std::fs::remove_dir_all(&directory).ok();
}

/// The options of this process's sockets whose local port is `port` and that do not listen: the
/// server side of the connections the in-process server accepted. `(fd, TCP_NODELAY set)`.
fn accepted_sockets(port: u16) -> Vec<(i32, bool)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let option = |level, name| {
            let mut value: libc::c_int = 0;
            let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `value` and `length` outlive the call; an fd that is not a socket fails.
            let result =
                unsafe { libc::getsockopt(fd, level, name, (&mut value as *mut libc::c_int).cast(), &mut length) };
            (result == 0).then_some(value)
        };
        let mut address: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `address` is large enough for an IPv4 address and `length` says so.
        let named = unsafe { libc::getsockname(fd, (&mut address as *mut libc::sockaddr_in).cast(), &mut length) };
        let is_server_side = named == 0
            && i32::from(address.sin_family) == libc::AF_INET
            && u16::from_be(address.sin_port) == port
            && option(libc::SOL_SOCKET, libc::SO_ACCEPTCONN) == Some(0);
        if is_server_side {
            found.push((fd, option(libc::IPPROTO_TCP, libc::TCP_NODELAY).is_some_and(|v| v != 0)));
        }
    }
    found
}

/// Without TCP_NODELAY a watch event written shortly after another waits for the client's
/// delayed ACK (up to 40 ms on Linux): Go, and so a real API server, sets it on every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_served_without_nagle_delays_as_a_real_api_server_does() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = server(ApiServerConfig::default()).await;
    let mut stream = tokio::net::TcpStream::connect(server.address()).await.unwrap();
    stream.write_all(b"GET /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200", "the server answered on the open connection");
    let accepted = accepted_sockets(server.address().port());
    assert!(!accepted.is_empty(), "the accepted connection is found");
    assert!(accepted.iter().all(|(_, nodelay)| *nodelay), "TCP_NODELAY on every accepted connection: {accepted:?}");
}
