//! The file lock as its users see it: the record semantics the elector relies on, the file on
//! disk, change notification, and what happens when writers are killed at random moments.
//!
//! Child processes are this test binary run again with `TENURE_FILE_LOCK_TEST_ROLE` set: the test
//! `child_process_entry_point` then plays the role instead of doing nothing.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use rand::RngExt;
use tenure::locks::file::{FencedWriteError, FileLock, FileLockError};
use tenure::{ChangeStream, Elector, LeaderElectionRecord, LockError, RecordError, RecordLock, StoredRecord};

const ROLE: &str = "TENURE_FILE_LOCK_TEST_ROLE";
const LOCK_PATH: &str = "TENURE_FILE_LOCK_TEST_PATH";
const IDENTITY: &str = "TENURE_FILE_LOCK_TEST_IDENTITY";
const TERM: &str = "TENURE_FILE_LOCK_TEST_TERM";
const TARGET: &str = "TENURE_FILE_LOCK_TEST_TARGET";
/// Lines children report start with this; the test harness's own output does not.
const REPORT: &str = "REPORT ";
/// How long any single expected event may take before a test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(10);

/// A directory of its own for one test, removed afterwards.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("file_lock-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn names(&self) -> BTreeSet<String> {
        fs::read_dir(&self.0).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect()
    }
}

/// A scratch directory for `test`, the path of a lock file in it, and a handle on that lock.
fn scratch_lock(test: &str) -> (Scratch, PathBuf, FileLock) {
    let scratch = Scratch::new(test);
    let path = scratch.join("election.json");
    let lock = FileLock::open(&path).unwrap();
    (scratch, path, lock)
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::set_permissions(&self.0, fs::Permissions::from_mode(0o700));
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn record(holder: &str, transitions: i64) -> LeaderElectionRecord {
    LeaderElectionRecord {
        holder_identity: holder.to_owned(),
        lease_duration_seconds: 15,
        acquire_time: None,
        renew_time: None,
        leader_transitions: transitions,
        ..Default::default()
    }
}

/// The file as JSON, the way an operator running `cat` sees it.
fn document(path: &Path) -> serde_json::Value {
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

async fn next_item(changes: &mut ChangeStream) -> Result<Option<StoredRecord>, LockError> {
    tokio::time::timeout(PATIENCE, changes.next())
        .await
        .expect("no change notification within the patience period")
        .expect("the change stream ended")
}

#[tokio::test]
async fn a_missing_file_reads_as_none_and_open_creates_only_private_directories() {
    let scratch = Scratch::new("missing");
    let path = scratch.join("a/b/election.json");
    let lock = FileLock::open(&path).unwrap();
    assert_eq!(lock.get().await.unwrap(), None);
    assert!(!path.exists(), "opening or reading must not create the record");
    for dir in [scratch.join("a"), scratch.join("a/b")] {
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700, "{}", dir.display());
    }
}

#[tokio::test]
async fn create_then_get_returns_the_record_at_the_returned_version() {
    let (_scratch, _, lock) = scratch_lock("create");
    let version = lock.create(&record("a", 0)).await.unwrap();
    let stored = lock.get().await.unwrap().unwrap();
    assert_eq!(stored, StoredRecord { version, record: Ok(record("a", 0)) });
}

#[tokio::test]
async fn create_fails_with_already_exists_over_a_record_or_garbage() {
    let (_scratch, path, lock) = scratch_lock("exists");
    lock.create(&record("a", 0)).await.unwrap();
    assert_eq!(lock.create(&record("b", 0)).await, Err(LockError::AlreadyExists));
    fs::write(&path, "garbage").unwrap();
    assert_eq!(lock.create(&record("b", 0)).await, Err(LockError::AlreadyExists));
    assert_eq!(fs::read_to_string(&path).unwrap(), "garbage");
}

#[tokio::test]
async fn update_succeeds_only_at_the_current_version() {
    let (_scratch, path, a) = scratch_lock("update");
    let b = FileLock::open(&path).unwrap();
    let v1 = a.create(&record("a", 0)).await.unwrap();
    let v2 = b.update(&v1, &record("b", 1)).await.unwrap();
    assert_ne!(v1, v2);
    assert_eq!(a.update(&v1, &record("a", 1)).await, Err(LockError::Conflict), "a stale version must lose");
    assert_eq!(a.get().await.unwrap().unwrap(), StoredRecord { version: v2.clone(), record: Ok(record("b", 1)) });
    let v3 = a.update(&v2, &record("a", 2)).await.unwrap();
    assert_eq!(b.get().await.unwrap().unwrap().version, v3);
}

#[tokio::test]
async fn update_of_a_deleted_file_is_a_conflict() {
    let (_scratch, path, lock) = scratch_lock("deleted");
    let version = lock.create(&record("a", 0)).await.unwrap();
    fs::remove_file(&path).unwrap();
    assert_eq!(lock.update(&version, &record("a", 1)).await, Err(LockError::Conflict));
    assert!(!path.exists(), "a failed update must not recreate the file");
}

#[tokio::test]
async fn the_file_shows_the_client_go_record_and_counts_generations() {
    let (_scratch, path, lock) = scratch_lock("format");
    let first = record("a", 0);
    let version = lock.create(&first).await.unwrap();
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text, format!("{{\"generation\":1,\"record\":{}}}\n", first.to_json()));

    let second = record("b", 1);
    lock.update(&version, &second).await.unwrap();
    let document = document(&path);
    assert_eq!(document["generation"], 2);
    assert_eq!(LeaderElectionRecord::from_json(&document["record"].to_string()).unwrap(), second);
}

