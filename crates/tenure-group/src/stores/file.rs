//! A group kept in a directory: the members of a group on one host, with nothing to install.
//!
//! One file per record in the group's directory (`table.json`, `member-<hex of identity>.json`),
//! each one line of JSON `{"generation":N,"table":{..}}` or `{"generation":N,"member":{..}}`, so
//! `cat` shows the group.
//!
//! - **Writes** are the file lock's compare-and-swap ([`ClaimedFile`]), one file per record: no
//!   writer holds anything another must wait for, so a member stopped in the middle of a write
//!   (SIGSTOP, a frozen VM) keeps nobody from writing, and its write can never land after a
//!   newer one. Writes to different records never meet. Every write is atomic (a rename), and
//!   an error always means it did not happen. The version of a record is its generation.
//! - **Deletes** (of a departed member's record) replace the record with a tombstone
//!   (`{"generation":N,"deleted":true}`) by the same compare-and-swap. Reads skip tombstones; a
//!   member that joins again with the same identity writes over its tombstone, so the generation
//!   goes on and a version never names two contents. Tombstones stay: removing a file cannot be
//!   made conditional on what it holds, and a removal that came late (its process stopped) would
//!   delete a record written after it. A tombstone is one line per departed identity.
//! - **Reads** take no lock: the table first, then every member file (a member writes its record
//!   before it claims anything, so every owner named in the table is found).
//! - **Changes** come from inotify on the directory (a rename onto a record, its creation, a close
//!   after writing one in place, a deletion); each burst of events is one notification.
//! - **No fsync**: the group coordinates live processes; after a power loss everyone starts afresh
//!   and waits out the leases it sees.
//! - **Upgrading** from a release that wrote under a `flock` on `<dir>/.lock`: those writers and
//!   these do not exclude each other; stop every member of the group first (or let the group start
//!   afresh in a new directory). The `.lock` file is no longer used and may be removed.
//!
//! A member file that does not parse is left out of the snapshot with a warning, and its member
//! replaces it when it joins. A table that does not parse makes the read fail with
//! `StoreError::Rejected`: nobody claims anything until it is repaired, and members keep renewing.

use std::collections::HashMap;
use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use inotify::{Inotify, WatchMask};
use serde::{Deserialize, Serialize};
use tenure::locks::file::{ClaimedDocument, ClaimedFile};

use crate::record::{MemberRecord, PartitionTable};
use crate::store::{ChangeStream, GroupStore, Key, Snapshot, StoreError, Stored, Value, Version};

/// Documents larger than this are not parsed (a table of 16 384 partitions is about 1 MiB).
const MAX_DOCUMENT_BYTES: u64 = 4 * 1024 * 1024;
/// How many times a create from a tombstone reads again after another write came first.
const CREATE_ATTEMPTS: usize = 4;
const TABLE_FILE: &str = "table.json";
const MEMBER_PREFIX: &str = "member-";

/// Why a [`FileGroupStore`] could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum FileStoreError {
    /// The directory could not be created or is not a directory.
    #[error("cannot use {path} as a group directory: {error}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// What failed.
        error: io::Error,
    },
}

/// What a record's file holds beside its generation, as written.
#[derive(Serialize)]
struct FieldsOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    table: Option<&'a PartitionTable>,
    #[serde(skip_serializing_if = "Option::is_none")]
    member: Option<&'a MemberRecord>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    deleted: bool,
}

/// A record's file as read.
#[derive(Deserialize)]
struct FieldsIn {
    generation: u64,
    #[serde(default)]
    table: Option<PartitionTable>,
    #[serde(default)]
    member: Option<MemberRecord>,
    #[serde(default)]
    deleted: bool,
}

/// A record's file as a writer sees it.
enum State {
    /// No record: no file (`None`), or a tombstone or a member file that does not parse, which a
    /// create replaces from its version.
    Absent(Option<tenure::Version>),
    /// A record at `generation`.
    Live { generation: u64, version: tenure::Version },
    /// A table that does not parse: only an operator may replace it.
    Corrupt,
}

/// A group stored in a directory, shared by processes on one host.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use tenure_group::stores::file::FileGroupStore;
/// use tenure_group::store::GroupStore;
/// let store = FileGroupStore::open("/run/user/1000/tenure/groups/my-controller")?;
/// println!("{} members", store.read().await?.members.len());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FileGroupStore {
    dir: Arc<PathBuf>,
    /// The records' files by name, opened once: each handle paces its own cleanup.
    files: Arc<Mutex<HashMap<String, ClaimedFile>>>,
}

