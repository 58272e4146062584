//! Fenced checkpoints (invariant C1), specified with the memory lock and virtual time, and the
//! file store on a real file system.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure::locks::memory::MemoryStore;
use tenure::{Elector, Role, Term};
use tenure_ha::checkpoint::file::FileCheckpointStore;
use tenure_ha::checkpoint::memory::MemoryCheckpointStore;
use tenure_ha::checkpoint::{encode, Checkpoint, CheckpointError, CheckpointStore, Checkpointer, StoredCheckpoint};
use tenure_ha::gate::Gate;
use tokio::sync::{mpsc, watch};
use tokio::time::timeout;

const PERIOD: Duration = Duration::from_secs(2);

fn spawn(store: &MemoryStore, id: &str) -> Elector {
    Elector::builder(id, store.client(id)).seed(7).spawn().expect("valid config")
}

async fn leads(elector: &Elector) {
    timeout(Duration::from_secs(600), elector.subscribe().wait_for(|l| l.role == Role::Leader))
        .await
        .expect("leads within 600 s of virtual time")
        .expect("elector running");
}

fn holder(store: &MemoryStore) -> String {
    store.peek().and_then(|s| s.record.ok()).map(|r| r.holder_identity).unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_resumes_where_the_old_leader_stopped() {
    let lock = MemoryStore::new();
    let checkpoints = Arc::new(MemoryCheckpointStore::new("pods-controller"));
    let (resumed_tx, mut resumed) = mpsc::unbounded_channel();
    let work = {
        let checkpoints = checkpoints.clone();
        move |ctx: tenure_ha::LeaderContext| {
            let (checkpoints, resumed_tx) = (checkpoints.clone(), resumed_tx.clone());
            async move {
                let checkpointer = Checkpointer::resume_for(checkpoints, &ctx).await?;
                let _ =
                    resumed_tx.send((ctx.term(), checkpointer.resumed_from(), checkpointer.resource_version("pods")));
                checkpointer.record("pods", format!("{}0", ctx.term()));
                ctx.cancelled().await;
                Ok::<_, CheckpointError>(())
            }
        }
    };
    let a = spawn(&lock, "a");
    let _gate_a = Gate::builder(&a).spawn(work.clone());
    assert_eq!(resumed.recv().await, Some((Term(1), None, None)));
    let b = spawn(&lock, "b");
    let _gate_b = Gate::builder(&b).spawn(work);
    a.resign().await.expect("resigned");
    // b resumes from what a recorded, with no flush period in between: a's last write on stopping.
    assert_eq!(resumed.recv().await, Some((Term(2), Some(Term(1)), Some("10".to_owned()))));
}

#[tokio::test(start_paused = true)]
async fn a_paused_old_leader_cannot_move_the_checkpoint_back() {
    let lock = MemoryStore::new();
    let checkpoints = Arc::new(MemoryCheckpointStore::new("pods-controller"));
    let a = spawn(&lock, "a");
    let tenure_a = a.acquired().await.expect("a leads");
    // A flush period longer than the test: what `a` records after its explicit flush stays in memory.
    let old = Checkpointer::resume(checkpoints.clone(), &tenure_a, PERIOD * 1000).await.expect("resumed");
    old.record("pods", "10");
    old.flush().await.expect("written under term 1");
    old.record("pods", "15");

    // `a` stops answering (a long GC pause, SIGSTOP): `b` takes over with term 2 and moves on.
    let b = spawn(&lock, "b");
    lock.partition("a", true);
    leads(&b).await;
    let tenure_b = b.acquired().await.expect("b leads");
    let new = Checkpointer::resume(checkpoints.clone(), &tenure_b, PERIOD).await.expect("resumed");
    assert_eq!(new.resource_version("pods").as_deref(), Some("10"));
    new.record("pods", "20");
    new.flush().await.expect("written under term 2");

    // `a` resumes: what it records now is ignored, its tenure is over (C2) ...
    old.record("pods", "16");
    assert_eq!(old.resource_version("pods").as_deref(), Some("15"));
    // ... and what it had in memory from before is rejected by the store (C1); it stops writing.
    let rejected = old.flush().await;
    assert!(
        matches!(rejected, Err(CheckpointError::Superseded { ours: Term(1), newer: Some(Term(2)) })),
        "{rejected:?}"
    );
    assert!(old.is_superseded());
    drop(old); // its last write on stopping is rejected too
    tokio::time::sleep(PERIOD * 3).await;
    let stored = checkpoints.peek().expect("a checkpoint");
    assert_eq!((stored.term, stored.checkpoint.resource_version("pods")), (Term(2), Some("20")));
}

#[tokio::test(start_paused = true)]
async fn checkpoints_cost_at_most_one_write_per_period() {
    let lock = MemoryStore::new();
    let checkpoints = Arc::new(MemoryCheckpointStore::new("pods-controller"));
    let a = spawn(&lock, "a");
    let tenure = a.acquired().await.expect("leads");
    let checkpointer = Checkpointer::resume(checkpoints.clone(), &tenure, PERIOD).await.expect("resumed");
    assert_eq!(checkpoints.writes(), 1); // the claim: older terms are fenced from now on
    for event in 1..=2000u32 {
        tokio::time::sleep(Duration::from_millis(10)).await; // 100 events a second for 20 s
        checkpointer.record("pods", event.to_string());
    }
    // 20 s of events in periods of 2 s: at most 10 writes (the last tick may fall just after).
    let periodic = checkpoints.writes() - 1;
    assert!((9..=10).contains(&periodic), "{periodic} writes");
    drop(checkpointer);
    timeout(PERIOD, async {
        while checkpoints.peek().and_then(|s| s.checkpoint.resource_version("pods").map(str::to_owned))
            != Some("2000".into())
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the last event is written when the work stops");
    assert_eq!(checkpoints.writes(), 1 + periodic + 1);
}

/// A store that logs who holds the election lock at each save.
struct Recording {
    inner: MemoryCheckpointStore,
    lock: MemoryStore,
    saves: watch::Sender<Vec<(String, String)>>,
}

#[async_trait]
impl CheckpointStore for Recording {
    async fn load(&self) -> Result<Option<StoredCheckpoint>, CheckpointError> {
        self.inner.load().await
    }
    async fn save(&self, term: Term, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let rv = checkpoint.resource_version("pods").unwrap_or_default().to_owned();
        self.saves.send_modify(|saves| saves.push((rv, holder(&self.lock))));
        self.inner.save(term, checkpoint).await
    }
    fn controller(&self) -> &str {
        self.inner.controller()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[tokio::test(start_paused = true)]
async fn the_last_checkpoint_is_written_before_the_lock_is_released() {
    let lock = MemoryStore::new();
    let saves = watch::channel(Vec::new()).0;
    let store = Arc::new(Recording {
        inner: MemoryCheckpointStore::new("pods-controller"),
        lock: lock.clone(),
        saves: saves.clone(),
    });
    let a = spawn(&lock, "a");
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let _gate = Gate::builder(&a).spawn(move |ctx| {
        let (store, started_tx) = (store.clone(), started_tx.clone());
        async move {
            // A flush period longer than the test: only the last write on stopping writes "42".
            let checkpointer = Checkpointer::resume(store, ctx.tenure(), PERIOD * 1000).await?;
            checkpointer.record("pods", "42"); // the last event, handled before the step-down
            let _ = started_tx.send(());
            ctx.cancelled().await;
            Ok::<_, CheckpointError>(())
        }
    });
    started.recv().await.expect("work started");
    a.resign().await.expect("resigned");
    let saves = saves.borrow().clone();
    assert_eq!(saves.last(), Some(&("42".to_owned(), "a".to_owned())), "{saves:?}");
    assert_eq!(holder(&lock), "");
}

#[tokio::test(start_paused = true)]
async fn an_unusable_checkpoint_is_treated_as_absent_and_the_controller_relists() {
    let lock = MemoryStore::new();
    let a = spawn(&lock, "a");
    let tenure = a.acquired().await.expect("leads");
    let newer_format = br#"{"term":0,"formatVersion":99,"controller":"pods-controller"}"#.to_vec();
    let foreign = encode(Term(0), &Checkpoint::new("another-controller"));
    for document in [b"{\"truncated".to_vec(), newer_format, foreign] {
        let store = MemoryCheckpointStore::new("pods-controller");
        store.put_raw(document);
        let checkpointer = Checkpointer::resume(Arc::new(store.clone()), &tenure, PERIOD).await.expect("resumed");
        assert_eq!(checkpointer.resumed_from(), None);
        assert_eq!(checkpointer.resource_version("pods"), None);
        assert_eq!(store.peek().map(|s| s.term), Some(Term(1)), "the claim replaced the unusable document");
    }
}

fn temp_path(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    std::env::temp_dir().join(format!("tenure-ha-test-{}-{nanos}", std::process::id())).join(name)
}

#[tokio::test]
async fn the_file_store_rejects_an_older_term_from_another_handle() -> Result<(), Infallible> {
    let path = temp_path("checkpoint.json");
    let new_leader = FileCheckpointStore::open(&path, "pods-controller");
    let old_leader = FileCheckpointStore::open(&path, "pods-controller");
    assert_eq!(new_leader.load().await.expect("readable"), None);
    let mut checkpoint = Checkpoint::new("pods-controller");
    checkpoint.resource_versions.insert("pods".into(), "20".into());
    new_leader.save(Term(2), &checkpoint).await.expect("saved");
    checkpoint.resource_versions.insert("pods".into(), "15".into());
    let rejected = old_leader.save(Term(1), &checkpoint).await;
    assert!(matches!(rejected, Err(CheckpointError::Superseded { ours: Term(1), newer: Some(Term(2)) })));
    let stored = old_leader.load().await.expect("readable").expect("present");
    assert_eq!((stored.term, stored.checkpoint.resource_version("pods")), (Term(2), Some("20")));
    // The same term may write again; a corrupt file reads as absent and does not fence anyone.
    new_leader.save(Term(2), &checkpoint).await.expect("saved again");
    std::fs::write(&path, b"\0garbage").expect("corrupt it");
    assert_eq!(new_leader.load().await.expect("readable"), None);
    old_leader.save(Term(1), &checkpoint).await.expect("a corrupt document fences nobody");
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}

/// A path-only file store has no flock: a replica stopped (SIGSTOP, a frozen VM) in the middle of
/// its save keeps no other replica from saving, and its save never lands after theirs.
#[tokio::test]
async fn a_save_stopped_in_the_middle_blocks_nobody_and_never_lands() {
    let path = temp_path("checkpoint.json");
    let store = FileCheckpointStore::open(&path, "pods-controller");
    let mut checkpoint = Checkpoint::new("pods-controller");
    checkpoint.resource_versions.insert("pods".into(), "20".into());
    store.save(Term(1), &checkpoint).await.expect("saved");
    // What the stopped replica left: its document, claimed as the file's next generation.
    let dir = path.parent().expect("a directory");
    let stopped = dir.join(format!(".checkpoint.json.tmp.{}.999999999", std::process::id()));
    std::fs::write(&stopped, br#"{"generation":2,"term":1,"controller":"pods-controller"}"#).expect("written");
    std::fs::hard_link(&stopped, dir.join(".checkpoint.json.claim.2")).expect("claimed");

    checkpoint.resource_versions.insert("pods".into(), "30".into());
    store.save(Term(2), &checkpoint).await.expect("saved past the stopped replica");
    assert!(std::fs::rename(&stopped, &path).is_err(), "the stopped save landed");
    let stored = store.load().await.expect("readable").expect("present");
    assert_eq!((stored.term, stored.checkpoint.resource_version("pods")), (Term(2), Some("30")));
    let _ = std::fs::remove_dir_all(dir);
}

/// Next to its election's file lock, a save is fenced by the lock itself: it lands only while the
/// lock shows the tenure of its term, so a deposed leader's save is refused by the store.
#[tokio::test]
async fn next_to_a_file_lock_a_save_lands_only_while_the_lock_shows_its_tenure() {
    use tenure::{LeaderElectionRecord, RecordLock};
    let lock_path = temp_path("election.json");
    let lock = tenure::locks::file::FileLock::open(&lock_path).expect("opened");
    let store = FileCheckpointStore::next_to(&lock, "pods-controller");
    assert_eq!(store.path(), lock_path.with_file_name("election.json.checkpoint"));
    let tenure = |holder: &str, term| LeaderElectionRecord {
        holder_identity: holder.into(),
        lease_duration_seconds: 15,
        leader_transitions: term,
        ..Default::default()
    };
    let at = |version: &str| {
        let mut checkpoint = Checkpoint::new("pods-controller");
        checkpoint.resource_versions.insert("pods".into(), version.into());
        checkpoint
    };
    let deposed = |result| matches!(result, Err(CheckpointError::Superseded { ours: Term(1), newer: None }));
    assert!(deposed(store.save(Term(1), &at("5")).await), "nobody leads yet");
    let version = lock.create(&tenure("a", 1)).await.expect("a leads");
    store.save(Term(1), &at("10")).await.expect("saved while a leads");
    lock.update(&version, &tenure("b", 2)).await.expect("b took over");
    assert!(deposed(store.save(Term(1), &at("15")).await), "a is deposed");
    store.save(Term(2), &at("20")).await.expect("saved while b leads");
    let stored = store.load().await.expect("readable").expect("present");
    assert_eq!((stored.term, stored.checkpoint.resource_version("pods")), (Term(2), Some("20")));
    if let Some(dir) = lock_path.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Next to a file lock, a leader whose lock file is deleted under it (an operator's `rm`, a
/// cleanup job) leads again at once under a new term: its saves under that term land, and a
/// save still carrying the old term is refused by the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_leads_again_at_once_saves_under_its_new_term_only() {
    let lock_path = temp_path("election.json");
    let lock = tenure::locks::file::FileLock::open(&lock_path).expect("opened");
    let store = FileCheckpointStore::next_to(&lock, "pods-controller");
    let timing = tenure::Timing::from_ttl(Duration::from_secs(2)).expect("a valid timing");
    let elector = Elector::builder("a", lock).timing(timing).spawn().expect("valid config");
    let first = timeout(PERIOD * 5, elector.acquired()).await.expect("leads in time").expect("leads");
    let mut checkpoint = Checkpoint::new("pods-controller");
    checkpoint.resource_versions.insert("pods".into(), "10".into());
    store.save(first.term(), &checkpoint).await.expect("saved while leading");

    std::fs::remove_file(&lock_path).expect("lock file deleted");
    timeout(PERIOD * 5, first.ended()).await.expect("the first tenure ends");
    let second = timeout(PERIOD * 5, elector.acquired()).await.expect("leads again in time").expect("leads");
    assert!(second.term() > first.term(), "{} after {}", second.term(), first.term());

    checkpoint.resource_versions.insert("pods".into(), "20".into());
    let stale = store.save(first.term(), &checkpoint).await;
    assert!(matches!(stale, Err(CheckpointError::Superseded { .. })), "{stale:?}");
    store.save(second.term(), &checkpoint).await.expect("saved under the new term");
    let stored = store.load().await.expect("readable").expect("present");
    assert_eq!((stored.term, stored.checkpoint.resource_version("pods")), (second.term(), Some("20")));
    drop((first, second));
    elector.shutdown().await.expect("shut down");
    if let Some(dir) = lock_path.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}
