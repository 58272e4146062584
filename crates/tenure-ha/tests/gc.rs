//! Orphan garbage collection, specified with a fake cloud, the memory lock and virtual time.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tenure::locks::memory::MemoryStore;
use tenure::{Elector, Tenure, Term};
use tenure_ha::gc::{ExternalResource, ExternalResources, GarbageCollector, GcBuilder};
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

/// External resources (think Neutron ports) with faults on command.
#[derive(Default)]
struct Cloud {
    resources: Mutex<Vec<ExternalResource>>,
    fail_list: AtomicBool,
    lists: AtomicU32,
    delete_takes: Mutex<Duration>,
    deleted: Mutex<Vec<(String, Term)>>,
}

impl Cloud {
    fn with(ids: &[&str]) -> Arc<Cloud> {
        let cloud = Cloud::default();
        *cloud.resources.lock().unwrap() = ids.iter().map(|id| ExternalResource::new(*id)).collect();
        Arc::new(cloud)
    }

    fn deleted(&self) -> Vec<String> {
        self.deleted.lock().unwrap().iter().map(|(id, _)| id.clone()).collect()
    }
}

struct Shared(Arc<Cloud>);

#[async_trait]
impl ExternalResources for Shared {
    async fn list(&self) -> Result<Vec<ExternalResource>, String> {
        self.0.lists.fetch_add(1, Ordering::SeqCst);
        if self.0.fail_list.load(Ordering::SeqCst) {
            return Err("cloud API answered 503".into());
        }
        Ok(self.0.resources.lock().unwrap().clone())
    }

    async fn delete(&self, id: &str, term: Term) -> Result<(), String> {
        let takes = *self.0.delete_takes.lock().unwrap();
        tokio::time::sleep(takes).await;
        self.0.resources.lock().unwrap().retain(|r| r.id != id);
        self.0.deleted.lock().unwrap().push((id.to_owned(), term));
        Ok(())
    }
}

/// The ids the controller's objects reference, changeable by the test.
#[derive(Clone, Default)]
struct References(Arc<Mutex<HashSet<String>>>);

impl References {
    fn set(&self, ids: &[&str]) {
        *self.0.lock().unwrap() = ids.iter().map(|id| (*id).to_owned()).collect();
    }
}

fn collector(cloud: &Arc<Cloud>, references: &References) -> GcBuilder {
    let references = references.clone();
    GarbageCollector::builder(Shared(cloud.clone()), move || references.0.lock().unwrap().clone())
        .grace(Duration::ZERO)
        .confirm_after(Duration::ZERO)
}

/// A memory lock and its leader "a", with its tenure.
async fn leader() -> (MemoryStore, Elector, Tenure) {
    let store = MemoryStore::new();
    let elector = Elector::builder("a", store.client("a")).seed(7).spawn().expect("valid config");
    let tenure = elector.acquired().await.expect("leads");
    (store, elector, tenure)
}

#[tokio::test(start_paused = true)]
async fn gc_never_deletes_a_resource_younger_than_grace() {
    let (_store, _elector, tenure) = leader().await;
    let cloud = Cloud::with(&["port-1"]);
    let gc = collector(&cloud, &References::default()).grace(Duration::from_secs(300)).build();
    let first_seen = Instant::now();
    let deleted_at = loop {
        let report = gc.pass(&tenure).await;
        if !report.deleted.is_empty() {
            break Instant::now();
        }
        assert_eq!(report.pending, 1);
        tokio::time::sleep(Duration::from_secs(10)).await;
    };
    assert_eq!(deleted_at - first_seen, Duration::from_secs(300));
    assert_eq!(cloud.deleted(), ["port-1"]);
}

#[tokio::test(start_paused = true)]
async fn a_remote_creation_time_can_only_delay_deletion() {
    let (_store, _elector, tenure) = leader().await;
    let cloud = Cloud::with(&[]);
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    *cloud.resources.lock().unwrap() = vec![
        // Created a second ago by its own clock (virtual time does not move the wall clock).
        ExternalResource { id: "fresh".into(), created: Some(SystemTime::now()), owner: None },
        // An hour old by the cloud's clock: still watched for the grace period on ours.
        ExternalResource { id: "old".into(), created: Some(hour_ago), owner: None },
    ];
    let gc = collector(&cloud, &References::default()).grace(Duration::from_secs(60)).build();
    assert!(gc.pass(&tenure).await.deleted.is_empty());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(gc.pass(&tenure).await.deleted, ["old"]);
    assert_eq!(cloud.deleted(), ["old"]);
}

