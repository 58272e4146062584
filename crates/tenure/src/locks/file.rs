//! The embedded file lock: leader election between processes on one host, with nothing to install.
//!
//! Why it exists: the replicas of a service on one machine (or `tenure run -- cmd` instances) need
//! a lock that every process can reach, that survives any of them being killed, and that tells
//! the others the moment it is released. A file in a private directory does all three: an
//! exclusive `link` orders the writers without a lock anyone holds, `rename` makes every update
//! atomic, and inotify pushes changes.
//!
//! # File format
//!
//! The lock at `<dir>/<name>` is one line of JSON, so `cat` shows who leads:
//!
//! ```text
//! {"generation":7,"record":{"holderIdentity":"a","leaseDurationSeconds":15,"acquireTime":"2024-05-01T10:00:00Z","renewTime":"2024-05-01T10:00:30Z","leaderTransitions":2}}
//! ```
//!
//! - `generation` counts the writes since the file was created (1 after `create`, +1 per update).
//! - `record` is the client-go `LeaderElectionRecord`, byte for byte as client-go writes it.
//!
//! The [`Version`](crate::Version) of a stored record is `<generation>-<hash>`, where `<hash>` is
//! a 64-bit FNV-1a hash of the whole file: the generation orders honest writes, the hash makes a
//! version name that exact content, so a file that is deleted and created again (generation 1
//! again) never matches a version read before the deletion. Content that is not such a document
//! (a foreign writer, a truncated file after a power loss, an operator's typo) is reported as
//! `record: Err(RecordError::Malformed(..))` with version `raw-<hash>`; the elector waits out a
//! lease and then replaces it through the usual compare-and-swap. A document whose `record` is
//! present but invalid keeps its `<generation>-<hash>` version and reports the record's error.
//!
//! # Protocol
//!
//! - **Reads** take no lock: they open the file and read it. Writers never modify the file in
//!   place, so a reader sees one complete version or the absence of the file.
//! - **Writes** (`create`, `update`) hold no lock at all, so no writer can block another, even
//!   one stopped in the middle of a write (SIGSTOP, a frozen VM: a kernel `flock` cannot be taken
//!   from a stopped process, and used to stall every other writer until it thawed). An update is
//!   a compare-and-swap from the state it read (generation `g`):
//!   1. write the new document (generation `g + 1`) to a temporary file of its own
//!      (`.<name>.tmp.<pid>.<pid namespace>.<nonce>.<counter>`) in the same directory, created
//!      with `O_EXCL`;
//!   2. **claim** the generation: hard-link that file as `.<name>.claim.<g + 1>`. `link` fails if
//!      the name exists, so of the writers that read the same state, one claims;
//!   3. read the file again: if it is no longer the state read in step 1, give up (conflict);
//!   4. rename the temporary file over the file.
//!
//!   A writer that finds the claim taken by a writer still at work (its temporary file exists)
//!   first reads the file again (changed: conflict at once), then waits for that rename at most
//!   [`with_lock_wait`](crate::locks::file::FileLock::with_lock_wait) (20 ms by default) on its
//!   own monotonic clock; then it **takes the claim over**: it removes that writer's temporary
//!   file, so that writer's rename fails (`ENOENT`) whenever it resumes, and goes on to the next
//!   generation. The removal and the rename exclude each other (both act on the one name of that
//!   file): either the stopped write landed first, and this write conflicts, or it can never
//!   land. A claim that can never land (its temporary file is gone, or it is the file itself) is
//!   dead, and its generation is skipped. Claims are never removed by their writers, even when
//!   their write fails: a name once claimed stays taken until the file's generation has passed
//!   it, so writers from one state meet at the same name however many generations they skip.
//!   Writers remove claims below the file's generation, whose writers' state is gone (they can
//!   never land); the claim of the file's own generation stays as the high-water mark.
//!   A **create** links its temporary file as the file itself (`link` fails if it exists): one
//!   atomic step. It first waits for (or takes over) every pending claim, since a writer that
//!   read the file before it was deleted may be about to rename over it, and continues above the
//!   highest claim: generations never go down, even across a deletion. A write over content
//!   without a generation (a foreign or torn file) does the same, then takes over every other
//!   pending claim after its own.
//!   The generation `g` a writer continues from is the document's only if this protocol wrote
//!   it: then the claim of `g` is the file itself (the claimed temporary file was renamed into
//!   place, or a create linked it as both). A document anyone else wrote, whatever generation it
//!   shows, is content without one: its number never enters the count, so a foreign or
//!   hand-written `"generation": 18446744073709551614` is replaced like any other content and
//!   counting goes on above the claims. Generations stop at 2^53 - 1, which only the protocol's
//!   own writes can reach (285,000 years at one a millisecond); there a write is refused
//!   ([`LockError::Rejected`](crate::LockError::Rejected), naming the files to remove), never
//!   retried forever.
//!
//!   **Why no two writers share a temporary file.** A takeover removes a file by name, and the
//!   held writer's rename moves whatever has that name: if another writer could create the same
//!   name meanwhile, the held writer's rename would land that writer's document and be told Ok.
//!   So the name is unique among the writers alive on the host: the pid and the inode of the PID
//!   namespace name one live process (containers sharing the volume are each PID 1 of their own
//!   namespace, so the pid alone does not); a 64-bit nonce drawn once per process keeps writers
//!   apart where the namespace cannot be told (no `/proc`, sandboxes that show every namespace
//!   alike); the counter separates a process's own files; `O_EXCL` never adopts a dead
//!   writer's leftover.
//!
//!   **Why a dead claim stays dead.** A claim is judged dead when a takeover finds no temporary
//!   file with its inode; a writer remembers that for the rest of its call under the claim's
//!   generation *and* inode, never the inode alone: once a dead claim's file is removed, the file
//!   system may give its inode number to another writer's temporary file (ext4 does), whose
//!   claim of another generation is live. A takeover that finds the temporary file but cannot
//!   remove it (another user's, in a sticky directory) fails the write with an error: only
//!   `ENOENT` means the write can no longer land.
//!
//!   A pending claim none of whose links is a temporary file can never land (its writer links
//!   the claim to a temporary file it made first): it is dead at first sight, without the wait.
//!
//!   **Fenced writes** ([`FileLock::write_fenced`]) use the same claim to write a file *beside*
//!   the lock: claim the next generation with a temporary file holding the new content, check
//!   that the lock still shows the tenure, rename the temporary file onto the target. A writer
//!   of the lock must get past that claim (wait, or take it over, which removes the temporary
//!   file and makes the rename fail), so the target changes before the next tenure's first
//!   write or not at all. The claim then stays linked to the target, dead at first sight.
//!
//!   Every error before the rename leaves the file untouched, so an error from this lock always
//!   means the write did not happen (a caller that times out and drops the call cannot know, as
//!   with any store). The directory must be on a local file system: the protocol relies on
//!   `link`, `rename` and link counts as the kernel sees them at once (not NFS).
//! - **Upgrading** from a release that wrote under a `flock` (on `<name>.lock`): those writers and
//!   these do not exclude each other; stop every candidate of one lock before upgrading, or
//!   upgrade them all at once. The `<name>.lock` file is no longer used and may be removed.
//!   Writers of releases before the PID-namespace nonce share this protocol, with one
//!   difference: they continue from any document's generation, written by hand or not; do not
//!   edit the file by hand while such writers run.
//! - **No fsync.** The lock coordinates live processes; a power loss or kernel crash kills all of
//!   them. What the file then holds does not matter for safety (whoever starts next waits a whole
//!   lease after seeing any record, invariant S3), and if it is left empty or torn it is read as
//!   a malformed record and taken over after one lease. Skipping `fsync` keeps a renewal from
//!   waiting behind unrelated disk flushes, which could otherwise eat into the renew deadline;
//!   the default location (`$XDG_RUNTIME_DIR`) is a tmpfs where fsync does nothing anyway.
//! - **Killed writers** leave at most one temporary file and one claim. After a handle's first
//!   write, every `create` and every 128th write, the writer removes temporary files of processes
//!   of its own PID namespace that no longer exist, any older than a minute (a writer of another
//!   namespace is looked up by age only: its pid would name another process here), and claims of
//!   generations below the file's. Readers never look at them.
//! - **Anything else at the path** (a directory, a FIFO, a file over 64 KiB) reads as a malformed
//!   record too, without hanging or reading without bound.
//!
//! # Change notification
//!
//! [`RecordLock::watch`](crate::RecordLock::watch) uses inotify on the directory, filtered to
//! the file's name: a rename onto it (every Tenure update), its creation (a Tenure create links a
//! complete file into place), a close after writing it in place (a foreign writer, whose file may
//! also be read once right after its creation, before it wrote), its deletion or a rename away.
//! Each burst of events gives one read of the file; a state equal to the one delivered just before
//! is not repeated. If inotify cannot be set up, or the directory disappears, the stream yields one
//! [`LockError::Unavailable`](crate::LockError::Unavailable) and ends; the elector then reads at
//! its retry period and reopens the watch, so followers fall back to polling until inotify works
//! again (returning `None` instead would make them poll forever). The stream must be polled
//! inside a tokio runtime with IO enabled (the default).
//!
//! # Permissions
//!
//! Missing directories are created with mode 0700 and the file with 0644 (less the umask): by
//! default only the owner takes part, and whoever may enter the directory may read who leads.
//! Processes of several users can share a lock in a directory they may all write to (without the
//! sticky bit, which would keep them from replacing each other's files).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{stream, FutureExt, StreamExt};
use inotify::{EventMask, EventStream, Inotify, WatchMask};
use rand::RngExt;
use serde::{Deserialize, Serialize};