impl FileGroupStore {
    /// Opens (creating with mode 0700 if missing) the group directory `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, FileStoreError> {
        let dir = dir.as_ref();
        let directory_error = |error| FileStoreError::Directory { path: dir.to_owned(), error };
        DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(directory_error)?;
        let dir = std::path::absolute(dir).map_err(directory_error)?;
        Ok(FileGroupStore { dir: Arc::new(dir), files: Arc::default() })
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of the record named `name`.
    fn file(&self, name: &str) -> Result<ClaimedFile, StoreError> {
        let mut files = self.files.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(file) = files.get(name) {
            return Ok(file.clone());
        }
        let file = ClaimedFile::open(self.dir.join(name))
            .map_err(|error| StoreError::Unavailable(error.to_string()))?
            .with_max_bytes(MAX_DOCUMENT_BYTES);
        files.insert(name.to_owned(), file.clone());
        Ok(file)
    }

    /// The state of `key`'s record, for a write.
    async fn state(&self, key: &Key, file: &ClaimedFile) -> Result<State, StoreError> {
        let Some(document) = file.read().await? else { return Ok(State::Absent(None)) };
        let table = *key == Key::Table;
        Ok(match parse(&document) {
            Ok(fields) if fields.deleted => State::Absent(Some(document.version)),
            Ok(fields) if if table { fields.table.is_some() } else { fields.member.is_some() } => {
                State::Live { generation: fields.generation, version: document.version }
            }
            _ if table => State::Corrupt,
            _ => State::Absent(Some(document.version)),
        })
    }
}

fn file_name(key: &Key) -> String {
    match key {
        Key::Table => TABLE_FILE.to_owned(),
        Key::Member(id) => format!("{MEMBER_PREFIX}{}.json", crate::codec::hex(id)),
    }
}

fn parse(document: &ClaimedDocument) -> Result<FieldsIn, String> {
    let content = document.content.as_ref()?;
    serde_json::from_slice(content).map_err(|error| error.to_string())
}

fn read_all(store: &FileGroupStore) -> Result<Snapshot, StoreError> {
    let mut snapshot = Snapshot::default();
    let dir = store.dir.as_path();
    let table_path = dir.join(TABLE_FILE);
    if let Some(document) = store.file(TABLE_FILE)?.read_now()? {
        match parse(&document) {
            Ok(FieldsIn { deleted: true, .. }) => {}
            Ok(FieldsIn { generation, table: Some(table), .. }) => {
                snapshot.table = Some(Stored { version: Version(generation), value: table });
            }
            Ok(_) => return Err(StoreError::Rejected(format!("corrupt record {}: no table", table_path.display()))),
            Err(reason) => {
                return Err(StoreError::Rejected(format!("corrupt record {}: {reason}", table_path.display())))
            }
        }
    }
    let entries = fs::read_dir(dir).map_err(|error| io_error("list", dir, error))?;
    for entry in entries {
        let entry = entry.map_err(|error| io_error("list", dir, error))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(MEMBER_PREFIX) || !name.ends_with(".json") {
            continue;
        }
        let path = entry.path();
        let Some(document) = store.file(name)?.read_now()? else { continue };
        match parse(&document) {
            Ok(FieldsIn { deleted: true, .. }) => {}
            Ok(FieldsIn { generation, member: Some(member), .. })
                if file_name(&Key::Member(member.identity.clone())) == name =>
            {
                snapshot
                    .members
                    .insert(member.identity.clone(), Stored { version: Version(generation), value: member });
            }
            Ok(_) => tracing::warn!(path = %path.display(), "ignoring a member file that names another member"),
            Err(reason) => {
                tracing::warn!(path = %path.display(), %reason, "ignoring a member file that does not parse")
            }
        }
    }
    Ok(snapshot)
}

fn io_error(action: &str, path: &Path, error: io::Error) -> StoreError {
    StoreError::Unavailable(format!("cannot {action} {}: {error}", path.display()))
}

#[async_trait]
impl GroupStore for FileGroupStore {
    fn describe(&self) -> String {
        format!("file://{}", self.dir.display())
    }