#[tokio::test(start_paused = true)]
async fn gc_deletes_only_after_two_unreferenced_passes() {
    let (_store, _elector, tenure) = leader().await;
    let cloud = Cloud::with(&["port-1", "port-2", "port-3"]);
    let references = References::default();
    references.set(&["port-3"]);
    let gc = collector(&cloud, &references).confirm_after(Duration::from_secs(60)).build();

    let first = gc.pass(&tenure).await;
    assert_eq!((first.pending, first.deleted.len()), (2, 0)); // one sighting is not enough
    tokio::time::sleep(Duration::from_secs(30)).await;
    references.set(&["port-2", "port-3"]); // port-2 is in use after all: it starts over
    let second = gc.pass(&tenure).await;
    assert_eq!((second.pending, second.deleted.len()), (1, 0)); // port-1: passes too close together
    tokio::time::sleep(Duration::from_secs(30)).await;
    references.set(&["port-3"]);
    assert_eq!(gc.pass(&tenure).await.deleted, ["port-1"]);
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert!(gc.pass(&tenure).await.deleted.is_empty());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(gc.pass(&tenure).await.deleted, ["port-2"]);
    assert_eq!(cloud.deleted(), ["port-1", "port-2"]); // never the referenced port-3
    assert_eq!(gc.metrics().orphans_deleted.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn gc_stops_deleting_when_the_tenure_ends() {
    let (store, elector, tenure) = leader().await;
    let cloud = Cloud::with(&["port-1", "port-2", "port-3"]);
    *cloud.delete_takes.lock().unwrap() = Duration::from_secs(6);
    let gc = collector(&cloud, &References::default()).build();
    gc.pass(&tenure).await; // first sighting
    let valid_until = elector.valid_until().expect("leads");
    store.set_delay("a", Duration::from_secs(3600)); // renews hang: the tenure ends at its deadline
    let pass_started = Instant::now();
    let report = gc.pass(&tenure).await;
    // Deletions take 6 s each: two start before the deadline, the third would start after it.
    let deadline = valid_until - pass_started;
    assert!(deadline > Duration::from_secs(6) && deadline <= Duration::from_secs(12), "{deadline:?}");
    assert_eq!(report.deleted, ["port-1", "port-2"]);
    assert!(report.stopped_by_tenure_end);
    assert_eq!(*cloud.deleted.lock().unwrap(), [("port-1".to_owned(), Term(1)), ("port-2".to_owned(), Term(1))]);
    assert!(gc.pass(&tenure).await.skipped.is_some(), "no pass while not leading");
    assert_eq!(cloud.deleted().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn gc_skips_a_pass_whose_lister_fails_and_deletes_nothing() {
    let (_store, _elector, tenure) = leader().await;
    let cloud = Cloud::with(&["port-1"]);
    let gc = collector(&cloud, &References::default()).build();
    gc.pass(&tenure).await;
    cloud.fail_list.store(true, Ordering::SeqCst);
    let report = gc.pass(&tenure).await;
    assert_eq!(report.skipped.as_deref(), Some("listing failed: cloud API answered 503"));
    assert!(cloud.deleted().is_empty());
    assert_eq!(gc.metrics().skipped_passes.get(), 1);
    cloud.fail_list.store(false, Ordering::SeqCst);
    assert_eq!(gc.pass(&tenure).await.deleted, ["port-1"]); // the sighting before the failure counts
}

#[tokio::test(start_paused = true)]
async fn gc_in_dry_run_reports_orphans_and_deletes_nothing() {
    let (_store, _elector, tenure) = leader().await;
    let cloud = Cloud::with(&["port-1"]);
    let gc = collector(&cloud, &References::default()).dry_run(true).build();
    gc.pass(&tenure).await;
    let report = gc.pass(&tenure).await;
    assert_eq!((report.orphans.clone(), report.would_delete.clone()), (vec!["port-1".into()], vec!["port-1".into()]));
    assert!(report.deleted.is_empty() && cloud.deleted().is_empty());
    assert_eq!(gc.metrics().orphans_found.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn gc_deletes_at_most_the_limit_per_pass() {
    let (_store, _elector, tenure) = leader().await;
    let cloud = Cloud::with(&["p1", "p2", "p3", "p4", "p5"]);
    let gc = collector(&cloud, &References::default()).max_deletions_per_pass(2).build();
    gc.pass(&tenure).await;
    let report = gc.pass(&tenure).await;
    assert_eq!((report.deleted.len(), report.deferred), (2, 3));
    assert_eq!(gc.pass(&tenure).await.deleted.len(), 2);
    assert_eq!(gc.pass(&tenure).await.deleted.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn gc_leaves_untagged_and_foreign_resources_alone() {
    let (_store, _elector, tenure) = leader().await;
    let cloud = Cloud::with(&[]);
    let tagged = |id: &str, owner: Option<&str>| ExternalResource {
        id: id.into(),
        created: None,
        owner: owner.map(str::to_owned),
    };
    *cloud.resources.lock().unwrap() =
        vec![tagged("ours", Some("cluster-a")), tagged("theirs", Some("cluster-b")), tagged("untagged", None)];
    let gc = collector(&cloud, &References::default()).owner("cluster-a").build();
    gc.pass(&tenure).await;
    assert_eq!(gc.pass(&tenure).await.deleted, ["ours"]);
    assert_eq!(cloud.deleted(), ["ours"]);
}

#[tokio::test(start_paused = true)]
async fn gc_runs_a_pass_at_once_when_asked_after_a_relist() {
    let (_store, _elector, tenure) = leader().await;
    let cloud = Cloud::with(&["port-1"]);
    let gc = collector(&cloud, &References::default()).build();
    let trigger = gc.trigger();
    let cancel = CancellationToken::new();
    let runner = {
        let (gc, cancel, tenure) = (gc.clone(), cancel.clone(), tenure.clone());
        tokio::spawn(async move { gc.run(&tenure, &cancel, Duration::from_secs(3600)).await })
    };
    let wait_for_lists = |n: u32| {
        let cloud = cloud.clone();
        async move {
            timeout(Duration::from_secs(1), async {
                while cloud.lists.load(Ordering::SeqCst) < n {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await
            .is_ok()
        }
    };
    assert!(wait_for_lists(1).await, "a pass when the collector starts");
    let asked_at = Instant::now();
    trigger.run_now();
    assert!(wait_for_lists(2).await, "a pass at once when asked, not after the hour");
    assert!(Instant::now() - asked_at < Duration::from_millis(5));
    assert_eq!(cloud.deleted(), ["port-1"]);
    cancel.cancel();
    timeout(Duration::from_secs(1), runner).await.expect("stops when cancelled").expect("no panic");
}