use crate::lock::{ChangeStream, LockError, RecordLock, StoredRecord, Version};
use crate::record::{LeaderElectionRecord, RecordError};
use crate::term::Term;

/// How long a write waits by default for another writer's pending claim to land before it takes
/// the claim over: far longer than the few system calls between a claim and its rename, far
/// shorter than any lease.
const DEFAULT_STEAL_AFTER: Duration = Duration::from_millis(20);
/// The first and the longest pause between two looks at another writer's pending claim.
const FIRST_RETRY: Duration = Duration::from_micros(100);
const LONGEST_RETRY: Duration = Duration::from_millis(5);
/// The largest generation a writer writes: 2^53 - 1, the largest integer every JSON reader holds
/// exactly. Only this protocol's own writes count towards it (see [`continued_generation`]): at
/// one write a millisecond, a lock reaches it in 285,000 years, and then its writes are refused
/// with an error that says what to remove, never retried forever.
const MAX_GENERATION: u64 = (1 << 53) - 1;
/// Documents larger than this are not parsed (no honest writer comes close).
const MAX_DOCUMENT_BYTES: u64 = 64 * 1024;
/// Every this many writes of a handle (and on its first), orphaned temporary files are removed.
const CLEAN_EVERY_WRITES: u64 = 128;
/// The longest election name [`FileLock::default_path`] accepts, in bytes.
const MAX_ELECTION_NAME_BYTES: usize = 200;
/// At most this many bytes of the file name go into temporary file names (NAME_MAX is 255).
const MAX_TEMP_STEM_BYTES: usize = 200;
/// Size of the buffer inotify events are read into (an event is at most 16 + 256 bytes).
const EVENT_BUFFER_BYTES: usize = 4096;

/// Why a [`FileLock`] could not be opened or a default path chosen.
#[derive(Debug, thiserror::Error)]
pub enum FileLockError {
    /// The election name cannot be a file name of its own in the lock directory.
    #[error("invalid election name {name:?}: {reason}")]
    InvalidElectionName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The path names a directory (or ends in `..`) rather than a file.
    #[error("lock path {} does not name a file", .0.display())]
    NotAFile(PathBuf),
    /// A file system operation failed.
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        /// What was being done (`create directory`, `inspect`, ...).
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The error the system reported.
        error: io::Error,
    },
    /// A directory others could tamper with was about to hold the lock.
    #[error("refusing to keep locks in {}: {reason}", path.display())]
    UnsafeDirectory {
        /// The directory.
        path: PathBuf,
        /// Why it is not private.
        reason: String,
    },
}

/// Why a write fenced by the file lock ([`FileLock::write_fenced`]) did not land. Nothing was
/// written in either case.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FencedWriteError {
    /// The lock no longer shows the tenure the write was made under: another candidate leads
    /// now, the tenure was released, or the lock holds something else. The writer is deposed:
    /// it must not retry under this term.
    #[error("deposed: {lock} no longer shows the tenure of term {term} (it shows {shows})")]
    Deposed {
        /// The lock, as [`RecordLock::describe`](crate::RecordLock::describe) names it.
        lock: String,
        /// The term of the tenure the write was made under.
        term: Term,
        /// What the lock shows instead.
        shows: String,
    },
    /// The lock or the target could not be read or written.
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// The paths of one lock and the state its clones share.
#[derive(Debug)]
struct Paths {
    /// The record's file, absolute.
    path: PathBuf,
    /// Its directory (watched by inotify, holds the temporary files).
    dir: PathBuf,
    /// Its file name, to filter inotify events.
    name: OsString,
    /// The start of this lock's claim names (`.<name>.claim.`), followed by a generation.
    claim_prefix: OsString,
    /// The start of this lock's temporary file names.
    temp_prefix: OsString,
    /// Writes made through this handle and its clones, to pace the cleanup of temporary files.
    writes: AtomicU64,
}

impl Paths {
    /// The claim of `generation`: taken by the one writer that creates it (`link` fails if it
    /// exists).
    fn claim(&self, generation: u64) -> PathBuf {
        let mut name = self.claim_prefix.clone();
        name.push(generation.to_string());
        self.dir.join(name)
    }
}

/// A leader election record kept in a file, shared by the processes of one host.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use tenure::{locks::file::FileLock, RecordLock};
/// let lock = FileLock::open(FileLock::default_path("my-service")?)?;
/// if let Some(stored) = lock.get().await? {
///     println!("{} is at version {}", lock.describe(), stored.version);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FileLock {
    paths: Arc<Paths>,
    steal_after: Duration,
}

