//! Term-fenced compare-and-swap against the project's API server: once a term has written an
//! object, a lower term's write never lands on it.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use tenure::Term;
use tenure_kube::term_fenced::{self, TermFenceError, TERM_ANNOTATION};
use tenure_testkit::kube::Cluster;

fn allocations(ip: &str) -> impl FnMut(&mut ConfigMap) + '_ {
    move |object| {
        object.data.get_or_insert_with(Default::default).insert("10.0.0.1".to_owned(), ip.to_owned());
    }
}

fn data(object: &ConfigMap) -> Option<&str> {
    object.data.as_ref()?.get("10.0.0.1").map(String::as_str)
}

#[tokio::test]
async fn a_lower_term_never_writes_over_a_higher_one() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(cluster.client("controller").await);
    let empty = ConfigMap { metadata: ObjectMeta { name: Some("ipam".to_owned()), ..ObjectMeta::default() }, ..ConfigMap::default() };
    api.create(&PostParams::default(), &empty).await.unwrap();

    // Term 3 writes (the object had no term); the same term may write again.
    let written = term_fenced::update(&api, "ipam", Term(3), allocations("pod-a")).await.unwrap();
    assert_eq!(written.metadata.annotations.unwrap()[TERM_ANNOTATION], "3");
    term_fenced::update(&api, "ipam", Term(3), allocations("pod-b")).await.unwrap();
    // The next leader, term 4, writes; the deposed term 3's late write is refused by the server's
    // compare-and-swap on what it read, and the object keeps term 4's content.
    term_fenced::update(&api, "ipam", Term(4), allocations("pod-c")).await.unwrap();
    let late = term_fenced::update(&api, "ipam", Term(3), allocations("stale")).await.unwrap_err();
    assert!(matches!(late, TermFenceError::Deposed { ours: Term(3), shows: Term(4), .. }), "{late}");
    assert!(late.to_string().starts_with("deposed: "), "{late}");
    let stored = api.get("ipam").await.unwrap();
    assert_eq!((data(&stored), term_fenced::term_of(&stored)), (Some("pod-c"), Ok(Some(Term(4)))));
}

/// The read and the write are one compare-and-swap: a deposed writer that read the object before
/// the next leader wrote it cannot land its write over it (the server answers 409, the writer
/// reads again and finds the higher term).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_prepared_before_the_next_leader_wrote_is_refused() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(cluster.client("controller").await);
    let empty = ConfigMap { metadata: ObjectMeta { name: Some("ipam".to_owned()), ..ObjectMeta::default() }, ..ConfigMap::default() };
    api.create(&PostParams::default(), &empty).await.unwrap();
    term_fenced::update(&api, "ipam", Term(1), allocations("pod-a")).await.unwrap();
    let mut next_leader_wrote = false;
    let late = term_fenced::update(&api, "ipam", Term(1), |object| {
        // Between the deposed writer's read and its write, the next leader writes.
        if !std::mem::replace(&mut next_leader_wrote, true) {
            let next = term_fenced::update(&api, "ipam", Term(2), allocations("pod-b"));
            tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(next)).unwrap();
        }
        allocations("stale")(object);
    })
    .await
    .unwrap_err();
    assert!(matches!(late, TermFenceError::Deposed { ours: Term(1), shows: Term(2), .. }), "{late}");
    assert_eq!(data(&api.get("ipam").await.unwrap()), Some("pod-b"));
}

#[tokio::test]
async fn a_malformed_term_is_a_clear_error_and_nothing_is_written() {
    let cluster = Cluster::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(cluster.client("controller").await);
    let mut object = ConfigMap { metadata: ObjectMeta { name: Some("ipam".to_owned()), ..ObjectMeta::default() }, ..ConfigMap::default() };
    object.metadata.annotations = Some([(TERM_ANNOTATION.to_owned(), "seven".to_owned())].into());
    api.create(&PostParams::default(), &object).await.unwrap();
    let error = term_fenced::update(&api, "ipam", Term(9), allocations("pod-a")).await.unwrap_err();
    assert!(matches!(&error, TermFenceError::Malformed { value, .. } if value == "seven"), "{error}");
    assert_eq!(data(&api.get("ipam").await.unwrap()), None);
}