#[tokio::test]
async fn a_corrupt_file_has_a_stable_version_and_can_be_taken_over() {
    let (_scratch, path, lock) = scratch_lock("corrupt");
    fs::write(&path, r#"{"generation":3,"record":{"holderIdentity":"x","lease"#).unwrap();

    let first = lock.get().await.unwrap().unwrap();
    assert!(matches!(first.record, Err(RecordError::Malformed(_))), "{:?}", first.record);
    assert!(first.version.0.starts_with("raw-"), "{}", first.version);
    assert_eq!(lock.get().await.unwrap().unwrap().version, first.version, "same content, same version");

    fs::write(&path, "something else entirely").unwrap();
    let second = lock.get().await.unwrap().unwrap();
    assert_ne!(second.version, first.version, "other content, other version");
    assert_eq!(lock.update(&first.version, &record("a", 1)).await, Err(LockError::Conflict));

    let taken = lock.update(&second.version, &record("a", 1)).await.unwrap();
    assert_eq!(lock.get().await.unwrap().unwrap(), StoredRecord { version: taken, record: Ok(record("a", 1)) });
    assert_eq!(document(&path)["generation"], 1);
}

#[tokio::test]
async fn an_invalid_record_keeps_its_generation_and_can_be_taken_over() {
    let (_scratch, path, lock) = scratch_lock("invalid");
    fs::write(&path, r#"{"generation":5,"record":{"holderIdentity":"x","leaseDurationSeconds":0}}"#).unwrap();

    let stored = lock.get().await.unwrap().unwrap();
    assert_eq!(stored.record, LeaderElectionRecord::from_json(r#"{"holderIdentity":"x","leaseDurationSeconds":0}"#));
    assert!(matches!(stored.record, Err(RecordError::Invalid(_))));
    assert!(stored.version.0.starts_with("5-"), "{}", stored.version);
    lock.update(&stored.version, &record("a", 1)).await.unwrap();
    // Written by hand, not by the protocol (no claim of generation 5 is the file): its number
    // does not enter the protocol's count.
    assert_eq!(document(&path)["generation"], 1);
}

#[tokio::test]
async fn a_fifo_or_directory_in_place_of_the_file_reads_as_malformed_without_hanging() {
    let (_scratch, path, lock) = scratch_lock("special");
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c_path` is a valid NUL-terminated string for the duration of the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let stored = tokio::time::timeout(PATIENCE, lock.get()).await.unwrap().unwrap().unwrap();
    assert!(matches!(stored.record, Err(RecordError::Malformed(_))), "{:?}", stored.record);
    assert_eq!(lock.get().await.unwrap().unwrap().version, stored.version);
    lock.update(&stored.version, &record("a", 1)).await.unwrap();
    assert_eq!(lock.get().await.unwrap().unwrap().record, Ok(record("a", 1)));

    fs::remove_file(&path).unwrap();
    fs::create_dir(&path).unwrap();
    let stored = lock.get().await.unwrap().unwrap();
    assert!(matches!(stored.record, Err(RecordError::Malformed(_))), "{:?}", stored.record);
    assert!(matches!(lock.update(&stored.version, &record("a", 2)).await, Err(LockError::Unavailable(_))));
}

#[tokio::test]
async fn a_recreated_file_does_not_match_a_version_read_before_its_deletion() {
    let (_scratch, path, old_holder) = scratch_lock("recreated");
    let stale = old_holder.create(&record("a", 0)).await.unwrap();
    fs::remove_file(&path).unwrap();
    let newcomer = FileLock::open(&path).unwrap();
    newcomer.create(&record("b", 0)).await.unwrap();
    assert_eq!(document(&path)["generation"], 2, "generations go on above the deleted file's, never down");
    assert_eq!(old_holder.update(&stale, &record("a", 1)).await, Err(LockError::Conflict));
    assert_eq!(newcomer.get().await.unwrap().unwrap().record, Ok(record("b", 0)));
}

#[tokio::test]
async fn leftover_temporary_files_are_ignored_by_readers_and_removed_by_writers() {
    let (scratch, path, lock) = scratch_lock("leftovers");
    let version = lock.create(&record("a", 0)).await.unwrap();
    // What writers killed between creating and renaming their temporary file leave behind.
    fs::write(scratch.join(".election.json.tmp.999999.0"), r#"{"generation":2,"rec"#).unwrap();
    fs::write(scratch.join(".election.json.tmp.999999.1"), "").unwrap();
    fs::write(scratch.join("other.json"), "not ours").unwrap();

    assert_eq!(lock.get().await.unwrap().unwrap().record, Ok(record("a", 0)));
    // A process that starts later cleans up with its first write.
    let restarted = FileLock::open(&path).unwrap();
    restarted.update(&version, &record("a", 1)).await.unwrap();
    let names: Vec<_> = scratch.names().into_iter().collect();
    // The claim of the file's generation stays: the high-water mark of generations.
    assert_eq!(names, [".election.json.claim.2", "election.json", "other.json"]);
}

#[tokio::test]
async fn a_lock_renewed_often_leaves_no_trail_of_claims() {
    let (scratch, _path, lock) = scratch_lock("trail");
    let mut version = lock.create(&record("a", 0)).await.unwrap();
    for renew in 1..=50 {
        version = lock.update(&version, &record("a", renew)).await.unwrap();
    }
    let names: Vec<_> = scratch.names().into_iter().collect();
    assert_eq!(names, [".election.json.claim.51", "election.json"]);
}

/// What a writer stopped (SIGSTOP, a frozen VM) between its claim and its rename leaves: its new
/// document in a temporary file, hard-linked as the claim of the next generation.
fn stopped_writer(scratch: &Scratch, generation: u64, document: &str) -> PathBuf {
    let temp = scratch.join(&format!(".election.json.tmp.{}.999999999", std::process::id()));
    fs::write(&temp, document).unwrap();
    fs::hard_link(&temp, scratch.join(&format!(".election.json.claim.{generation}"))).unwrap();
    temp
}

#[tokio::test]
async fn a_writer_stopped_in_the_middle_of_a_write_blocks_nobody_and_its_write_never_lands() {
    let (scratch, path, lock) = scratch_lock("stopped-writer");
    let lock = lock.with_lock_wait(Duration::from_millis(50));
    let version = lock.create(&record("a", 0)).await.unwrap();
    let stale = stopped_writer(&scratch, 2, r#"{"generation":2,"record":{"holderIdentity":"stopped"}}"#);

    // Another writer from the same state waits for the pending claim only the bound, then takes
    // it over and writes.
    let started = std::time::Instant::now();
    let written = lock.update(&version, &record("b", 1)).await.unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(50), "took the claim over after {took:?}, before the bound");
    assert!(took < Duration::from_secs(2), "blocked for {took:?}");
    assert_eq!(lock.get().await.unwrap().unwrap().record, Ok(record("b", 1)));

    // The stopped writer resumes: its rename fails, the record stays.
    let error = fs::rename(&stale, &path).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
    let stored = lock.get().await.unwrap().unwrap();
    assert_eq!((stored.version, stored.record), (written.clone(), Ok(record("b", 1))));
    assert_eq!(lock.get().await.unwrap().unwrap().version, written);
    assert_eq!(lock.get().await.unwrap(), lock.get().await.unwrap(), "reads never wait for writers");
}

#[tokio::test]
async fn a_stopped_writers_claim_does_not_block_creating_the_lock_either() {
    let (scratch, path, lock) = scratch_lock("stopped-creator");
    let lock = lock.with_lock_wait(Duration::from_millis(50));
    let stale = stopped_writer(&scratch, 1, r#"{"generation":1,"record":{"holderIdentity":"stopped"}}"#);
    lock.create(&record("a", 0)).await.unwrap();
    assert!(fs::rename(&stale, &path).is_err());
    assert_eq!(lock.get().await.unwrap().unwrap().record, Ok(record("a", 0)));
}

#[tokio::test]
async fn permission_errors_are_rejected_with_the_path() {
    let scratch = Scratch::new("permissions");
    let path = scratch.join("election.json");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        fs::set_permissions(&scratch.0, fs::Permissions::from_mode(0o500)).unwrap();
        expect_rejected(&FileLock::open(&path).unwrap()).await;
        return;
    }
    // Root may write anywhere: let an unprivileged child try a directory only root may write to.
    fs::set_permissions(&scratch.0, fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = child_command("expect-rejected", &path, "nobody");
    std::os::unix::process::CommandExt::uid(&mut command, 65534);
    std::os::unix::process::CommandExt::gid(&mut command, 65534);
    match command.stdout(Stdio::null()).status() {
        Ok(status) => assert!(status.success(), "the unprivileged child failed: {status}"),
        Err(error) => eprintln!("skipped: cannot run a child as nobody: {error}"),
    }
}

/// Asserts that a write is refused as a permission problem naming the directory.
async fn expect_rejected(lock: &FileLock) {
    let error = lock.create(&record("a", 0)).await.unwrap_err();
    let dir = lock.path().parent().unwrap().to_str().unwrap().to_owned();
    assert!(matches!(&error, LockError::Rejected(m) if m.contains(&dir)), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_in_one_process_never_lose_an_increment() {
    let scratch = Scratch::new("threads");
    let path = scratch.join("election.json");
    FileLock::open(&path).unwrap().create(&record("", 0)).await.unwrap();
    const WRITERS: i64 = 4;
    const INCREMENTS: i64 = 25;
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        // Separate handles and clones of one handle must both exclude each other.
        let lock = FileLock::open(&path).unwrap();
        for handle in [lock.clone(), lock] {
            tasks.push(tokio::spawn(async move {
                let mut done = 0;
                while done < INCREMENTS {
                    let stored = handle.get().await.unwrap().unwrap();
                    let current = stored.record.unwrap();
                    let next = record(&format!("w{writer}"), current.leader_transitions + 1);
                    match handle.update(&stored.version, &next).await {
                        Ok(_) => done += 1,
                        Err(LockError::Conflict) => {}
                        Err(error) => panic!("{error}"),
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let stored = FileLock::open(&path).unwrap().get().await.unwrap().unwrap();
    assert_eq!(stored.record.unwrap().leader_transitions, WRITERS * 2 * INCREMENTS);
    // One generation per write, and one skipped for each claim that lost its compare.
    assert!(document(&path)["generation"].as_i64().unwrap() > WRITERS * 2 * INCREMENTS);
}

// ---------------------------------------------------------------------------------------------
// Paths

#[test]
fn default_path_rejects_names_that_are_not_one_file_name() {
    let too_long = "x".repeat(201);
    for name in ["", too_long.as_str(), "a/b", "/abs", "nul\0byte", ".", ".."] {
        let error = FileLock::default_path(name).unwrap_err();
        assert!(matches!(error, FileLockError::InvalidElectionName { .. }), "{name:?}: {error}");
        assert!(!error.to_string().contains('\n'));
    }
}

#[test]
fn default_path_is_one_file_per_election_in_a_per_user_directory() {
    let longest = "y".repeat(200);
    let a = FileLock::default_path("svc-a").unwrap();
    let b = FileLock::default_path("svc-b").unwrap();
    let long = FileLock::default_path(&longest).unwrap();
    assert_eq!(a.file_name().unwrap(), "svc-a.json");
    assert_eq!(long.file_name().unwrap().len(), 205);
    assert_eq!(a.parent(), b.parent());
    assert!(a.is_absolute());
    // SAFETY: geteuid has no preconditions.
    let per_user = format!("tenure-{}", unsafe { libc::geteuid() });
    let dir = a.parent().unwrap();
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(runtime) if dir == Path::new(&runtime).join("tenure") => {}
        _ => assert_eq!(dir, std::env::temp_dir().join(per_user)),
    }
}

#[test]
fn open_names_the_lock_by_its_absolute_path() {
    let (_scratch, path, lock) = scratch_lock("describe");
    assert_eq!(lock.path(), path);
    assert_eq!(lock.describe(), format!("file://{}", path.display()));

    // Relative to the current directory, which exists, so nothing is created.
    let relative = FileLock::open("relative-election.json").unwrap();
    let absolute = std::env::current_dir().unwrap().join("relative-election.json");
    assert_eq!(relative.path(), absolute);
    assert_eq!(relative.describe(), format!("file://{}", absolute.display()));
    assert!(!absolute.exists());
}

#[test]
fn open_refuses_a_path_that_is_not_a_file() {
    let scratch = Scratch::new("not-a-file");
    assert!(matches!(FileLock::open(&scratch.0), Err(FileLockError::NotAFile(_))));
    assert!(matches!(FileLock::open("/"), Err(FileLockError::NotAFile(_))));
}

// ---------------------------------------------------------------------------------------------
// Change notification

#[tokio::test]
async fn watch_reports_a_change_made_through_another_handle_and_nothing_else() {
    let (scratch, path, watcher) = scratch_lock("watch-handle");
    let writer = FileLock::open(&path).unwrap();
    let version = writer.create(&record("a", 0)).await.unwrap();
    let mut changes = watcher.watch().unwrap();

    // Other files in the directory, including another lock, do not count as changes.
    fs::write(scratch.join("unrelated.txt"), "x").unwrap();
    FileLock::open(scratch.join("other.json")).unwrap().create(&record("z", 0)).await.unwrap();
    let written = writer.update(&version, &record("b", 1)).await.unwrap();

    let change = next_item(&mut changes).await.unwrap();
    assert_eq!(change, Some(StoredRecord { version: written, record: Ok(record("b", 1)) }));
}

#[tokio::test]
async fn watch_reports_deletion_and_recreation() {
    let (_scratch, path, lock) = scratch_lock("watch-delete");
    lock.create(&record("a", 0)).await.unwrap();
    let mut changes = lock.watch().unwrap();

    fs::remove_file(&path).unwrap();
    assert_eq!(next_item(&mut changes).await.unwrap(), None);
    let version = FileLock::open(&path).unwrap().create(&record("b", 0)).await.unwrap();
    assert_eq!(next_item(&mut changes).await.unwrap(), Some(StoredRecord { version, record: Ok(record("b", 0)) }));
}

#[tokio::test]
async fn watch_reports_a_foreign_writer_that_writes_in_place() {
    let (_scratch, path, lock) = scratch_lock("watch-foreign");
    lock.create(&record("a", 0)).await.unwrap();
    let mut changes = lock.watch().unwrap();

    fs::write(&path, "{ not a record").unwrap();
    let change = next_item(&mut changes).await.unwrap().unwrap();
    assert!(matches!(change.record, Err(RecordError::Malformed(_))));
    assert_eq!(Some(change), lock.get().await.unwrap());
}

#[tokio::test]
async fn watch_reports_a_change_made_by_another_process() {
    let (_scratch, path, lock) = scratch_lock("watch-process");
    lock.create(&record("a", 0)).await.unwrap();
    let mut changes = lock.watch().unwrap();

    let status = child_command("update-once", &path, "other-process").stdout(Stdio::null()).status().unwrap();
    assert!(status.success(), "child failed: {status}");
    let change = next_item(&mut changes).await.unwrap().unwrap();
    assert_eq!(change.record, Ok(record("other-process", 1)));
}

#[tokio::test]
async fn watch_fails_once_and_ends_when_the_directory_is_removed() {
    let scratch = Scratch::new("watch-rmdir");
    let dir = scratch.join("locks");
    let lock = FileLock::open(dir.join("election.json")).unwrap();
    lock.create(&record("a", 0)).await.unwrap();
    let mut changes = lock.watch().unwrap();

    fs::remove_dir_all(&dir).unwrap();
    let error = loop {
        match next_item(&mut changes).await {
            Ok(None) => continue, // the file's deletion may be reported first
            Ok(Some(stored)) => panic!("unexpected record {stored:?}"),
            Err(error) => break error,
        }
    };
    assert!(matches!(&error, LockError::Unavailable(m) if m.contains("removed")), "{error}");
    assert!(tokio::time::timeout(PATIENCE, changes.next()).await.unwrap().is_none());
    // Reopening works again: the directory is recreated.
    let mut reopened = lock.watch().unwrap();
    let version = lock.create(&record("b", 0)).await.unwrap();
    assert_eq!(next_item(&mut reopened).await.unwrap().unwrap().version, version);
}

#[tokio::test]
async fn an_elector_takes_over_a_released_file_lock_through_the_watch() {
    let scratch = Scratch::new("elector");
    let path = scratch.join("election.json");
    // Client-go's default timing: a 15 s lease, so only a pushed release explains a quick takeover.
    let first = Elector::builder("first", FileLock::open(&path).unwrap()).spawn().unwrap();
    let first_term = tokio::time::timeout(PATIENCE, first.acquired()).await.unwrap().unwrap().term();
    let second = Elector::builder("second", FileLock::open(&path).unwrap()).spawn().unwrap();
    let mut seen_by_second = second.subscribe();
    tokio::time::timeout(PATIENCE, seen_by_second.wait_for(|l| l.leader.as_deref() == Some("first")))
        .await
        .unwrap()
        .unwrap();

    first.shutdown().await.unwrap();
    let second_term = tokio::time::timeout(PATIENCE, second.acquired()).await.unwrap().unwrap().term();
    assert!(second_term > first_term);
    let stored = FileLock::open(&path).unwrap().get().await.unwrap().unwrap();
    assert_eq!(stored.record.unwrap().holder_identity, "second");
    second.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Processes killed at random moments

fn child_command(role: &str, path: &Path, identity: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child_process_entry_point", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, role)
        .env(LOCK_PATH, path)
        .env(IDENTITY, identity);
    command
}

/// Not a test of its own: the body of the child processes the tests below start.
#[test]
fn child_process_entry_point() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let path = PathBuf::from(std::env::var_os(LOCK_PATH).unwrap());
    let identity = std::env::var(IDENTITY).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let lock = FileLock::open(path).unwrap();
    match role.as_str() {
        "hammer" => runtime.block_on(hammer(lock, identity)),
        "expect-rejected" => runtime.block_on(expect_rejected(&lock)),
        "update-once" => runtime.block_on(async {
            let stored = lock.get().await.unwrap().unwrap();
            let next = record(&identity, stored.record.unwrap().leader_transitions + 1);
            lock.update(&stored.version, &next).await.unwrap();
        }),
        "fenced-write-and-report" => runtime.block_on(async {
            let term = tenure::Term(std::env::var(TERM).unwrap().parse().unwrap());
            let target = PathBuf::from(std::env::var_os(TARGET).unwrap());
            match lock.write_fenced(term, &target, identity.as_bytes()).await {
                Ok(()) => report("ok"),
                Err(FencedWriteError::Deposed { .. }) => report("deposed"),
                Err(error) => report(&format!("failed {error}")),
            }
        }),
        "update-and-report" => runtime.block_on(async {
            let stored = lock.get().await.unwrap().unwrap();
            let next = record(&identity, stored.record.unwrap().leader_transitions + 1);
            match lock.update(&stored.version, &next).await {
                Ok(_) => report("ok"),
                Err(LockError::Conflict) => report("conflict"),
                Err(error) => report(&format!("failed {error}")),
            }
        }),
        other => panic!("unknown role {other}"),
    }
}

fn report(line: &str) {
    // One write per line: a line is either entirely in the pipe or not at all.
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{REPORT}{line}\n").as_bytes()).unwrap();
    out.flush().unwrap();
}

/// Increments the record's `leaderTransitions` by compare-and-swap until stdin closes, reporting
/// each attempt before it starts and its outcome after it ends.
async fn hammer(lock: FileLock, identity: String) {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_on_eof = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        stop_on_eof.store(true, Ordering::SeqCst);
    });
    while !stop.load(Ordering::SeqCst) {
        let stored = match lock.get().await {
            Ok(Some(stored)) => stored,
            Ok(None) => return report("anomaly the record is missing"),
            Err(error) => return report(&format!("anomaly get failed: {error}")),
        };
        let current = match stored.record {
            Ok(current) => current,
            Err(error) => return report(&format!("anomaly torn or corrupt record: {error}")),
        };
        let next = current.leader_transitions + 1;
        report(&format!("attempt {next}"));
        match lock.update(&stored.version, &record(&identity, next)).await {
            Ok(_) => report(&format!("ok {next}")),
            Err(LockError::Conflict) => report(&format!("conflict {next}")),
            // The file lock never applies a write it reports as failed (see its module doc).
            Err(error) => report(&format!("failed {next} {error}")),
        }
    }
    report("done");
}

/// One hammering child.
struct Hammer {
    process: Child,
    reader: Option<std::thread::JoinHandle<()>>,
}

fn start_hammer(path: &Path, index: usize, lines: mpsc::Sender<(usize, String)>) -> Hammer {
    let mut process = child_command("hammer", path, &format!("child-{index}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = process.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        // A line without its newline would be a fragment of a killed child: dropped.
        while stdout.read_line(&mut line).unwrap() > 0 && line.ends_with('\n') {
            if let Some(report) = line.trim_end().strip_prefix(REPORT) {
                if lines.send((index, report.to_owned())).is_err() {
                    break;
                }
            }
            line.clear();
        }
    });
    Hammer { process, reader: Some(reader) }
}

const ROUNDS: usize = 20;
const CHILDREN: usize = 3;

/// One round of `CHILDREN` hammering children, and what they reported so far.
struct Round {
    children: Vec<Hammer>,
    receiver: mpsc::Receiver<(usize, String)>,
    lines: HashMap<usize, Vec<String>>,
}

impl Round {
    fn start(path: &Path) -> Round {
        let (sender, receiver) = mpsc::channel();
        let children = (0..CHILDREN).map(|i| start_hammer(path, i, sender.clone())).collect();
        Round { children, receiver, lines: HashMap::new() }
    }

    /// The next report: which child sent it, and whether it says a write succeeded.
    fn receive(&mut self) -> (usize, bool) {
        let (index, line) = self.receiver.recv_timeout(PATIENCE).expect("the children stopped reporting (blocked?)");
        let is_ok = line.starts_with("ok ");
        self.lines.entry(index).or_default().push(line);
        (index, is_ok)
    }

    /// Waits until the children have reported `count` successful writes.
    fn writes(&mut self, count: usize) {
        let mut writes = 0;
        while writes < count {
            writes += usize::from(self.receive().1);
        }
    }

    /// Asks the children to stop and waits for them; every child but `victim` (killed) must
    /// exit successfully and have reported its end. Returns each child's outcome.
    fn finish(mut self, round: usize, victim: Option<usize>) -> Vec<Outcome> {
        for child in &mut self.children {
            drop(child.process.stdin.take());
        }
        for (index, child) in self.children.iter_mut().enumerate() {
            let status = child.process.wait().unwrap();
            assert!(Some(index) == victim || status.success(), "round {round}: child {index} failed: {status}");
            child.reader.take().unwrap().join().unwrap();
        }
        while let Ok((index, line)) = self.receiver.try_recv() {
            self.lines.entry(index).or_default().push(line);
        }
        let outcomes: Vec<Outcome> =
            (0..CHILDREN).map(|i| outcome(self.lines.get(&i).map_or(&[][..], Vec::as_slice))).collect();
        for (index, outcome) in outcomes.iter().enumerate() {
            if Some(index) != victim {
                assert!(outcome.finished && outcome.in_flight.is_none(), "round {round}: child {index}: {outcome:?}");
            }
        }
        outcomes
    }
}

/// What one child's report says about the writes it made.
#[derive(Debug, Default)]
struct Outcome {
    applied: Vec<i64>,
    /// The write in flight when the child was killed: applied or not, nobody was told.
    in_flight: Option<i64>,
    finished: bool,
}

fn outcome(lines: &[String]) -> Outcome {
    let mut outcome = Outcome::default();
    for line in lines {
        assert!(!outcome.finished, "report after done: {line}");
        let mut words = line.splitn(3, ' ');
        let (verb, value) = (words.next().unwrap(), words.next());
        let value = value.and_then(|v| v.parse::<i64>().ok());
        match (verb, value) {
            ("attempt", Some(v)) => {
                assert_eq!(outcome.in_flight, None, "two attempts at once: {lines:?}");
                outcome.in_flight = Some(v);
            }
            ("ok" | "conflict" | "failed", Some(v)) => {
                assert_eq!(outcome.in_flight.take(), Some(v), "outcome without attempt: {lines:?}");
                if verb == "ok" {
                    outcome.applied.push(v);
                }
            }
            ("done", None) => outcome.finished = true,
            _ => panic!("child reported: {line}"),
        }
    }
    outcome
}

/// The values the children were told they wrote, each written once.
fn applied_once(round: usize, outcomes: &[Outcome]) -> BTreeSet<i64> {
    let mut applied = BTreeSet::new();
    for &value in outcomes.iter().flat_map(|o| &o.applied) {
        assert!(applied.insert(value), "round {round}: {value} was written twice");
    }
    applied
}

/// The writes counted in the record's `leaderTransitions`.
fn read_counter(runtime: &tokio::runtime::Runtime, lock: &FileLock) -> i64 {
    match runtime.block_on(lock.get()).unwrap() {
        Some(StoredRecord { record: Ok(record), .. }) => record.leader_transitions,
        other => panic!("the file is not a record: {other:?}"),
    }
}

/// Watches the lock during the whole run and counts what no reader may ever see.
#[derive(Debug, Default)]
struct WatchTally {
    records: u64,
    bad: Vec<String>,
}

#[test]
fn killed_writers_never_tear_the_record_lose_an_increment_or_leave_the_lock_stuck() {
    let (scratch, path, lock) = scratch_lock("kill");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    runtime.block_on(lock.create(&record("", 0))).unwrap();

    let tally = Arc::new(Mutex::new(WatchTally::default()));
    let mut changes = lock.watch().unwrap();
    let watch_tally = tally.clone();
    let watcher = runtime.spawn(async move {
        while let Some(item) = changes.next().await {
            let mut tally = watch_tally.lock().unwrap();
            match item {
                Ok(Some(StoredRecord { record: Ok(_), .. })) => tally.records += 1,
                other => tally.bad.push(format!("{other:?}")),
            }
        }
    });

    let mut rng = rand::rng();
    let (mut total_applied, mut killed_mid_write) = (0, 0);
    for round in 0..ROUNDS {
        let before = read_counter(&runtime, &lock);
        let mut hammers = Round::start(&path);
        // Let them hammer for a random number of writes, then kill one at whatever it is doing.
        hammers.writes(rng.random_range(1..=30));
        // A random pause (not synchronisation) so that kills land at every point of a write.
        std::thread::sleep(Duration::from_micros(rng.random_range(0..2000)));
        let victim = rng.random_range(0..CHILDREN);
        hammers.children[victim].process.kill().unwrap();
        let status = hammers.children[victim].process.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "round {round}: the victim was not killed");
        read_counter(&runtime, &lock); // panics unless the file holds a whole record

        // The survivors keep going: nothing the victim left blocks them.
        hammers.writes(3);
        let outcomes = hammers.finish(round, Some(victim));

        // Exact accounting: every value from `before` to `after` was written exactly once, by a
        // write its child reported, or by the one write the victim had in flight.
        let after = read_counter(&runtime, &lock);
        let applied = applied_once(round, &outcomes);
        let in_flight = outcomes[victim].in_flight;
        let expected: BTreeSet<i64> = (before + 1..=after).collect();
        let unreported: Vec<i64> = expected.difference(&applied).copied().collect();
        assert!(applied.is_subset(&expected), "round {round}: reported writes {applied:?} beyond {before}..={after}");
        match unreported.as_slice() {
            [] => {}
            [value] if Some(*value) == in_flight => killed_mid_write += 1,
            lost => panic!("round {round}: values {lost:?} were lost (victim had {in_flight:?} in flight)"),
        }
        // One generation per write, and one skipped for each claim taken over from a victim
        // killed between its claim and its rename.
        let generation = document(&path)["generation"].as_i64().unwrap();
        assert!(generation > after, "round {round}: generation {generation} after {after} writes");
        total_applied += after - before;
    }

    let tally = tally.lock().unwrap();
    assert!(tally.bad.is_empty(), "the watch saw {:?}", tally.bad);
    assert!(tally.records > 0, "the watch reported no change");
    drop(tally);
    watcher.abort();
    eprintln!("{ROUNDS} rounds, {total_applied} writes, {killed_mid_write} victims killed after renaming");

    // Whatever the victims left behind, the next writer cleans up.
    let restarted = FileLock::open(&path).unwrap();
    let stored = runtime.block_on(restarted.get()).unwrap().unwrap();
    runtime.block_on(restarted.update(&stored.version, &record("last", 0))).unwrap();
    let names: Vec<_> = scratch.names().into_iter().collect();
    let generation = document(&path)["generation"].as_u64().unwrap();
    assert_eq!(names, [format!(".election.json.claim.{generation}"), "election.json".to_owned()]);
}

/// A writer stopped (SIGSTOP) at a random point, in the middle of a write included, blocks none
/// of the others (they go on writing while it is stopped), and when it resumes its write either
/// landed before it was stopped or fails: no increment is lost or applied twice, and nothing it
/// wrote lands over a newer record.
#[test]
fn stopped_writers_block_nobody_and_never_land_a_stale_write() {
    let (_scratch, path, lock) = scratch_lock("stop");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(lock.create(&record("", 0))).unwrap();

    let mut rng = rand::rng();
    let (mut writes_while_stopped, mut skipped_generations) = (0, 0);
    for round in 0..ROUNDS {
        let before = read_counter(&runtime, &lock);
        let generation_before = document(&path)["generation"].as_i64().unwrap();
        let mut hammers = Round::start(&path);
        hammers.writes(rng.random_range(1..=30));
        // A random pause (not synchronisation) so that stops land at every point of a write.
        std::thread::sleep(Duration::from_micros(rng.random_range(0..2000)));
        let victim = rng.random_range(0..CHILDREN);
        let pid = hammers.children[victim].process.id() as i32;
        // SAFETY: kill only sends a signal to our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        // Until the victim is stopped for sure, its lines may still arrive.
        let mut others_wrote = 0;
        while others_wrote < 10 {
            let (index, ok) = hammers.receive();
            others_wrote += usize::from(ok && index != victim);
        }
        writes_while_stopped += others_wrote;
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        let mut victim_after = 0;
        while victim_after < 2 {
            victim_after += usize::from(hammers.receive().0 == victim);
        }
        let outcomes = hammers.finish(round, None);

        // Exact accounting: every value from `before` to `after` was written exactly once, each
        // by a write its child was told succeeded.
        let after = read_counter(&runtime, &lock);
        let expected: BTreeSet<i64> = (before + 1..=after).collect();
        let applied = applied_once(round, &outcomes);
        assert_eq!(applied, expected, "round {round}: reported writes and the record's counter differ");
        let generation = document(&path)["generation"].as_i64().unwrap();
        skipped_generations += generation - generation_before - (after - before);
    }
    eprintln!("{ROUNDS} stops, {writes_while_stopped} writes by the others meanwhile, {skipped_generations} generations skipped (claims that lost their compare or were taken over)");
}

// ---------------------------------------------------------------------------------------------
// Writers held at one step of a write (the `simulation` feature's hold point), in PID namespaces

/// A child that makes one update and is held just before its rename, as a SIGSTOP there would.
struct HeldWriter {
    process: Child,
    lines: mpsc::Receiver<String>,
}

impl HeldWriter {
    /// Starts `command` and waits until it is held, its claim taken and its check passed.
    fn start(mut command: Command) -> HeldWriter {
        let mut process = command
            .env("TENURE_FILE_LOCK_HOLD_BEFORE", "rename")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(process.stdout.take().unwrap());
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let writer = HeldWriter { process, lines };
        writer.until(|line| line == "held before rename");
        writer
    }

    /// The next line that `wanted` accepts; earlier lines are the test harness's.
    fn until(&self, wanted: impl Fn(&str) -> bool) -> String {
        loop {
            let line = self.lines.recv_timeout(PATIENCE).expect("the child neither got there nor said why");
            if wanted(&line) {
                return line;
            }
        }
    }

    /// Lets it go on; what its update returned.
    fn release(mut self) -> String {
        self.process.stdin.take().unwrap().write_all(b"\n").unwrap();
        let outcome = self.until(|line| line.starts_with(REPORT));
        assert!(self.process.wait().unwrap().success());
        outcome.strip_prefix(REPORT).unwrap().to_owned()
    }
}

/// `child_command`, run as PID 1 of a PID namespace of its own (as in a container).
fn child_in_own_pid_namespace(role: &str, path: &Path, identity: &str) -> Command {
    let child = child_command(role, path, identity);
    let mut command = Command::new("unshare");
    command.args(["--pid", "--fork", "--"]).arg(child.get_program()).args(child.get_args());
    for (name, value) in child.get_envs() {
        command.env(name, value.unwrap());
    }
    command
}

/// Whether this machine lets the tests make PID namespaces (root, `unshare` installed); in CI it
/// must.
fn pid_namespaces_work() -> bool {
    let works = Command::new("unshare").args(["--pid", "--fork", "true"]).status().is_ok_and(|s| s.success());
    assert!(works || std::env::var_os("CI").is_none(), "CI runs as root with unshare: PID namespaces must work");
    if !works {
        eprintln!("skipped: cannot make a PID namespace here (not root, or no unshare)");
    }
    works
}

/// Containers sharing a volume are each PID 1 of their own namespace. A writer's temporary file
/// is its alone all the same: when a writer held before its rename is taken over, a writer of
/// another namespace cannot have a file of that name ready for the held one's rename to move
/// into place (its Ok would be a lie, and the other's write would land behind its Conflict).
#[test]
fn writers_that_are_pid_1_of_their_own_namespaces_never_move_each_others_writes() {
    if !pid_namespaces_work() {
        return;
    }
    let (_scratch, path, lock) = scratch_lock("pid-namespaces");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let first = runtime.block_on(lock.create(&record("first", 0))).unwrap();
    // A claims generation 2, passes its check and is held before its rename.
    let a = HeldWriter::start(child_in_own_pid_namespace("update-and-report", &path, "a"));
    // B, from the same state, takes A's claim over and writes generation 3.
    runtime.block_on(lock.update(&first, &record("b", 1))).unwrap();
    // P, PID 1 too, claims generation 4 and is held before its rename.
    let p = HeldWriter::start(child_in_own_pid_namespace("update-and-report", &path, "p"));
    assert_eq!(a.release(), "conflict", "A's write was taken over: nothing it renames may land");
    assert_eq!(runtime.block_on(lock.get()).unwrap().unwrap().record, Ok(record("b", 1)));
    assert_eq!(p.release(), "ok", "P's write is the next one");
    assert_eq!(runtime.block_on(lock.get()).unwrap().unwrap().record, Ok(record("p", 2)));
    assert_eq!(document(&path)["generation"], 4);
}

/// Whatever generation a document shows, a hand-written or foreign one near the top of the range
/// included, it is replaced and writing goes on, across a deletion too: the count is the
/// protocol's own.
#[tokio::test]
async fn a_document_at_any_generation_is_replaced_and_writes_go_on() {
    for shown in [(1_u64 << 53) - 2, (1 << 53) - 1, 1 << 53, u64::MAX - 1, u64::MAX] {
        let (_scratch, path, lock) = scratch_lock(&format!("generation-{shown}"));
        let foreign = serde_json::json!({"generation": shown, "record": record("foreign", 5)});
        fs::write(&path, foreign.to_string()).unwrap();
        let mut version = lock.get().await.unwrap().unwrap().version;
        for transitions in 6..9 {
            let next = record("a", transitions);
            version = tokio::time::timeout(PATIENCE, lock.update(&version, &next)).await.expect("the write never ends").unwrap();
        }
        assert_eq!(document(&path)["generation"], 3, "shown {shown}");
        fs::remove_file(&path).unwrap();
        let created = lock.create(&record("b", 9)).await.unwrap();
        lock.update(&created, &record("b", 10)).await.unwrap();
        assert_eq!(document(&path)["generation"], 5, "shown {shown}: generations go on above every claim");
    }
}

/// The one way to the end of the range is 2^53 - 1 writes of the protocol's own (285,000 years at
/// one a millisecond); there, writes are refused with an error that says what to do, at once.
#[tokio::test]
async fn at_the_end_of_the_generations_writes_are_refused_with_what_to_do() {
    const LAST: u64 = (1 << 53) - 1;
    let (scratch, path, lock) = scratch_lock("last-generation");
    // The lock as its writes would leave it at LAST - 1: the file is its generation's claim, and
    // a writer that lost its compare left the claim of LAST behind.
    let document = serde_json::json!({"generation": LAST - 1, "record": record("a", 1)});
    fs::write(&path, document.to_string()).unwrap();
    fs::hard_link(&path, scratch.join(&format!(".election.json.claim.{}", LAST - 1))).unwrap();
    fs::write(scratch.join(&format!(".election.json.claim.{LAST}")), b"").unwrap();
    let version = lock.get().await.unwrap().unwrap().version;
    let next = record("a", 2);
    let error = tokio::time::timeout(PATIENCE, lock.update(&version, &next)).await.expect("the write never ends").unwrap_err();
    assert!(matches!(&error, LockError::Rejected(m) if m.contains("exhausted") && m.contains(".claim.")), "{error}");
    assert_eq!(lock.get().await.unwrap().unwrap().version, version, "nothing was written");
}

/// In a sticky directory shared by several users, a writer cannot remove another user's
/// temporary file: that claim is live and cannot be taken over, so the write fails with an error
/// that says so, instead of writing over a write that may still land.
#[test]
fn a_claim_that_cannot_be_taken_over_fails_the_write_instead_of_being_skipped() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("skipped: needs root, to write as two users");
    }
    let (scratch, path, lock) = scratch_lock("sticky");
    fs::set_permissions(&scratch.0, fs::Permissions::from_mode(0o1777)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(lock.create(&record("first", 0))).unwrap();
    // The file belongs to nobody (who wrote it last); root's writer is stopped before its rename.
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    let stale = stopped_writer(&scratch, 2, &serde_json::json!({"generation": 2, "record": record("root", 1)}).to_string());
    let mut command = child_command("update-and-report", &path, "nobody");
    std::os::unix::process::CommandExt::uid(&mut command, 65534);
    std::os::unix::process::CommandExt::gid(&mut command, 65534);
    let output = command.stderr(Stdio::null()).output().unwrap();
    let reports: Vec<&str> = std::str::from_utf8(&output.stdout).unwrap().lines().filter_map(|l| l.strip_prefix(REPORT)).collect();
    assert!(
        matches!(reports[..], [report] if report.starts_with("failed ") && report.contains("take over")),
        "{reports:?}"
    );
    // The stopped writer resumes: its write is the one that lands.
    fs::rename(&stale, &path).unwrap();
    assert_eq!(runtime.block_on(lock.get()).unwrap().unwrap().record, Ok(record("root", 1)));
}

// ---------------------------------------------------------------------------------------------
// Writes fenced by the lock

#[tokio::test]
async fn a_fenced_write_lands_while_the_tenure_holds_and_is_refused_once_another_leads_or_it_is_released() {
    let (scratch, _path, lock) = scratch_lock("fenced");
    let target = scratch.join("allocations.json");
    let first = lock.create(&record("a", 1)).await.unwrap();
    lock.write_fenced(tenure::Term(1), &target, "one").await.unwrap();
    assert_eq!(fs::read_to_string(&target).unwrap(), "one");
    // A renew of the same tenure is no reason to refuse.
    let renewed = lock.update(&first, &record("a", 1)).await.unwrap();
    lock.write_fenced(tenure::Term(1), &target, "two").await.unwrap();
    assert_eq!(fs::read_to_string(&target).unwrap(), "two");
    // Another term: deposed.
    for term in [0, 2] {
        let error = lock.write_fenced(tenure::Term(term), &target, "x").await.unwrap_err();
        assert!(matches!(&error, FencedWriteError::Deposed { shows, .. } if shows == "\"a\" at term 1"), "{error}");
    }
    // Another leads.
    let taken = lock.update(&renewed, &record("b", 2)).await.unwrap();
    let error = lock.write_fenced(tenure::Term(1), &target, "late").await.unwrap_err();
    assert!(error.to_string().starts_with("deposed: "), "{error}");
    assert_eq!(fs::read_to_string(&target).unwrap(), "two");
    // Released: nobody's writes land.
    lock.update(&taken, &record("", 2)).await.unwrap();
    let error = lock.write_fenced(tenure::Term(2), &target, "late").await.unwrap_err();
    assert!(matches!(&error, FencedWriteError::Deposed { shows, .. } if shows == "no holder, term 2"), "{error}");
    assert_eq!(fs::read_to_string(&target).unwrap(), "two");
}

/// A fenced write leaves its claim linked to the file it wrote: the lock's next writer must see at
/// once that it can never land, not wait for it (here the wait would be an hour).
#[tokio::test]
async fn a_fenced_write_leaves_nothing_the_next_renew_waits_for() {
    let (scratch, _path, lock) = scratch_lock("fenced-then-renew");
    let lock = lock.with_lock_wait(Duration::from_secs(3600));
    let mut version = lock.create(&record("a", 1)).await.unwrap();
    for round in 0..3 {
        lock.write_fenced(tenure::Term(1), scratch.join("state"), format!("{round}")).await.unwrap();
        let same = record("a", 1);
        version = tokio::time::timeout(PATIENCE, lock.update(&version, &same)).await.expect("the renew waited for the fenced write's claim").unwrap();
    }
}

#[tokio::test]
async fn a_fenced_write_onto_the_lock_itself_is_refused() {
    let (_scratch, path, lock) = scratch_lock("fenced-onto-lock");
    lock.create(&record("a", 1)).await.unwrap();
    let error = lock.write_fenced(tenure::Term(1), &path, "x").await.unwrap_err();
    assert!(matches!(&error, FencedWriteError::Lock(LockError::Rejected(m)) if m.contains("own file")), "{error}");
    assert_eq!(lock.get().await.unwrap().unwrap().record, Ok(record("a", 1)));
}

/// The point of fencing at the store: a leader held (a GC pause, SIGSTOP, a frozen VM) after its
/// last check, with its write about to land, thaws after the next leader took over. With a check
/// and a plain write the stale write lands over the new leader's; fenced by the lock, it never
/// does.
#[test]
fn a_fenced_write_held_after_its_check_never_lands_after_the_next_leader_took_over() {
    let (scratch, path, lock) = scratch_lock("fenced-held");
    let target = scratch.join("allocations.json");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let held = runtime.block_on(lock.create(&record("old", 1))).unwrap();
    let mut command = child_command("fenced-write-and-report", &path, "old");
    command.env(TERM, "1").env(TARGET, &target);
    let old = HeldWriter::start(command);
    // The next leader takes the lock (taking the held claim over) and writes the target.
    runtime.block_on(lock.update(&held, &record("new", 2))).unwrap();
    runtime.block_on(lock.write_fenced(tenure::Term(2), &target, "new")).unwrap();
    assert_eq!(old.release(), "deposed");
    assert_eq!(fs::read_to_string(&target).unwrap(), "new", "the deposed leader's write landed");
}