impl FileLock {
    /// Opens the lock stored at `path` (creating missing parent directories with mode 0700); the
    /// file itself is created by the first `create`.
    ///
    /// Nothing is locked or read yet: opening is cheap, and every call of the lock works on the
    /// file as it is at that moment. A relative path is made absolute against the current
    /// directory now.
    pub fn open(path: impl AsRef<Path>) -> Result<FileLock, FileLockError> {
        let given = path.as_ref();
        let resolve_error = |error| FileLockError::Io { action: "resolve", path: given.to_owned(), error };
        let path = std::path::absolute(given).map_err(resolve_error)?;
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(FileLockError::NotAFile(path));
        };
        if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Err(FileLockError::NotAFile(path));
        }
        let create_error = |error| FileLockError::Io { action: "create directory", path: dir.to_owned(), error };
        create_directories(dir).map_err(create_error)?;

        // A long name is cut, with a hash of the whole name so that two locks whose names
        // share the cut part never share temporary files or claims.
        let mut stem = name.as_bytes().to_vec();
        if stem.len() > MAX_TEMP_STEM_BYTES {
            let mut hash = ContentHash::new();
            hash.add(name.as_bytes());
            stem.truncate(MAX_TEMP_STEM_BYTES - 17);
            stem.extend_from_slice(format!("~{:016x}", hash.0).as_bytes());
        }
        let hidden = |suffix: &str| {
            let mut prefix = OsString::from(".");
            prefix.push(OsStr::from_bytes(&stem));
            prefix.push(suffix);
            prefix
        };
        let paths = Paths {
            claim_prefix: hidden(".claim."),
            temp_prefix: hidden(".tmp."),
            dir: dir.to_owned(),
            name: name.to_owned(),
            path,
            writes: AtomicU64::new(0),
        };
        Ok(FileLock { paths: Arc::new(paths), steal_after: DEFAULT_STEAL_AFTER })
    }

    /// The per-user default location for an election: `$XDG_RUNTIME_DIR/tenure/<election>.json`
    /// if `XDG_RUNTIME_DIR` is set and usable, else
    /// `<std::env::temp_dir()>/tenure-<uid>/<election>.json`. Rejects election names that are
    /// empty, longer than 200 bytes, or contain '/', NUL, or are "." / "..".
    ///
    /// Why: processes that agree on an election name meet at the same file without configuring
    /// a path, and other users cannot see or disturb it. `XDG_RUNTIME_DIR` is usable when it is
    /// an absolute path to a directory owned by this (effective) user, who may write to it. The
    /// fallback directory is refused if it exists but is a symlink, belongs to someone else, or
    /// others may write to it. Nothing is created here; [`FileLock::open`] creates the directory.
    pub fn default_path(election: &str) -> Result<PathBuf, FileLockError> {
        let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR");
        default_path_in(election, runtime_dir.as_deref(), &std::env::temp_dir(), effective_uid())
    }

    /// The absolute path of the file that holds the record.
    pub fn path(&self) -> &Path {
        &self.paths.path
    }

    /// Sets how long a write waits for another process's pending write (a claim of the same
    /// generation, see the module documentation) to land before it takes that claim over
    /// (default 20 ms).
    ///
    /// Why: a writer stopped between its claim and its rename (SIGSTOP, a frozen VM) must not keep
    /// others from writing, as a held kernel lock would; taking its claim over makes its write
    /// fail whenever it resumes. Measured on this process's monotonic clock from the moment it
    /// first saw the claim. A live writer needs microseconds between the two steps; one slowed
    /// past this bound only sees its write fail (a conflict), never land late.
    #[must_use]
    pub fn with_lock_wait(mut self, wait: Duration) -> FileLock {
        self.steal_after = wait;
        self
    }

    /// Replaces the file `target` with `content` only while this lock shows the tenure `term` (a
    /// holder, and `leaderTransitions` = `term`: every tenure has a term of its own, S2), checked
    /// in the same compare-and-swap that orders the lock's own writes: a
    /// deposed leader's write is refused by the lock itself ([`FencedWriteError::Deposed`]),
    /// even one that was held (a GC pause, SIGSTOP, a frozen VM) after its last check.
    ///
    /// Why: self-fencing and a term check before the write stop a leader that knows it is
    /// deposed, not one paused between its check and its write. Here the write claims the lock's
    /// next generation as an update would, checks that the lock still shows the tenure, and
    /// renames its temporary file onto `target`. A candidate that takes the lock over must first
    /// take that claim over, which removes the temporary file: the rename then fails. So the
    /// write lands before the next tenure's first write, or never. The lock's own generation
    /// is not written (a renew of the same tenure meanwhile is no reason to refuse).
    ///
    /// `target` must be on the lock directory's file system (a rename cannot cross file
    /// systems), and is replaced atomically: readers see the old or the new content. Like the
    /// lock's own writes, no `fsync`. An error always means nothing was written.
    pub async fn write_fenced(
        &self, term: Term, target: impl AsRef<Path>, content: impl Into<Vec<u8>>,
    ) -> Result<(), FencedWriteError> {
        let target = std::path::absolute(target.as_ref()).map_err(|error| io_error("resolve", target.as_ref(), error))?;
        let content = content.into();
        let paths = self.paths.clone();
        let steal_after = self.steal_after;
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(cancelled.clone());
        let work = move || write_fenced(&paths, steal_after, &cancelled, term, &target, &content);
        tokio::task::spawn_blocking(work).await.map_err(|error| {
            LockError::Unavailable(format!("file lock {}: worker thread failed: {error}", self.paths.path.display()))
        })?
    }

    /// Runs `work` on a blocking thread; it sees a flag that turns true if the caller gives up.
    async fn run_blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Paths, Duration, &AtomicBool) -> Result<T, LockError> + Send + 'static,
    ) -> Result<T, LockError> {
        let paths = self.paths.clone();
        let steal_after = self.steal_after;
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(cancelled.clone());
        tokio::task::spawn_blocking(move || work(&paths, steal_after, &cancelled)).await.map_err(|error| {
            LockError::Unavailable(format!("file lock {}: worker thread failed: {error}", self.paths.path.display()))
        })?
    }

    /// Sets up inotify on the directory; events from now on are queued by the kernel.
    fn start_inotify(&self) -> Result<Inotify, LockError> {
        let dir = &self.paths.dir;
        let inotify = Inotify::init().map_err(|error| {
            LockError::Unavailable(format!("cannot watch {}: inotify is unavailable: {error}", dir.display()))
        })?;
        let mask = WatchMask::MOVED_TO | WatchMask::CREATE | WatchMask::MOVED_FROM | WatchMask::CLOSE_WRITE
            | WatchMask::DELETE | WatchMask::DELETE_SELF | WatchMask::MOVE_SELF | WatchMask::ONLYDIR;
        match inotify.watches().add(dir, mask) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                create_directories(dir).map_err(|error| io_error("create directory", dir, error))?;
                inotify.watches().add(dir, mask).map_err(|error| io_error("watch", dir, error))?;
            }
            Err(error) => return Err(io_error("watch", dir, error)),
        }
        Ok(inotify)
    }
}

/// Sets its flag when dropped: the async side of a call tells its blocking thread to give up.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[async_trait]
impl RecordLock for FileLock {
    fn describe(&self) -> String {
        format!("file://{}", self.paths.path.display())
    }

