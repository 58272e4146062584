//! A group kept in a directory: the members of a group on one host, with nothing to install.
//!
//! The approach of `tenure::locks::file`, for several records: one file per record in the group's
//! directory (`table.json`, `member-<hex of identity>.json`), each one line of JSON
//! `{"generation":N,"table":{..}}` or `{"generation":N,"member":{..}}`, so `cat` shows the group.
//!
//! - **Writes** take an exclusive `flock` on `<dir>/.lock` (never renamed or deleted), read the
//!   record's generation, compare it with the expected version, write the new document to a
//!   temporary file in the directory and rename it over the record: every write is atomic, and an
//!   error always means it did not happen. The version of a record is its generation (+1 per
//!   write). A **delete** (of a departed member's record) removes the file under the same flock
//!   and remembers the highest generation ever deleted in the `.lock` file; a create starts above
//!   it, so a version never names two contents, even across a deletion.
//! - **Reads** take no lock: the table first, then every member file (a member writes its record
//!   before it claims anything, so every owner named in the table is found).
//! - **Changes** come from inotify on the directory (a rename onto a record, a close after
//!   writing one in place, a deletion); each burst of events is one notification.
//! - **No fsync**: the group coordinates live processes; after a power loss everyone starts afresh
//!   and waits out the leases it sees.
//!
//! A record file that does not parse is left out of the snapshot with a warning (a member record)
//! or makes the read fail with `StoreError::Rejected` (the table): nobody claims anything until it
//! is repaired, and members keep renewing.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use inotify::{Inotify, WatchMask};
use serde::{Deserialize, Serialize};

use crate::record::{MemberRecord, PartitionTable};
use crate::store::{ChangeStream, GroupStore, Key, Snapshot, StoreError, Stored, Value, Version};

/// How long a write waits for another process's write to finish.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Pause between two attempts to take the flock.
const LOCK_RETRY: Duration = Duration::from_millis(1);
/// Documents larger than this are not parsed (a table of 16 384 partitions is about 1 MiB).
const MAX_DOCUMENT_BYTES: u64 = 4 * 1024 * 1024;
const TABLE_FILE: &str = "table.json";
const MEMBER_PREFIX: &str = "member-";
const SIDECAR: &str = ".lock";

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

#[derive(Serialize)]
struct DocumentOut<'a> {
    generation: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    table: Option<&'a PartitionTable>,
    #[serde(skip_serializing_if = "Option::is_none")]
    member: Option<&'a MemberRecord>,
}

#[derive(Deserialize)]
struct DocumentIn {
    generation: u64,
    #[serde(default)]
    table: Option<PartitionTable>,
    #[serde(default)]
    member: Option<MemberRecord>,
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
}

impl FileGroupStore {
    /// Opens (creating with mode 0700 if missing) the group directory `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, FileStoreError> {
        let dir = dir.as_ref();
        let directory_error = |error| FileStoreError::Directory { path: dir.to_owned(), error };
        DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(directory_error)?;
        let dir = std::path::absolute(dir).map_err(directory_error)?;
        Ok(FileGroupStore { dir: Arc::new(dir) })
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Path) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || work(&dir))
            .await
            .map_err(|error| StoreError::Unavailable(format!("file store worker failed: {error}")))?
    }
}

fn file_name(key: &Key) -> String {
    match key {
        Key::Table => TABLE_FILE.to_owned(),
        Key::Member(id) => format!("{MEMBER_PREFIX}{}.json", crate::codec::hex(id)),
    }
}

fn io_error(action: &str, path: &Path, error: io::Error) -> StoreError {
    StoreError::Unavailable(format!("cannot {action} {}: {error}", path.display()))
}

/// Reads one record file; `None` when it does not exist.
fn read_document(path: &Path) -> Result<Option<Result<DocumentIn, String>>, StoreError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io_error("open", path, error)),
    };
    let mut content = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(file, MAX_DOCUMENT_BYTES + 1), &mut content)
        .map_err(|error| io_error("read", path, error))?;
    if content.len() as u64 > MAX_DOCUMENT_BYTES {
        return Ok(Some(Err(format!("larger than {MAX_DOCUMENT_BYTES} bytes"))));
    }
    Ok(Some(serde_json::from_slice::<DocumentIn>(&content).map_err(|error| error.to_string())))
}

