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
//! The protocol is [`ClaimedFile`](crate::locks::file::ClaimedFile)'s, written once for every
//! file Tenure keeps on one host: this lock, the Active/Active group's file store and the file
//! checkpoint store.
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
//!   **Fenced writes** ([`FileLock::write_fenced`](crate::locks::file::FileLock::write_fenced))
//!   use the same claim to write a file *beside* the lock: claim the next generation with a
//!   temporary file holding the new content, check that the lock still shows the tenure, rename
//!   the temporary file onto the target. A writer
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
//!   generations below the file's. In between, each write removes the claim of the generation
//!   it replaced. Readers never look at them.
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

mod claim;

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{stream, FutureExt, StreamExt};
use inotify::{EventMask, EventStream, Inotify, WatchMask};
use serde::{Deserialize, Serialize};

pub use self::claim::{ClaimedDocument, ClaimedFile};
use self::claim::{
    cancelled_error, continued_generation, create_directories, hold_before, inode_of, io_error, next_generation,
    read_document, Claiming, OtherClaims, Paths, TempFile, FIRST_RETRY,
};
use crate::lock::{ChangeStream, LockError, RecordLock, StoredRecord, Version};
use crate::record::{LeaderElectionRecord, RecordError};
use crate::term::Term;

/// The longest election name [`FileLock::default_path`] accepts, in bytes.
const MAX_ELECTION_NAME_BYTES: usize = 200;
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
        /// The lock, as [`RecordLock::describe`] names it.
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
    file: ClaimedFile,
}

impl FileLock {
    /// Opens the lock stored at `path` (creating missing parent directories with mode 0700); the
    /// file itself is created by the first `create`.
    ///
    /// Nothing is locked or read yet: opening is cheap, and every call of the lock works on the
    /// file as it is at that moment. A relative path is made absolute against the current
    /// directory now.
    pub fn open(path: impl AsRef<Path>) -> Result<FileLock, FileLockError> {
        Ok(FileLock { file: ClaimedFile::open(path)? })
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
        self.file.path()
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
    pub fn with_lock_wait(self, wait: Duration) -> FileLock {
        FileLock { file: self.file.with_lock_wait(wait) }
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
        let work = move |paths: &_, wait, cancelled: &_| write_fenced(paths, wait, cancelled, term, &target, &content);
        self.file.run_blocking(work).await
    }

    /// Sets up inotify on the directory; events from now on are queued by the kernel.
    fn start_inotify(&self) -> Result<Inotify, LockError> {
        let dir = &self.file.paths.dir;
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


#[async_trait]
impl RecordLock for FileLock {
    fn describe(&self) -> String {
        format!("file://{}", self.path().display())
    }

    async fn get(&self) -> Result<Option<StoredRecord>, LockError> {
        Ok(self.file.read().await?.as_ref().map(stored_record))
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        Ok(self.file.write(None, &RecordField { record }).await?.version)
    }

    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        Ok(self.file.write(Some(expected), &RecordField { record }).await?.version)
    }

    fn watch(&self) -> Option<ChangeStream> {
        Some(match self.start_inotify() {
            Ok(inotify) => Box::pin(changes(self.file.paths.clone(), inotify)),
            Err(error) => Box::pin(stream::once(async move { Err(error) })),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Records

/// What the lock's document holds beside its generation, as written.
#[derive(Serialize)]
struct RecordField<'a> {
    record: &'a LeaderElectionRecord,
}

/// The lock's document as read: the record stays loose so that an invalid record keeps its
/// generation.
#[derive(Deserialize)]
struct RecordIn {
    record: serde_json::Value,
}

/// The record a document holds; content that is none keeps its version and reads as malformed.
fn stored_record(document: &ClaimedDocument) -> StoredRecord {
    let not_ours =
        |reason: &dyn std::fmt::Display| RecordError::Malformed(format!("not a tenure file lock document: {reason}"));
    let record = match &document.content {
        Err(reason) => Err(RecordError::Malformed(reason.clone())),
        Ok(content) => match (document.generation, serde_json::from_slice::<RecordIn>(content)) {
            (Some(_), Ok(field)) => LeaderElectionRecord::from_json(&field.record.to_string()),
            (None, Ok(_)) => Err(not_ours(&"no generation")),
            (_, Err(error)) => Err(not_ours(&error)),
        },
    };
    StoredRecord { version: document.version.clone(), record }
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
        let current = read_document(paths)?;
        let record = current.as_ref().map(stored_record);
        let shows = match record.as_ref().map(|stored| &stored.record) {
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
        let base = current.version;
        let stale = || -> Result<bool, LockError> { Ok(read_document(paths)?.map(|c| c.version).as_ref() != Some(&base)) };
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
            let read = tokio::task::spawn_blocking(move || read_document(&paths)).await;
            let stored = match read {
                Ok(Ok(document)) => document.as_ref().map(stored_record),
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

    use super::claim::tests::scratch;

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
}