    async fn get(&self) -> Result<Option<StoredRecord>, LockError> {
        self.run_blocking(|paths, _, _| Ok(read_snapshot(&paths.path)?.map(|s| s.stored))).await
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        let record = record.clone();
        self.run_blocking(move |paths, wait, cancelled| write(paths, wait, cancelled, None, &record)).await
    }

    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        let (expected, record) = (expected.clone(), record.clone());
        self.run_blocking(move |paths, wait, cancelled| write(paths, wait, cancelled, Some(&expected), &record)).await
    }

    fn watch(&self) -> Option<ChangeStream> {
        Some(match self.start_inotify() {
            Ok(inotify) => Box::pin(changes(self.paths.clone(), inotify)),
            Err(error) => Box::pin(stream::once(async move { Err(error) })),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Documents and versions

/// The file as written.
#[derive(Serialize)]
struct DocumentOut<'a> {
    generation: u64,
    record: &'a LeaderElectionRecord,
}

/// The file as read: the record stays loose so that an invalid record keeps its generation.
#[derive(Deserialize)]
struct DocumentIn {
    generation: u64,
    record: serde_json::Value,
}

/// What the file holds, with what a writer needs beyond the [`StoredRecord`].
struct Snapshot {
    /// The generation to continue from, when the content has one.
    generation: Option<u64>,
    stored: StoredRecord,
}

/// A 64-bit FNV-1a hash: stable across processes, builds and Rust versions, unlike std's
/// `DefaultHasher`; collisions by accident are negligible and by intent need write access, which
/// gives an attacker the lock anyway.
struct ContentHash(u64);

impl ContentHash {
    fn new() -> Self {
        ContentHash(0xcbf2_9ce4_8422_2325)
    }

    fn add(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

impl Write for ContentHash {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.add(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn document_version(generation: u64, hash: u64) -> Version {
    Version(format!("{generation}-{hash:016x}"))
}

/// Reads the file at `path`; `None` when it does not exist.
fn read_snapshot(path: &Path) -> Result<Option<Snapshot>, LockError> {
    // Non-blocking, so that a FIFO someone put there reads as empty instead of hanging.
    let mut file = match OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io_error("open", path, error)),
    };
    let metadata = file.metadata().map_err(|error| io_error("inspect", path, error))?;
    if !metadata.is_file() {
        // A directory, FIFO or device: not a record, and its content names nothing. Its identity
        // does, so that a writer can still replace it by compare-and-swap.
        let mut hash = ContentHash::new();
        hash.add(format!("special:{}:{}:{:o}", metadata.dev(), metadata.ino(), metadata.mode()).as_bytes());
        return Ok(Some(raw_snapshot(None, hash.0, "the path is not a regular file".to_owned())));
    }
    let mut content = Vec::new();
    (&mut file).take(MAX_DOCUMENT_BYTES + 1).read_to_end(&mut content).map_err(|error| io_error("read", path, error))?;
    let mut hash = ContentHash::new();
    hash.add(&content);
    if content.len() as u64 > MAX_DOCUMENT_BYTES {
        // Hash the rest too, so that the version still names this exact content.
        io::copy(&mut file, &mut hash).map_err(|error| io_error("read", path, error))?;
        let reason = format!("the file is larger than {MAX_DOCUMENT_BYTES} bytes");
        return Ok(Some(raw_snapshot(None, hash.0, reason)));
    }
    Ok(Some(decode(&content, hash.0)))
}

fn decode(content: &[u8], hash: u64) -> Snapshot {
    match serde_json::from_slice::<DocumentIn>(content) {
        Ok(document) => {
            let version = document_version(document.generation, hash);
            let record = LeaderElectionRecord::from_json(&document.record.to_string());
            Snapshot { generation: Some(document.generation), stored: StoredRecord { version, record } }
        }
        Err(error) => {
            // Keep counting from a generation that survived, so versions keep increasing.
            let generation = serde_json::from_slice::<serde_json::Value>(content)
                .ok()
                .and_then(|value| value.get("generation").and_then(serde_json::Value::as_u64));
            raw_snapshot(generation, hash, format!("not a tenure file lock document: {error}"))
        }
    }
}

/// The generation a writer continues from: the document's, if this protocol wrote it, which shows
/// in the claim of that generation being the file itself (a write renames its claimed temporary
/// file into place, a create links it as both). Content written by anyone else, whatever
/// generation it shows (near the top of the range included), gives none: it is replaced like
/// content without a generation, above every claim, so a foreign number never enters the count.
fn continued_generation(paths: &Paths, generation: u64, file_inode: Option<(u64, u64)>) -> Option<u64> {
    let ours = generation < MAX_GENERATION && file_inode.is_some() && inode_of(&paths.claim(generation)) == file_inode;
    ours.then_some(generation)
}

/// The generation after `generation`, or the refusal to count past [`MAX_GENERATION`].
fn next_generation(paths: &Paths, generation: u64) -> Result<u64, LockError> {
    generation.checked_add(1).filter(|next| *next <= MAX_GENERATION).ok_or_else(|| {
        LockError::Rejected(format!(
            "the generations of {} are exhausted (claims up to {MAX_GENERATION} exist): remove the file and its \
             .claim.* files with every candidate stopped",
            paths.path.display()
        ))
    })
}

fn raw_snapshot(generation: Option<u64>, hash: u64, reason: String) -> Snapshot {
    let version = Version(format!("raw-{hash:016x}"));
    Snapshot { generation, stored: StoredRecord { version, record: Err(RecordError::Malformed(reason)) } }
}

// ---------------------------------------------------------------------------------------------
// Writing

/// Creates (`expected == None`) or updates the record by compare-and-swap, holding nothing that a
/// stopped process could keep from others (see "Protocol" in the module documentation).
fn write(
    paths: &Paths, steal_after: Duration, cancelled: &AtomicBool,
    expected: Option<&Version>, record: &LeaderElectionRecord,
) -> Result<Version, LockError> {
    let writes = paths.writes.fetch_add(1, Ordering::Relaxed);
    #[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; the workspace supports 1.80
    let tidy = expected.is_none() || writes % CLEAN_EVERY_WRITES == 0;
    let mut others = OtherClaims::default();
    loop {
        if cancelled.load(Ordering::Relaxed) {
            return Err(cancelled_error(paths));
        }
        let current = read_snapshot(&paths.path)?;
        match (expected, &current) {
            (None, Some(_)) => return Err(LockError::AlreadyExists),
            (Some(_), None) => return Err(LockError::Conflict),
            (Some(expected), Some(current)) if current.stored.version != *expected => return Err(LockError::Conflict),
            _ => {}
        }
        let base = current.as_ref().map(|c| c.stored.version.clone());
        let stale = || -> Result<bool, LockError> {
            Ok(read_snapshot(&paths.path)?.map(|c| c.stored.version) != base)
        };
        let lost = if expected.is_none() { LockError::AlreadyExists } else { LockError::Conflict };
        let file_inode = inode_of(&paths.path);
        let continued = current.as_ref().and_then(|c| continued_generation(paths, c.generation?, file_inode));
        let generation = match continued {
            // Writers from one state contend for one name: the next generation.
            Some(generation) => next_generation(paths, generation)?,
            // No generation to continue from (no file, or content without one): continue above
            // every claim, so that generations never go down, once no claim is pending (a
            // writer that read the file before it was deleted or replaced, and may be about to
            // rename over it).
            None => {
                // Only here is the directory listed: an update from a generation reads no more.
                let claims = list_claims(paths);
                match others.first_pending(&claims, file_inode, steal_after, paths)? {
                    Wait::Pause(pause) => {
                        std::thread::sleep(pause);
                        continue;
                    }
                    Wait::TakenOver => continue,
                    Wait::None => {}
                }
                next_generation(paths, claims.keys().next_back().copied().unwrap_or(0))?
            }
        };
        if current.is_none() {
            // A create is one atomic step: `link` fails if the file exists.
            let (temp, content) = TempFile::document(paths, generation, record)?;
            match fs::hard_link(&temp.path, &paths.path) {
                Ok(()) => {
                    // The claim of the file's generation stays as the generations' high-water mark.
                    let _ = fs::hard_link(&temp.path, paths.claim(generation));
                    if tidy {
                        remove_leftovers(paths, generation);
                    }
                    return Ok(content_version(generation, &content));
                }
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Err(LockError::AlreadyExists),
                Err(error) => return Err(io_error("create", &paths.path, error)),
            }
        }
        let claiming = Claiming { paths, steal_after, cancelled, file_inode };
        let (generation, (temp, content)) =
            claiming.claim(&mut others, generation, &stale, lost, |g| TempFile::document(paths, g, record))?;
        // Without a generation to contend on (content without one), writers from that content
        // may hold other claims: take each over. Of two such writers, one's takeover of the
        // other fails only if the other's rename came first, and then the check below fails.
        if continued.is_none() {
            let own = inode_of(&temp.path);
            for (claimed, claim) in list_claims(paths) {
                if let ClaimState::Pending(inode) = others.state(claimed, &claim, file_inode) {
                    if Some(inode) != own {
                        take_over(paths, &claim, inode)?;
                    }
                }
            }
        }
        // The compare of compare-and-swap: nothing landed since our read. From here on, a writer
        // from the same state needs our claim's name, or takes our claim over (then our rename
        // fails). The claim stays whatever happens: a failed claim is dead (our temporary file
        // goes) and is skipped; the claim of the file's generation is the high-water mark.
        if stale()? {
            return Err(if expected.is_none() { LockError::AlreadyExists } else { LockError::Conflict });
        }
        hold_before("rename");
        match fs::rename(&temp.path, &paths.path) {
            Ok(()) => temp.renamed(),
            // Our claim was taken over while this process was stopped: nothing was written.
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Err(LockError::Conflict),
            Err(error) => return Err(io_error("replace", &paths.path, error)),
        }
        if tidy {
            remove_leftovers(paths, generation);
        }
        return Ok(content_version(generation, &content));
    }
}

/// [`FileLock::write_fenced`] on a blocking thread.
fn write_fenced(
    paths: &Paths, steal_after: Duration, cancelled: &AtomicBool, term: Term, target: &Path, content: &[u8],
) -> Result<(), FencedWriteError> {
    let own_file = target == paths.path
        || target.file_name().is_some_and(|name| {
            let name = name.as_bytes();
            name.starts_with(paths.temp_prefix.as_bytes()) || name.starts_with(paths.claim_prefix.as_bytes())
        });
    if own_file {
        let message = format!("{} is the lock's own file: a fenced write goes beside it", target.display());
        return Err(LockError::Rejected(message).into());
    }
    let mut others = OtherClaims::default();
    let started = Instant::now();
    loop {
        if cancelled.load(Ordering::Relaxed) {
            return Err(cancelled_error(paths).into());
        }
        let current = read_snapshot(&paths.path)?;
        let shows = match current.as_ref().map(|c| &c.stored.record) {
            Some(Ok(record)) if !record.holder_identity.is_empty() && Term::from_count(record.leader_transitions) == term => None,
            Some(Ok(record)) if record.holder_identity.is_empty() => Some(format!("no holder, term {}", record.leader_transitions)),
            Some(Ok(record)) => Some(format!("{:?} at term {}", record.holder_identity, record.leader_transitions)),
            Some(Err(error)) => Some(format!("no valid record: {error}")),
            None => Some("no record".to_owned()),
        };
        let (Some(current), None) = (current, shows.as_ref()) else {
            let lock = format!("file://{}", paths.path.display());
            let shows = shows.unwrap_or_default();
            return Err(FencedWriteError::Deposed { lock, term, shows });
        };
        let file_inode = inode_of(&paths.path);
        let Some(generation) = current.generation.and_then(|g| continued_generation(paths, g, file_inode)) else {
            // Our own record, but its claim is not linked yet (a create links it just after the
            // file): look again, for at most the lock wait.
            if started.elapsed() >= steal_after {
                let message = format!("{} was not written by this protocol's writers", paths.path.display());
                return Err(LockError::Unavailable(message).into());
            }
            std::thread::sleep(FIRST_RETRY);
            continue;
        };
        let base = current.stored.version;
        let stale = || -> Result<bool, LockError> { Ok(read_snapshot(&paths.path)?.map(|c| c.stored.version).as_ref() != Some(&base)) };
        let claiming = Claiming { paths, steal_after, cancelled, file_inode };
        let first = next_generation(paths, generation)?;
        let temp = match claiming.claim(&mut others, first, &stale, LockError::Conflict, |_| Ok((TempFile::write(paths, content)?, ()))) {
            Ok((_, (temp, ()))) => temp,
            // The lock moved (a renew of ours, or a new tenure): check the tenure again.
            Err(LockError::Conflict) => continue,
            Err(error) => return Err(error.into()),
        };
        // The claim stays, linked to the target once written: a dead claim the lock's next
        // writer skips at once (no temporary file has its inode).
        if stale()? {
            continue;
        }
        hold_before("rename");
        match fs::rename(&temp.path, target) {
            Ok(()) => {
                temp.renamed();
                return Ok(());
            }
            // Taken over while held here: a writer of the lock went on; check the tenure again.
            Err(error) if error.kind() == io::ErrorKind::NotFound && !temp.path.exists() => continue,
            Err(error) if error.raw_os_error() == Some(libc::EXDEV) => {
                let message = format!(
                    "cannot write {} fenced by {}: not on the lock directory's file system",
                    target.display(),
                    paths.path.display()
                );
                return Err(LockError::Rejected(message).into());
            }
            Err(error) => return Err(io_error("replace", target, error).into()),
        }
    }
}

/// One writer's claim of a generation, with what it needs to wait for or take over others.
struct Claiming<'a> {
    paths: &'a Paths,
    steal_after: Duration,
    cancelled: &'a AtomicBool,
    /// The lock file's (device, inode) when the writer read it.
    file_inode: Option<(u64, u64)>,
}

impl Claiming<'_> {
    /// Claims the first generation from `generation` on that is free, or claimed by a writer
    /// still at work (waited for, then taken over); dead claims are skipped. The claim is a hard
    /// link of the temporary file `temp` makes for the generation. `lost` when the lock changed
    /// while waiting (`stale`).
    fn claim<T>(
        &self, others: &mut OtherClaims, mut generation: u64, stale: &dyn Fn() -> Result<bool, LockError>,
        lost: LockError, temp: impl Fn(u64) -> Result<(TempFile, T), LockError>,
    ) -> Result<(u64, (TempFile, T)), LockError> {
        let paths = self.paths;
        loop {
            let made = temp(generation)?;
            let claim = paths.claim(generation);
            match fs::hard_link(&made.0.path, &claim) {
                Ok(()) => return Ok((generation, made)),
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(io_error("claim", &claim, error)),
            }
            drop(made);
            match others.state(generation, &claim, self.file_inode) {
                ClaimState::Dead => generation = next_generation(paths, generation)?,
                ClaimState::Gone => {}
                ClaimState::Pending(inode) => {
                    if stale()? {
                        return Err(lost);
                    }
                    match others.wait((generation, inode), &claim, self.steal_after, paths)? {
                        Wait::Pause(pause) => std::thread::sleep(pause),
                        Wait::TakenOver | Wait::None => {}
                    }
                }
            }
            if self.cancelled.load(Ordering::Relaxed) {
                return Err(cancelled_error(paths));
            }
        }
    }
}

fn content_version(generation: u64, content: &[u8]) -> Version {
    let mut hash = ContentHash::new();
    hash.add(content);
    document_version(generation, hash.0)
}

/// The claims of this lock by generation (names that do not parse, or name a generation no
/// writer makes, are not claims of this lock).
fn list_claims(paths: &Paths) -> BTreeMap<u64, PathBuf> {
    let Ok(entries) = fs::read_dir(&paths.dir) else { return BTreeMap::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let digits = name.as_bytes().strip_prefix(paths.claim_prefix.as_bytes())?;
            let generation = std::str::from_utf8(digits).ok().filter(|d| d.bytes().all(|b| b.is_ascii_digit()))?;
            let generation = generation.parse().ok().filter(|g| *g <= MAX_GENERATION)?;
            Some((generation, entry.path()))
        })
        .collect()
}

/// (device, inode) of a path, if it exists.
fn inode_of(path: &Path) -> Option<(u64, u64)> {
    fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The state of a claim that exists (or did a moment ago).
enum ClaimState {
    /// Gone meanwhile: try the same generation again.
    Gone,
    /// It can never land: its writer's temporary file is gone (taken over, or the writer died
    /// and it was cleaned), or it is the file itself (the claim of the file's generation).
    Dead,
    /// Its writer's temporary file may still exist: the write may still land. (device, inode)
    Pending((u64, u64)),
}

/// What to do about another writer's pending claim.
enum Wait {
    /// Look again after this pause.
    Pause(Duration),
    /// Its temporary file was removed (or found gone): it can never land.
    TakenOver,
    /// No pending claim.
    None,
}

/// One claim as this writer knows it: its generation and (device, inode). The inode alone does
/// not name a claim: once a dead claim's file is removed, the file system may give its number to
/// another writer's temporary file (ext4 does), whose claim is live.
type ClaimId = (u64, (u64, u64));

/// Other writers' claims as this writer saw them: since when each pending one was watched, on
/// this process's monotonic clock (never a file time: a clock another process set, invariant S3),
/// and those found dead by a takeover that found no temporary file to remove.
#[derive(Default)]
struct OtherClaims {
    watched: Option<(ClaimId, Instant)>,
    /// Looks at the same claim so far: the pause doubles with each.
    pauses: u32,
    dead: std::collections::HashSet<ClaimId>,
}

impl OtherClaims {
    fn state(&self, generation: u64, claim: &Path, file_inode: Option<(u64, u64)>) -> ClaimState {
        match fs::symlink_metadata(claim) {
            Ok(metadata) => {
                let inode = (metadata.dev(), metadata.ino());
                if metadata.nlink() <= 1 || Some(inode) == file_inode || self.dead.contains(&(generation, inode)) {
                    ClaimState::Dead
                } else {
                    ClaimState::Pending(inode)
                }
            }
            Err(_) => ClaimState::Gone,
        }
    }

    /// Waits for the pending claim `id` to land, at most `steal_after` from when this writer
    /// first saw it; then takes it over.
    fn wait(&mut self, id: ClaimId, claim: &Path, steal_after: Duration, paths: &Paths) -> Result<Wait, LockError> {
        let since = match self.watched {
            Some((seen, since)) if seen == id => since,
            _ => {
                // Its writer links the claim to a temporary file it made first: with no such
                // file, the claim can never land (a fenced write beside the lock leaves its
                // claim linked to the file it wrote). Dead at once, no wait.
                if temp_with_inode(paths, id.1)?.is_none() {
                    self.dead.insert(id);
                    return Ok(Wait::TakenOver);
                }
                self.watched = Some((id, Instant::now()));
                self.pauses = 0;
                return Ok(Wait::Pause(FIRST_RETRY));
            }
        };
        if since.elapsed() >= steal_after {
            if !take_over(paths, claim, id.1)? {
                self.dead.insert(id);
            }
            return Ok(Wait::TakenOver);
        }
        self.pauses = self.pauses.saturating_add(1);
        let pause = crate::Backoff::new(FIRST_RETRY, LONGEST_RETRY).delay(self.pauses);
        let left = steal_after.saturating_sub(since.elapsed());
        Ok(Wait::Pause(pause.mul_f64(rand::rng().random_range(0.5..1.0)).min(left)))
    }

    /// Waits for (or takes over) the lowest pending claim, if any.
    fn first_pending(
        &mut self, claims: &BTreeMap<u64, PathBuf>, file_inode: Option<(u64, u64)>,
        steal_after: Duration, paths: &Paths,
    ) -> Result<Wait, LockError> {
        for (&generation, claim) in claims {
            if let ClaimState::Pending(inode) = self.state(generation, claim, file_inode) {
                return self.wait((generation, inode), claim, steal_after, paths);
            }
        }
        Ok(Wait::None)
    }
}

/// Makes a pending claim dead: removes its writer's temporary file (found by inode, and only
/// while the claim still names that file), so that the writer's rename fails (`ENOENT`) whenever
/// it resumes. The rename and the removal exclude each other (both act on the temporary file's
/// one name): either the write landed first (then the file changed and this writer's conflicts)
/// or it never will. `Ok(false)` when no such temporary file exists (the claim can never land
/// anyway); an error when one exists and cannot be removed (in a sticky directory, another
/// user's): that claim is live, and this write cannot go on.
fn take_over(paths: &Paths, claim: &Path, inode: (u64, u64)) -> Result<bool, LockError> {
    let Some(path) = temp_with_inode(paths, inode)? else { return Ok(false) };
    if inode_of(claim) != Some(inode) {
        return Ok(false);
    }
    match fs::remove_file(&path) {
        Ok(()) => {
            tracing::debug!(claim = %claim.display(), "took over the claim of a writer stopped in the middle of a write");
            Ok(true)
        }
        // Renamed into place or removed meanwhile: it can land no more.
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(io_error("take over the pending write", &path, error)),
    }
}

/// The temporary file of this lock whose (device, inode) is `inode` and that has another link
/// (a claim), if there is one.
fn temp_with_inode(paths: &Paths, inode: (u64, u64)) -> Result<Option<PathBuf>, LockError> {
    let entries = fs::read_dir(&paths.dir).map_err(|error| io_error("list", &paths.dir, error))?;
    Ok(entries.flatten().map(|entry| entry.path()).find(|path| {
        let name = path.file_name().map_or(&[][..], |name| name.as_bytes());
        TempOwner::parse(paths, name).is_some()
            && fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == inode && m.nlink() >= 2)
    }))
}

/// Who wrote a temporary file: its name is `<prefix><pid>.<namespace>.<nonce>.<counter>` (or
/// `<prefix><pid>.<counter>`, as releases before the nonce named them).
///
/// The name must be unique among every writer alive on the host, or one writer's rename could
/// move another's document into place (and a takeover of one would take the other). The pid
/// alone is not: writers in other PID namespaces (containers sharing a volume, each PID 1) have
/// the same pids. `namespace` (the inode of the writer's PID namespace, 0 if unknown) and the
/// pid together name one live process; `nonce`, 64 random bits drawn once per process, keeps
/// names apart where the namespace cannot be told (no `/proc`, sandboxes that show every
/// namespace alike); the counter, a process's own files. Creating with `O_EXCL` never adopts a
/// dead writer's leftover of the same name.
struct TempOwner {
    pid: i32,
    /// The writer's PID namespace; `None` for names without one.
    namespace: Option<u64>,
}

impl TempOwner {
    fn parse(paths: &Paths, name: &[u8]) -> Option<TempOwner> {
        let suffix = std::str::from_utf8(name.strip_prefix(paths.temp_prefix.as_bytes())?).ok()?;
        let fields: Vec<&str> = suffix.split('.').collect();
        let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let hex = |s: &str| u64::from_str_radix(s, 16).ok().filter(|_| s.bytes().all(|b| b.is_ascii_hexdigit()));
        let (pid, namespace) = match fields[..] {
            [pid, counter] if decimal(pid) && decimal(counter) => (pid, None),
            [pid, namespace, nonce, counter] if decimal(pid) && hex(nonce).is_some() && hex(counter).is_some() => {
                (pid, Some(hex(namespace)?))
            }
            _ => return None,
        };
        Some(TempOwner { pid: pid.parse().ok()?, namespace })
    }

    /// True when the writer no longer exists. Only a pid of this process's PID namespace (or of
    /// a name that does not say) is looked up: another namespace's pid would name another
    /// process. The others' files go by age.
    fn is_gone(&self) -> bool {
        match self.namespace {
            Some(namespace) if namespace == 0 || namespace != WriterTag::get().namespace => false,
            _ => process_is_gone(self.pid),
        }
    }
}

/// What this process puts in its temporary files' names (see [`TempOwner`]).
struct WriterTag {
    namespace: u64,
    nonce: u64,
}

impl WriterTag {
    fn get() -> &'static WriterTag {
        static TAG: std::sync::OnceLock<WriterTag> = std::sync::OnceLock::new();
        TAG.get_or_init(|| WriterTag {
            namespace: fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino()),
            nonce: rand::rng().random(),
        })
    }
}