    async fn read(&self) -> Result<Snapshot, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || read_all(&store))
            .await
            .map_err(|error| StoreError::Unavailable(format!("file store worker failed: {error}")))?
    }

    async fn write(&self, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError> {
        let file = self.file(&file_name(key))?;
        let fields = match value {
            Value::Table(table) => FieldsOut { table: Some(table), member: None, deleted: false },
            Value::Member(member) => FieldsOut { table: None, member: Some(member), deleted: false },
        };
        for _ in 0..CREATE_ATTEMPTS {
            let base = match (expected, self.state(key, &file).await?) {
                (None, State::Absent(base)) => base,
                (None, _) => return Err(StoreError::AlreadyExists),
                (Some(expected), State::Live { generation, version }) if generation == expected.0 => Some(version),
                (Some(_), _) => return Err(StoreError::Conflict),
            };
            match file.write(base.as_ref(), &fields).await {
                Ok(written) => return Ok(Version(written.generation.unwrap_or_default())),
                // A create from no record found one written meanwhile: look at what it is.
                Err(error) if expected.is_none() && error.is_conflict() => continue,
                Err(error) => return Err(error),
            }
        }
        Err(StoreError::AlreadyExists)
    }

    async fn delete(&self, key: &Key, expected: Version) -> Result<(), StoreError> {
        let file = self.file(&file_name(key))?;
        match self.state(key, &file).await? {
            State::Live { generation, version } if generation == expected.0 => {
                let tombstone = FieldsOut { table: None, member: None, deleted: true };
                file.write(Some(&version), &tombstone).await.map(drop)
            }
            _ => Err(StoreError::Conflict),
        }
    }

    fn watch(&self) -> Option<ChangeStream> {
        let dir = self.dir.clone();
        let events = (|| {
            let inotify = Inotify::init()?;
            let mask = WatchMask::MOVED_TO
                | WatchMask::CREATE
                | WatchMask::CLOSE_WRITE
                | WatchMask::DELETE
                | WatchMask::ONLYDIR;
            inotify.watches().add(dir.as_path(), mask)?;
            inotify.into_event_stream([0u8; 4096])
        })();
        Some(match events {
            Ok(events) => Box::pin(events.filter_map(|event| async move {
                match event {
                    Ok(event) => {
                        let name = event.name.as_ref().and_then(|n| n.to_str()).unwrap_or("");
                        // Claims and temporary files are no change.
                        (!name.starts_with('.')).then_some(Ok(()))
                    }
                    Err(error) => Some(Err(StoreError::Unavailable(format!("inotify: {error}")))),
                }
            })),
            Err(error) => Box::pin(futures::stream::iter([Err(io_error("watch", &dir, error))])),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::MemberState;
    use std::time::Duration;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tenure-group-file-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn member(id: &str) -> MemberRecord {
        MemberRecord {
            identity: id.into(),
            incarnation: 1,
            epoch: 1,
            state: MemberState::Alive,
            lease_millis: 15_000,
            weight: 1,
            partition_count: 8,
            renewals: 0,
            capabilities: None,
        }
    }

    #[tokio::test]
    async fn writes_compare_versions_and_reads_see_every_record() {
        let store = FileGroupStore::open(scratch("cas")).unwrap();
        let key = Key::Member("ns/a b".into());
        let v1 = store.write(&key, None, &Value::Member(member("ns/a b"))).await.unwrap();
        assert_eq!(store.write(&key, None, &Value::Member(member("ns/a b"))).await, Err(StoreError::AlreadyExists));
        let v2 = store.write(&key, Some(v1), &Value::Member(member("ns/a b"))).await.unwrap();
        assert_eq!(store.write(&key, Some(v1), &Value::Member(member("ns/a b"))).await, Err(StoreError::Conflict));
        store.write(&Key::Table, None, &Value::Table(PartitionTable::new(8))).await.unwrap();
        let snapshot = store.read().await.unwrap();
        assert_eq!(snapshot.members["ns/a b"].version, v2);
        assert_eq!(snapshot.table.unwrap().value.partition_count, 8);
        fs::remove_dir_all(store.dir()).unwrap();
    }

    #[tokio::test]
    async fn a_deleted_record_recreated_never_reuses_a_version() {
        let store = FileGroupStore::open(scratch("delete")).unwrap();
        let key = Key::Member("a".into());
        let v1 = store.write(&key, None, &Value::Member(member("a"))).await.unwrap();
        let v2 = store.write(&key, Some(v1), &Value::Member(member("a"))).await.unwrap();
        assert_eq!(store.delete(&key, v1).await, Err(StoreError::Conflict));
        store.delete(&key, v2).await.unwrap();
        assert!(store.read().await.unwrap().members.is_empty());
        assert_eq!(store.delete(&key, v2).await, Err(StoreError::Conflict));
        let again = store.write(&key, None, &Value::Member(member("a"))).await.unwrap();
        assert!(again > v2, "recreated at {again}, deleted at {v2}");
        assert_eq!(store.write(&key, Some(v2), &Value::Member(member("a"))).await, Err(StoreError::Conflict));
        fs::remove_dir_all(store.dir()).unwrap();
    }

    /// What a member stopped (SIGSTOP, a frozen VM) between its claim and its rename leaves: its
    /// document in a temporary file, hard-linked as the claim of the record's next generation.
    fn stopped_writer(dir: &Path, key: &Key, generation: u64, document: &str) -> PathBuf {
        let name = file_name(key);
        let temp = dir.join(format!(".{name}.tmp.{}.999999999", std::process::id()));
        fs::write(&temp, document).unwrap();
        fs::hard_link(&temp, dir.join(format!(".{name}.claim.{generation}"))).unwrap();
        temp
    }

    #[tokio::test]
    async fn a_member_stopped_in_the_middle_of_a_write_blocks_nobody_and_its_write_never_lands() {
        let store = FileGroupStore::open(scratch("stopped")).unwrap();
        let key = Key::Member("a".into());
        let v1 = store.write(&key, None, &Value::Member(member("a"))).await.unwrap();
        let table = store.write(&Key::Table, None, &Value::Table(PartitionTable::new(8))).await.unwrap();
        let stale = r#"{"generation":2,"member":{"identity":"a","incarnation":9}}"#;
        let stale = stopped_writer(store.dir(), &key, v1.0 + 1, stale);

        // The others' writes never meet it; the member's own next write takes its claim over.
        store.write(&Key::Table, Some(table), &Value::Table(PartitionTable::new(8))).await.unwrap();
        store.write(&Key::Member("b".into()), None, &Value::Member(member("b"))).await.unwrap();
        let renewed = MemberRecord { renewals: 1, ..member("a") };
        let v2 = store.write(&key, Some(v1), &Value::Member(renewed.clone())).await.unwrap();

        // The stopped member resumes: its rename fails, the record stays.
        assert_eq!(fs::rename(&stale, store.dir().join(file_name(&key))).unwrap_err().kind(), io::ErrorKind::NotFound);
        let snapshot = store.read().await.unwrap();
        assert_eq!(snapshot.members["a"].version, v2);
        assert_eq!(snapshot.members["a"].value, renewed);
        assert_eq!(snapshot.members.len(), 2);
        fs::remove_dir_all(store.dir()).unwrap();
    }

    #[tokio::test]
    async fn a_deleted_record_is_a_tombstone_that_its_member_writes_over_when_it_joins_again() {
        let store = FileGroupStore::open(scratch("tombstone")).unwrap();
        let key = Key::Member("a".into());
        let v1 = store.write(&key, None, &Value::Member(member("a"))).await.unwrap();
        store.delete(&key, v1).await.unwrap();
        let path = store.dir().join(file_name(&key));
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("{{\"generation\":{},\"deleted\":true}}\n", v1.0 + 1));
        assert!(store.read().await.unwrap().members.is_empty());
        let tombstone = Version(v1.0 + 1);
        assert_eq!(store.write(&key, Some(tombstone), &Value::Member(member("a"))).await, Err(StoreError::Conflict));
        assert_eq!(store.delete(&key, tombstone).await, Err(StoreError::Conflict));
        let again = store.write(&key, None, &Value::Member(member("a"))).await.unwrap();
        assert_eq!(again, Version(v1.0 + 2));
        assert_eq!(store.read().await.unwrap().members["a"].version, again);
        fs::remove_dir_all(store.dir()).unwrap();
    }

    #[tokio::test]
    async fn a_member_file_that_does_not_parse_is_replaced_when_its_member_joins() {
        let store = FileGroupStore::open(scratch("garbage")).unwrap();
        let key = Key::Member("a".into());
        fs::write(store.dir().join(file_name(&key)), "{\"generation\":4,\"member\":").unwrap();
        assert!(store.read().await.unwrap().members.is_empty());
        let version = store.write(&key, None, &Value::Member(member("a"))).await.unwrap();
        assert_eq!(store.read().await.unwrap().members["a"].version, version);
        fs::remove_dir_all(store.dir()).unwrap();
    }

    #[tokio::test]
    async fn a_corrupt_table_fails_reads_and_a_corrupt_member_file_is_skipped() {
        let store = FileGroupStore::open(scratch("corrupt")).unwrap();
        store.write(&Key::Member("a".into()), None, &Value::Member(member("a"))).await.unwrap();
        fs::write(store.dir().join(file_name(&Key::Member("b".into()))), "not json").unwrap();
        let snapshot = store.read().await.unwrap();
        assert_eq!(snapshot.members.keys().collect::<Vec<_>>(), vec!["a"]);
        fs::write(store.dir().join(TABLE_FILE), "{").unwrap();
        assert!(matches!(store.read().await, Err(StoreError::Rejected(_))));
        fs::remove_dir_all(store.dir()).unwrap();
    }

    #[tokio::test]
    async fn the_watch_reports_a_write_of_another_handle() {
        let dir = scratch("watch");
        let store = FileGroupStore::open(&dir).unwrap();
        let mut changes = store.watch().unwrap();
        let other = FileGroupStore::open(&dir).unwrap();
        other.write(&Key::Table, None, &Value::Table(PartitionTable::new(4))).await.unwrap();
        let change = tokio::time::timeout(Duration::from_secs(10), changes.next()).await.unwrap();
        assert_eq!(change, Some(Ok(())));
        fs::remove_dir_all(&dir).unwrap();
    }
}