fn read_all(dir: &Path) -> Result<Snapshot, StoreError> {
    let mut snapshot = Snapshot::default();
    let table_path = dir.join(TABLE_FILE);
    match read_document(&table_path)? {
        None => {}
        Some(Ok(DocumentIn { generation, table: Some(table), .. })) => {
            snapshot.table = Some(Stored { version: Version(generation), value: table });
        }
        Some(Ok(_)) => return Err(StoreError::Rejected(format!("corrupt record {}: no table", table_path.display()))),
        Some(Err(reason)) => {
            return Err(StoreError::Rejected(format!("corrupt record {}: {reason}", table_path.display())))
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
        match read_document(&path)? {
            None => {}
            Some(Ok(DocumentIn { generation, member: Some(member), .. }))
                if file_name(&Key::Member(member.identity.clone())) == name =>
            {
                snapshot
                    .members
                    .insert(member.identity.clone(), Stored { version: Version(generation), value: member });
            }
            Some(Ok(_)) => tracing::warn!(path = %path.display(), "ignoring a member file that names another member"),
            Some(Err(reason)) => {
                tracing::warn!(path = %path.display(), %reason, "ignoring a member file that does not parse")
            }
        }
    }
    Ok(snapshot)
}

/// Takes the group's flock, polling for at most [`LOCK_WAIT`].
fn lock(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(SIDECAR);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|error| io_error("open", &path, error))?;
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        // SAFETY: flock only takes a descriptor, which `file` keeps open for the whole call.
        let result = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if result == 0 {
            return Ok(file);
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EWOULDBLOCK) | Some(libc::EINTR) => {}
            _ => return Err(io_error("flock", &path, error)),
        }
        if Instant::now() >= deadline {
            return Err(StoreError::Unavailable(format!("{} was held for more than {LOCK_WAIT:?}", path.display())));
        }
        std::thread::sleep(LOCK_RETRY);
    }
}

/// The highest generation of a deleted record, kept in the flocked `.lock` file (0: none).
fn deleted_high_water(flock: &File) -> u64 {
    let mut text = String::new();
    let _ = io::Read::read_to_string(&mut &*flock, &mut text);
    text.trim().parse().unwrap_or(0)
}

fn delete_record(dir: &Path, key: &Key, expected: Version) -> Result<(), StoreError> {
    let flock = lock(dir)?;
    let path = dir.join(file_name(key));
    match read_document(&path)? {
        Some(Ok(document)) if document.generation == expected.0 => {}
        _ => return Err(StoreError::Conflict),
    }
    let high_water = deleted_high_water(&flock).max(expected.0);
    let sidecar = dir.join(SIDECAR);
    let remember = flock.set_len(0).and_then(|()| {
        let mut file = &flock;
        io::Seek::seek(&mut file, io::SeekFrom::Start(0))?;
        file.write_all(high_water.to_string().as_bytes())
    });
    remember.map_err(|error| io_error("write", &sidecar, error))?;
    fs::remove_file(&path).map_err(|error| io_error("delete", &path, error))
}

fn write_record(dir: &Path, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError> {
    static TEMP_FILES: AtomicU64 = AtomicU64::new(0);
    let flock = lock(dir)?;
    let path = dir.join(file_name(key));
    let current = match read_document(&path)? {
        None => None,
        Some(Ok(document)) => Some(document.generation),
        // Content that does not parse can only be replaced by a create-less write: conflict.
        Some(Err(_)) => Some(0),
    };
    let generation = match (expected, current) {
        (None, Some(_)) => return Err(StoreError::AlreadyExists),
        (None, None) => deleted_high_water(&flock) + 1,
        (Some(_), None) => return Err(StoreError::Conflict),
        (Some(expected), Some(current)) if expected.0 != current => return Err(StoreError::Conflict),
        (Some(_), Some(current)) => current + 1,
    };
    let document = match value {
        Value::Table(table) => DocumentOut { generation, table: Some(table), member: None },
        Value::Member(member) => DocumentOut { generation, table: None, member: Some(member) },
    };
    let mut content = serde_json::to_vec(&document)
        .map_err(|error| StoreError::Unavailable(format!("cannot encode {key}: {error}")))?;
    content.push(b'\n');
    let temp = dir.join(format!(".tmp.{}.{}", std::process::id(), TEMP_FILES.fetch_add(1, Ordering::Relaxed)));
    let result = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&temp)
        .and_then(|mut file| file.write_all(&content))
        .and_then(|()| fs::rename(&temp, &path));
    if let Err(error) = result {
        let _ = fs::remove_file(&temp);
        return Err(io_error("write", &path, error));
    }
    Ok(Version(generation))
}

#[async_trait]
impl GroupStore for FileGroupStore {
    fn describe(&self) -> String {
        format!("file://{}", self.dir.display())
    }

    async fn read(&self) -> Result<Snapshot, StoreError> {
        self.blocking(read_all).await
    }

    async fn write(&self, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError> {
        let (key, value) = (key.clone(), value.clone());
        self.blocking(move |dir| write_record(dir, &key, expected, &value)).await
    }

    async fn delete(&self, key: &Key, expected: Version) -> Result<(), StoreError> {
        let key = key.clone();
        self.blocking(move |dir| delete_record(dir, &key, expected)).await
    }

    fn watch(&self) -> Option<ChangeStream> {
        let dir = self.dir.clone();
        let events = (|| {
            let inotify = Inotify::init()?;
            let mask = WatchMask::MOVED_TO | WatchMask::CLOSE_WRITE | WatchMask::DELETE | WatchMask::ONLYDIR;
            inotify.watches().add(dir.as_path(), mask)?;
            inotify.into_event_stream([0u8; 4096])
        })();
        Some(match events {
            Ok(events) => Box::pin(events.filter_map(|event| async move {
                match event {
                    Ok(event) => {
                        let name = event.name.as_ref().and_then(|n| n.to_str()).unwrap_or("");
                        // Our own sidecar and temporary files are no change.
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