/// A new document in a temporary file of its own; removed when dropped unless renamed.
struct TempFile {
    path: PathBuf,
    renamed: bool,
}

impl TempFile {
    /// The document of `generation` with `record`, in a new temporary file; and its content.
    fn document(paths: &Paths, generation: u64, record: &LeaderElectionRecord) -> Result<(TempFile, Vec<u8>), LockError> {
        let mut content = serde_json::to_vec(&DocumentOut { generation, record }).map_err(|error| {
            LockError::Unavailable(format!("cannot encode the record for {}: {error}", paths.path.display()))
        })?;
        content.push(b'\n');
        Ok((TempFile::write(paths, &content)?, content))
    }

    fn write(paths: &Paths, content: &[u8]) -> Result<TempFile, LockError> {
        static TEMP_FILES: AtomicU64 = AtomicU64::new(0);
        let tag = WriterTag::get();
        let mut attempts = 0;
        let (path, mut file) = loop {
            let mut name = paths.temp_prefix.clone();
            let counter = TEMP_FILES.fetch_add(1, Ordering::Relaxed);
            name.push(format!("{}.{:x}.{:016x}.{counter:x}", std::process::id(), tag.namespace, tag.nonce));
            let path = paths.dir.join(name);
            match OpenOptions::new().write(true).create_new(true).mode(0o644).open(&path) {
                Ok(file) => break (path, file),
                // Left by a dead process that had our pid; the next cleanup removes it.
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
                Err(error) if error.kind() == io::ErrorKind::NotFound && attempts < 8 => {
                    attempts += 1;
                    create_directories(&paths.dir).map_err(|error| io_error("create directory", &paths.dir, error))?;
                }
                Err(error) => return Err(io_error("create", &path, error)),
            }
        };
        let temp = TempFile { path, renamed: false };
        file.write_all(content).map_err(|error| io_error("write", &temp.path, error))?;
        Ok(temp)
    }

    fn renamed(mut self) {
        self.renamed = true;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Test builds only (feature `simulation`): holds this writer just before `step`, as a SIGSTOP
/// or a frozen VM would, when `TENURE_FILE_LOCK_HOLD_BEFORE` names it: the process prints
/// `held before <step>` and goes on when a line (or end of file) arrives on stdin. Once per
/// process. A process cannot SIGSTOP itself when it is its PID namespace's init (the kernel
/// drops such a signal), which is exactly the writer the namespace tests need.
#[cfg(feature = "simulation")]
fn hold_before(step: &str) {
    static HELD: AtomicBool = AtomicBool::new(false);
    if std::env::var_os("TENURE_FILE_LOCK_HOLD_BEFORE").is_some_and(|held| held == step) && !HELD.swap(true, Ordering::SeqCst) {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "held before {step}").and_then(|()| out.flush());
        let _ = io::stdin().read_line(&mut String::new());
    }
}

#[cfg(not(feature = "simulation"))]
fn hold_before(_step: &str) {}

/// How old a temporary file must be before a writer removes it as left by a dead process. A
/// writer resumed after a longer stop finds its file gone: its write fails, nothing else.
const ORPHAN_AGE: Duration = Duration::from_secs(60);

/// Removes what writers left, after a write of `generation`: temporary files of processes that no
/// longer exist or older than [`ORPHAN_AGE`], and claims of generations below the file's. Generations never go down (a
/// create continues above every claim, and the claim of the file's generation stays), so a claim
/// below the file's generation belongs to a writer whose state is gone: it can never land,
/// whether it is removed or not.
fn remove_leftovers(paths: &Paths, generation: u64) {
    let mut leftovers: Vec<PathBuf> = list_claims(paths).range(..generation).map(|(_, path)| path.clone()).collect();
    if let Ok(entries) = fs::read_dir(&paths.dir) {
        let now = std::time::SystemTime::now();
        for entry in entries.flatten() {
            let Some(owner) = TempOwner::parse(paths, entry.file_name().as_bytes()) else { continue };
            let old = entry.metadata().ok().and_then(|m| m.modified().ok()).is_some_and(|modified| {
                now.duration_since(modified).is_ok_and(|age| age > ORPHAN_AGE)
            });
            if old || owner.is_gone() {
                leftovers.push(entry.path());
            }
        }
    }
    for path in leftovers {
        match fs::remove_file(&path) {
            Ok(()) => tracing::debug!(path = %path.display(), "removed a file left by a writer"),
            Err(error) => tracing::debug!(path = %path.display(), %error, "cannot remove a leftover file"),
        }
    }
}

/// True when process `pid` no longer exists in this PID namespace.
fn process_is_gone(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks whether the process exists; no memory is involved.
    let result = unsafe { libc::kill(pid, 0) };
    result != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

fn cancelled_error(paths: &Paths) -> LockError {
    LockError::Unavailable(format!("write to {} abandoned: the caller gave up", paths.path.display()))
}

fn create_directories(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// A failed system call as a lock error: permissions and read-only file systems will not heal by
/// retrying, everything else may.
fn io_error(action: &str, path: &Path, error: io::Error) -> LockError {
    let message = format!("cannot {action} {}: {error}", path.display());
    if error.kind() == io::ErrorKind::PermissionDenied || error.raw_os_error() == Some(libc::EROFS) {
        LockError::Rejected(message)
    } else {
        LockError::Unavailable(message)
    }
}

// ---------------------------------------------------------------------------------------------
// Watching

/// The state of a watch between two items.
struct Watch {
    paths: Arc<Paths>,
    /// inotify before the first poll: converting it to a stream needs the tokio reactor, which
    /// `watch()` may be called without; the kernel queues events meanwhile.
    armed: Option<Inotify>,
    events: Option<EventStream<[u8; EVENT_BUFFER_BYTES]>>,
    /// The version (or absence) delivered last, so that a burst yields a state once.
    delivered: Option<Option<Version>>,
}

/// What a burst of inotify events means for the lock.
#[derive(Default)]
struct Burst {
    touches_file: bool,
    broken: Option<String>,
}

fn changes(
    paths: Arc<Paths>,
    inotify: Inotify,
) -> impl futures::Stream<Item = Result<Option<StoredRecord>, LockError>> + Send {
    let watch = Watch { paths, armed: Some(inotify), events: None, delivered: None };
    stream::unfold(Some(watch), |watch| async move {
        let mut watch = watch?;
        let change = watch.next_change().await?;
        // An error ends the stream.
        let next = change.is_ok().then_some(watch);
        Some((change, next))
    })
}

impl Watch {
    /// Waits for a burst of events that touches the file and reads it; `None` when inotify ends.
    async fn next_change(&mut self) -> Option<Result<Option<StoredRecord>, LockError>> {
        loop {
            let burst = match self.next_burst().await? {
                Ok(burst) => burst,
                Err(error) => return Some(Err(error)),
            };
            if let Some(reason) = burst.broken {
                return Some(Err(LockError::Unavailable(reason)));
            }
            if !burst.touches_file {
                continue;
            }
            let paths = self.paths.clone();
            let read = tokio::task::spawn_blocking(move || read_snapshot(&paths.path)).await;
            let stored = match read {
                Ok(Ok(snapshot)) => snapshot.map(|s| s.stored),
                Ok(Err(error)) => return Some(Err(error)),
                Err(error) => {
                    let message = format!("file lock {}: worker thread failed: {error}", self.paths.path.display());
                    return Some(Err(LockError::Unavailable(message)));
                }
            };
            let version = stored.as_ref().map(|s| s.version.clone());
            if self.delivered.as_ref() == Some(&version) {
                continue;
            }
            self.delivered = Some(version);
            return Some(Ok(stored));
        }
    }

    /// The next event and every event already queued behind it.
    async fn next_burst(&mut self) -> Option<Result<Burst, LockError>> {
        let paths = self.paths.clone();
        let events = match self.event_stream() {
            Ok(events) => events,
            Err(error) => return Some(Err(error)),
        };
        let mut burst = Burst::default();
        let mut next = events.next().await;
        loop {
            match next {
                Some(Ok(event)) => {
                    let mask = event.mask;
                    if mask.intersects(
                        EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::UNMOUNT,
                    ) {
                        burst.broken =
                            Some(format!("the directory {} was removed, moved or unmounted", paths.dir.display()));
                    } else if mask.contains(EventMask::Q_OVERFLOW)
                        || event.name.as_deref() == Some(paths.name.as_os_str())
                    {
                        burst.touches_file = true;
                    }
                }
                Some(Err(error)) => return Some(Err(io_error("read inotify events for", &paths.dir, error))),
                None if burst.touches_file || burst.broken.is_some() => break,
                None => return None,
            }
            let Some(event) = events.next().now_or_never() else { break };
            next = event;
        }
        Some(Ok(burst))
    }

    fn event_stream(&mut self) -> Result<&mut EventStream<[u8; EVENT_BUFFER_BYTES]>, LockError> {
        if let Some(inotify) = self.armed.take() {
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(LockError::Unavailable(format!(
                    "cannot watch {}: the change stream must be polled inside a tokio runtime",
                    self.paths.path.display()
                )));
            }
            let events = inotify
                .into_event_stream([0; EVENT_BUFFER_BYTES])
                .map_err(|error| io_error("watch", &self.paths.dir, error))?;
            self.events = Some(events);
        }
        self.events
            .as_mut()
            .ok_or_else(|| LockError::Unavailable(format!("the watch of {} is closed", self.paths.path.display())))
    }
}

// ---------------------------------------------------------------------------------------------
// Default paths

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn validate_election_name(election: &str) -> Result<(), FileLockError> {
    let reason = if election.is_empty() {
        "it is empty"
    } else if election.len() > MAX_ELECTION_NAME_BYTES {
        "it is longer than 200 bytes"
    } else if election.contains('/') {
        "it contains '/'"
    } else if election.contains('\0') {
        "it contains a NUL byte"
    } else if election == "." || election == ".." {
        "it is '.' or '..'"
    } else {
        return Ok(());
    };
    Err(FileLockError::InvalidElectionName { name: election.to_owned(), reason })
}

/// [`FileLock::default_path`] with its environment passed in, for tests.
fn default_path_in(
    election: &str, runtime_dir: Option<&OsStr>, temp_dir: &Path, uid: u32,
) -> Result<PathBuf, FileLockError> {
    validate_election_name(election)?;
    let file_name = format!("{election}.json");
    if let Some(runtime_dir) = runtime_dir.map(Path::new).filter(|dir| is_usable_runtime_dir(dir, uid)) {
        return Ok(runtime_dir.join("tenure").join(file_name));
    }
    let dir = temp_dir.join(format!("tenure-{uid}"));
    check_private_dir(&dir, uid)?;
    Ok(dir.join(file_name))
}

fn is_usable_runtime_dir(dir: &Path, uid: u32) -> bool {
    dir.is_absolute() && fs::metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o300 == 0o300)
}

/// Accepts a directory that does not exist yet, or one only `uid` controls.
fn check_private_dir(dir: &Path, uid: u32) -> Result<(), FileLockError> {
    let metadata = match fs::symlink_metadata(dir) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(FileLockError::Io { action: "inspect", path: dir.to_owned(), error }),
    };
    let reason = if !metadata.is_dir() {
        "it exists and is not a directory".to_owned()
    } else if metadata.uid() != uid {
        format!("it belongs to uid {}, not {uid}", metadata.uid())
    } else if metadata.mode() & 0o022 != 0 {
        format!("others may write to it (mode {:o})", metadata.mode() & 0o7777)
    } else {
        return Ok(());
    };
    Err(FileLockError::UnsafeDirectory { path: dir.to_owned(), reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tenure-file-unit-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn default_path_prefers_a_usable_runtime_dir() {
        let root = scratch("xdg");
        let runtime = root.join("run");
        fs::create_dir(&runtime).unwrap();
        fs::set_permissions(&runtime, fs::Permissions::from_mode(0o700)).unwrap();
        let uid = effective_uid();
        let path = default_path_in("svc", Some(runtime.as_os_str()), &root, uid).unwrap();
        assert_eq!(path, runtime.join("tenure").join("svc.json"));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn default_path_falls_back_to_a_per_user_temp_dir() {
        let root = scratch("fallback");
        let uid = effective_uid();
        let expected = root.join(format!("tenure-{uid}")).join("svc.json");
        // Unset, empty, relative, missing, or a file: all unusable.
        let file = root.join("a-file");
        fs::write(&file, b"").unwrap();
        for runtime in [None, Some(""), Some("relative/dir"), Some("/nonexistent/tenure-test"), file.to_str()] {
            let path = default_path_in("svc", runtime.map(OsStr::new), &root, uid).unwrap();
            assert_eq!(path, expected, "XDG_RUNTIME_DIR={runtime:?}");
        }
        // A runtime dir belonging to someone else is not used either.
        let path = default_path_in("svc", Some(root.as_os_str()), &root, uid.wrapping_add(1)).unwrap();
        assert_eq!(path, root.join(format!("tenure-{}", uid.wrapping_add(1))).join("svc.json"));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn default_path_refuses_a_fallback_dir_others_control() {
        let root = scratch("unsafe");
        let uid = effective_uid();
        let dir = root.join(format!("tenure-{uid}"));
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let error = default_path_in("svc", None, &root, uid).unwrap_err();
        assert!(matches!(error, FileLockError::UnsafeDirectory { .. }), "{error}");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(default_path_in("svc", None, &root, uid).is_ok());
        fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&root, &dir).unwrap();
        assert!(matches!(default_path_in("svc", None, &root, uid), Err(FileLockError::UnsafeDirectory { .. })));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn permission_and_read_only_errors_are_rejections_and_others_unavailability() {
        let path = Path::new("/some/dir/x.json");
        for (errno, rejected) in
            [(libc::EACCES, true), (libc::EPERM, true), (libc::EROFS, true), (libc::EIO, false), (libc::ENOSPC, false)]
        {
            let error = io_error("create", path, io::Error::from_raw_os_error(errno));
            assert_eq!(matches!(error, LockError::Rejected(_)), rejected, "{error}");
            assert!(error.to_string().contains("cannot create /some/dir/x.json: "), "{error}");
        }
    }

    /// A claim judged dead stays dead only under its own generation: when its inode number goes
    /// to another writer's file (ext4 reuses freed numbers; emulated here by a hard link, which
    /// shows the writer the same device and inode), that writer's live claim is waited for.
    #[test]
    fn a_dead_claims_inode_number_on_a_live_claim_is_not_taken_for_dead() {
        let dir = scratch("inode-reuse");
        let lock = FileLock::open(dir.join("election.json")).unwrap();
        let paths = &lock.paths;
        // Generation 2's claim has a second name that is no temporary file: it can never land,
        // and is remembered as dead at first sight, without a wait.
        fs::write(dir.join("not-a-temporary-file"), b"{}").unwrap();
        fs::hard_link(dir.join("not-a-temporary-file"), paths.claim(2)).unwrap();
        let mut others = OtherClaims::default();
        let ClaimState::Pending(inode) = others.state(2, &paths.claim(2), None) else { panic!("not pending") };
        assert!(matches!(others.wait((2, inode), &paths.claim(2), Duration::from_secs(3600), paths), Ok(Wait::TakenOver)));
        assert!(matches!(others.state(2, &paths.claim(2), None), ClaimState::Dead));
        // A live writer's temporary file with that inode number claims generation 3.
        let temp = dir.join(format!(".election.json.tmp.{}.0.1.0", std::process::id()));
        fs::hard_link(dir.join("not-a-temporary-file"), &temp).unwrap();
        fs::hard_link(&temp, paths.claim(3)).unwrap();
        assert!(matches!(others.state(3, &paths.claim(3), None), ClaimState::Pending(i) if i == inode));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temporary_file_names_tell_their_writer() {
        let dir = scratch("names");
        let lock = FileLock::open(dir.join("election.json")).unwrap();
        let paths = &lock.paths;
        let parse = |name: &str| TempOwner::parse(paths, name.as_bytes()).map(|owner| (owner.pid, owner.namespace));
        assert_eq!(parse(".election.json.tmp.1.effffffc.0123456789abcdef.1f"), Some((1, Some(0xeffffffc))));
        assert_eq!(parse(".election.json.tmp.42.7"), Some((42, None)), "as releases before the nonce named them");
        for foreign in [".election.json.tmp.1", ".election.json.tmp.x.7", ".election.json.tmp.1.2.3", ".other.json.tmp.1.2"] {
            assert_eq!(parse(foreign), None, "{foreign}");
        }
        // Another namespace's pid names another process: never looked up.
        let foreign = TempOwner { pid: i32::MAX, namespace: Some(WriterTag::get().namespace.wrapping_add(1)) };
        assert!(!foreign.is_gone());
        let ours = TempOwner { pid: i32::MAX, namespace: Some(WriterTag::get().namespace) };
        assert_eq!(ours.is_gone(), WriterTag::get().namespace != 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn content_hash_is_fnv1a() {
        // Reference values of 64-bit FNV-1a.
        let mut hash = ContentHash::new();
        assert_eq!(hash.0, 0xcbf29ce484222325);
        hash.add(b"a");
        assert_eq!(hash.0, 0xaf63dc4c8601ec8c);
    }
}
