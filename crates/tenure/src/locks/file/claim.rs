//! The claim protocol: a file replaced only by compare-and-swap, by writers that hold no lock.
//!
//! Why it exists: the election lock, the Active/Active group's records and the checkpoints of a
//! controller on one host all need a file that several processes replace by compare-and-swap,
//! where a writer stopped in the middle of a write (SIGSTOP, a frozen VM) blocks nobody and can
//! never land late. A kernel `flock` gives the first half only: it cannot be taken from a stopped
//! process. This module is that protocol, written once; the module documentation of
//! [`super`] describes it step by step ("Protocol").
//!
//! A claimed file is one line of JSON, `{"generation":N,...}`: the writer's fields follow the
//! generation, which counts the writes of the file and never goes down, even across a deletion.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngExt;
use serde::{Deserialize, Serialize};

use super::FileLockError;
use crate::lock::{LockError, Version};

/// How long a write waits by default for another writer's pending claim to land before it takes
/// the claim over: far longer than the few system calls between a claim and its rename, far
/// shorter than any lease.
const DEFAULT_STEAL_AFTER: Duration = Duration::from_millis(20);
/// The first and the longest pause between two looks at another writer's pending claim.
pub(super) const FIRST_RETRY: Duration = Duration::from_micros(100);
const LONGEST_RETRY: Duration = Duration::from_millis(5);
/// The largest generation a writer writes: 2^53 - 1, the largest integer every JSON reader holds
/// exactly. Only this protocol's own writes count towards it (see [`continued_generation`]): at
/// one write a millisecond, a file reaches it in 285,000 years, and then its writes are refused
/// with an error that says what to remove, never retried forever.
const MAX_GENERATION: u64 = (1 << 53) - 1;
/// Documents larger than this are not parsed unless the owner says otherwise
/// ([`ClaimedFile::with_max_bytes`]).
const DEFAULT_MAX_DOCUMENT_BYTES: u64 = 64 * 1024;
/// Every this many writes of a handle (and on its first), orphaned temporary files are removed.
const CLEAN_EVERY_WRITES: u64 = 128;
/// At most this many bytes of the file name go into temporary file names (NAME_MAX is 255).
const MAX_TEMP_STEM_BYTES: usize = 200;

/// The paths of one claimed file and the state its clones share.
#[derive(Debug)]
pub(super) struct Paths {
    /// The file, absolute.
    pub(super) path: PathBuf,
    /// Its directory (holds the claims and the temporary files).
    pub(super) dir: PathBuf,
    /// Its file name, to filter inotify events.
    pub(super) name: OsString,
    /// The start of this file's claim names (`.<name>.claim.`), followed by a generation.
    pub(super) claim_prefix: OsString,
    /// The start of this file's temporary file names.
    pub(super) temp_prefix: OsString,
    /// Writes made through this handle and its clones, to pace the cleanup of temporary files.
    writes: AtomicU64,
    /// Larger content is not parsed.
    max_bytes: u64,
}

impl Paths {
    /// The claim of `generation`: taken by the one writer that creates it (`link` fails if it
    /// exists).
    pub(super) fn claim(&self, generation: u64) -> PathBuf {
        let mut name = self.claim_prefix.clone();
        name.push(generation.to_string());
        self.dir.join(name)
    }
}

/// A file that processes on one host replace only by compare-and-swap, under the claim protocol
/// of the file lock (see the module documentation of [`super`]).
///
/// Why it exists: the election lock ([`FileLock`](super::FileLock)) is one such file; the
/// Active/Active group's file store keeps a record per file and the file checkpoint store a
/// checkpoint, with the same guarantees: no writer holds anything a stopped process could keep
/// from the others, a write stopped after its check never lands after a newer one, and an error
/// always means nothing was written.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use tenure::locks::file::ClaimedFile;
/// let file = ClaimedFile::open("/run/user/1000/my-service/state.json")?;
/// let current = file.read().await?;
/// let written = file.write(current.as_ref().map(|c| &c.version), &serde_json::json!({"step": 2})).await?;
/// println!("now at generation {}", written.generation.unwrap_or(0));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClaimedFile {
    pub(super) paths: Arc<Paths>,
    pub(super) steal_after: Duration,
}

/// One state of a [`ClaimedFile`], as read or as written.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedDocument {
    /// Names this exact content (`<generation>-<hash>`, or `raw-<hash>` for content without a
    /// generation): what a compare-and-swap from this state expects.
    pub version: Version,
    /// The generation the document shows, if it is a JSON object with one.
    pub generation: Option<u64>,
    /// The whole document (generation included); or why it cannot be one: the path is not a
    /// regular file, or it is larger than the file's limit.
    pub content: Result<Vec<u8>, String>,
}

impl ClaimedFile {
    /// Opens the file at `path` (creating missing parent directories with mode 0700); the file
    /// itself is created by the first write. A relative path is made absolute now.
    pub fn open(path: impl AsRef<Path>) -> Result<ClaimedFile, FileLockError> {
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

        // A long name is cut, with a hash of the whole name so that two files whose names
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
            prefix.push(std::ffi::OsStr::from_bytes(&stem));
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
            max_bytes: DEFAULT_MAX_DOCUMENT_BYTES,
        };
        Ok(ClaimedFile { paths: Arc::new(paths), steal_after: DEFAULT_STEAL_AFTER })
    }

    /// Sets the largest document that is read as one (64 KiB by default); larger content reads
    /// as [`ClaimedDocument::content`] `Err`, and can still be replaced by compare-and-swap.
    ///
    /// Why: a reader must never read without bound whatever someone put at the path, and what a
    /// file holds differs (an election record is under a kilobyte, a partition table of 16,384
    /// partitions about a megabyte).
    #[must_use]
    pub fn with_max_bytes(self, max_bytes: u64) -> ClaimedFile {
        let paths = &self.paths;
        let paths = Paths {
            path: paths.path.clone(),
            dir: paths.dir.clone(),
            name: paths.name.clone(),
            claim_prefix: paths.claim_prefix.clone(),
            temp_prefix: paths.temp_prefix.clone(),
            writes: AtomicU64::new(paths.writes.load(Ordering::Relaxed)),
            max_bytes,
        };
        ClaimedFile { paths: Arc::new(paths), ..self }
    }

    /// Sets how long a write waits for another process's pending write (a claim of the same
    /// generation) to land before it takes that claim over (default 20 ms).
    ///
    /// Why: a writer stopped between its claim and its rename (SIGSTOP, a frozen VM) must not keep
    /// others from writing, as a held kernel lock would; taking its claim over makes its write
    /// fail whenever it resumes. Measured on this process's monotonic clock from the moment it
    /// first saw the claim. A live writer needs microseconds between the two steps; one slowed
    /// past this bound only sees its write fail (a conflict), never land late.
    #[must_use]
    pub fn with_lock_wait(mut self, wait: Duration) -> ClaimedFile {
        self.steal_after = wait;
        self
    }

    /// The absolute path of the file.
    pub fn path(&self) -> &Path {
        &self.paths.path
    }

    /// What the file holds now; `None` when it does not exist. Takes no lock and waits for no
    /// writer: every write replaces the file whole.
    pub async fn read(&self) -> Result<Option<ClaimedDocument>, LockError> {
        self.run_blocking(|paths, _, _| read_document(paths)).await
    }

    /// [`read`](ClaimedFile::read) on the calling thread, for a caller that reads many files on
    /// one blocking thread of its own.
    pub fn read_now(&self) -> Result<Option<ClaimedDocument>, LockError> {
        read_document(&self.paths)
    }

    /// Writes `body` (which must serialise to a JSON object without a `generation` field) as the
    /// file's next state, if the file still holds the state `expected` names; `None` creates the
    /// file, and fails with [`LockError::AlreadyExists`] if it exists. A changed file fails with
    /// [`LockError::Conflict`]. Returns the document written.
    ///
    /// Why: one compare-and-swap for every file the project keeps on one host, with the
    /// guarantees of [`ClaimedFile`]. An error always means nothing was written.
    pub async fn write(
        &self, expected: Option<&Version>, body: &(impl Serialize + ?Sized),
    ) -> Result<ClaimedDocument, LockError> {
        let body = object_fields(&self.paths, body)?;
        let expected = expected.cloned();
        self.run_blocking(move |paths, wait, cancelled| write(paths, wait, cancelled, expected.as_ref(), &body)).await
    }

    /// Runs `work` on a blocking thread; it sees a flag that turns true if the caller gives up.
    pub(super) async fn run_blocking<T: Send + 'static, E: From<LockError> + Send + 'static>(
        &self, work: impl FnOnce(&Paths, Duration, &AtomicBool) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        let paths = self.paths.clone();
        let steal_after = self.steal_after;
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(cancelled.clone());
        match tokio::task::spawn_blocking(move || work(&paths, steal_after, &cancelled)).await {
            Ok(result) => result,
            Err(error) => {
                let message = format!("{}: worker thread failed: {error}", self.paths.path.display());
                Err(LockError::Unavailable(message).into())
            }
        }
    }
}

/// The fields of `body` as they follow the generation in a document: its JSON object without the
/// opening brace (`}` alone for an empty object).
fn object_fields(paths: &Paths, body: &(impl Serialize + ?Sized)) -> Result<Vec<u8>, LockError> {
    let refuse = |reason: String| LockError::Rejected(format!("cannot write {}: {reason}", paths.path.display()));
    let bytes = serde_json::to_vec(body).map_err(|error| refuse(format!("cannot encode the document: {error}")))?;
    let Some(fields) = bytes.strip_prefix(b"{") else {
        return Err(refuse("the document is not a JSON object".to_owned()));
    };
    // Only a body that mentions the name is parsed, to be sure it has no such field.
    if bytes.windows(12).any(|window| window == b"\"generation\"") {
        let object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes).unwrap_or_default();
        if object.contains_key("generation") {
            return Err(refuse("the document has a field named generation, which the file keeps".to_owned()));
        }
    }
    Ok(fields.to_vec())
}

/// Sets its flag when dropped: the async side of a call tells its blocking thread to give up.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A 64-bit FNV-1a hash: stable across processes, builds and Rust versions, unlike std's
/// `DefaultHasher`; collisions by accident are negligible and by intent need write access, which
/// gives an attacker the file anyway.
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

/// The generation a document shows; other fields are not looked at.
#[derive(Deserialize)]
struct GenerationField {
    generation: u64,
}

/// Reads the file; `None` when it does not exist.
pub(super) fn read_document(paths: &Paths) -> Result<Option<ClaimedDocument>, LockError> {
    let path = &paths.path;
    // Non-blocking, so that a FIFO someone put there reads as empty instead of hanging.
    let mut file = match OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io_error("open", path, error)),
    };
    let metadata = file.metadata().map_err(|error| io_error("inspect", path, error))?;
    let mut hash = ContentHash::new();
    let raw = |hash: ContentHash, reason: String| {
        let version = Version(format!("raw-{:016x}", hash.0));
        Ok(Some(ClaimedDocument { version, generation: None, content: Err(reason) }))
    };
    if !metadata.is_file() {
        // A directory, FIFO or device: not a document, and its content names nothing. Its
        // identity does, so that a writer can still replace it by compare-and-swap.
        hash.add(format!("special:{}:{}:{:o}", metadata.dev(), metadata.ino(), metadata.mode()).as_bytes());
        return raw(hash, "the path is not a regular file".to_owned());
    }
    let mut content = Vec::new();
    (&mut file).take(paths.max_bytes + 1).read_to_end(&mut content).map_err(|error| io_error("read", path, error))?;
    hash.add(&content);
    if content.len() as u64 > paths.max_bytes {
        // Hash the rest too, so that the version still names this exact content.
        io::copy(&mut file, &mut hash).map_err(|error| io_error("read", path, error))?;
        return raw(hash, format!("the file is larger than {} bytes", paths.max_bytes));
    }
    let generation = serde_json::from_slice::<GenerationField>(&content).ok().map(|field| field.generation);
    let version = match generation {
        Some(generation) => document_version(generation, hash.0),
        None => Version(format!("raw-{:016x}", hash.0)),
    };
    Ok(Some(ClaimedDocument { version, generation, content: Ok(content) }))
}

fn document_version(generation: u64, hash: u64) -> Version {
    Version(format!("{generation}-{hash:016x}"))
}

fn content_version(generation: u64, content: &[u8]) -> Version {
    let mut hash = ContentHash::new();
    hash.add(content);
    document_version(generation, hash.0)
}

/// The generation a writer continues from: the document's, if this protocol wrote it, which shows
/// in the claim of that generation being the file itself (a write renames its claimed temporary
/// file into place, a create links it as both). Content written by anyone else, whatever
/// generation it shows (near the top of the range included), gives none: it is replaced like
/// content without a generation, above every claim, so a foreign number never enters the count.
pub(super) fn continued_generation(paths: &Paths, generation: u64, file_inode: Option<(u64, u64)>) -> Option<u64> {
    let ours = generation < MAX_GENERATION && file_inode.is_some() && inode_of(&paths.claim(generation)) == file_inode;
    ours.then_some(generation)
}

/// The generation after `generation`, or the refusal to count past [`MAX_GENERATION`].
pub(super) fn next_generation(paths: &Paths, generation: u64) -> Result<u64, LockError> {
    generation.checked_add(1).filter(|next| *next <= MAX_GENERATION).ok_or_else(|| {
        LockError::Rejected(format!(
            "the generations of {} are exhausted (claims up to {MAX_GENERATION} exist): remove the file and its \
             .claim.* files with every writer stopped",
            paths.path.display()
        ))
    })
}

/// Creates (`expected == None`) or replaces the file by compare-and-swap with the document of
/// `fields` (a JSON object's fields, see [`object_fields`]), holding nothing that a stopped
/// process could keep from others (see "Protocol" in the module documentation of [`super`]).
fn write(
    paths: &Paths, steal_after: Duration, cancelled: &AtomicBool, expected: Option<&Version>, fields: &[u8],
) -> Result<ClaimedDocument, LockError> {
    let writes = paths.writes.fetch_add(1, Ordering::Relaxed);
    #[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; the workspace supports 1.80
    let tidy = expected.is_none() || writes % CLEAN_EVERY_WRITES == 0;
    let mut others = OtherClaims::default();
    loop {
        if cancelled.load(Ordering::Relaxed) {
            return Err(cancelled_error(paths));
        }
        let current = read_document(paths)?;
        match (expected, &current) {
            (None, Some(_)) => return Err(LockError::AlreadyExists),
            (Some(_), None) => return Err(LockError::Conflict),
            (Some(expected), Some(current)) if current.version != *expected => return Err(LockError::Conflict),
            _ => {}
        }
        let base = current.as_ref().map(|c| c.version.clone());
        let stale = || -> Result<bool, LockError> {
            Ok(read_document(paths)?.map(|c| c.version) != base)
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
            let (temp, content) = TempFile::document(paths, generation, fields)?;
            match fs::hard_link(&temp.path, &paths.path) {
                Ok(()) => {
                    // The claim of the file's generation stays as the generations' high-water mark.
                    let _ = fs::hard_link(&temp.path, paths.claim(generation));
                    if tidy {
                        remove_leftovers(paths, generation);
                    }
                    return Ok(written(generation, content));
                }
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Err(LockError::AlreadyExists),
                Err(error) => return Err(io_error("create", &paths.path, error)),
            }
        }
        let claiming = Claiming { paths, steal_after, cancelled, file_inode };
        let (generation, (temp, content)) =
            claiming.claim(&mut others, generation, &stale, lost, |g| TempFile::document(paths, g, fields))?;
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
        } else if let Some(previous) = continued {
            // The claim of the generation just replaced is below the file's now: its state is
            // gone, so it can never land. Removed at once, one per write, so that a file written
            // often leaves no trail of claims between two cleanups.
            let _ = fs::remove_file(paths.claim(previous));
        }
        return Ok(written(generation, content));
    }
}



/// The document a write of `generation` left, `content` being its bytes.
fn written(generation: u64, content: Vec<u8>) -> ClaimedDocument {
    let version = content_version(generation, &content);
    ClaimedDocument { version, generation: Some(generation), content: Ok(content) }
}

/// One writer's claim of a generation, with what it needs to wait for or take over others.
pub(super) struct Claiming<'a> {
    pub(super) paths: &'a Paths,
    pub(super) steal_after: Duration,
    pub(super) cancelled: &'a AtomicBool,
    /// The file's (device, inode) when the writer read it.
    pub(super) file_inode: Option<(u64, u64)>,
}

impl Claiming<'_> {
    /// Claims the first generation from `generation` on that is free, or claimed by a writer
    /// still at work (waited for, then taken over); dead claims are skipped. The claim is a hard
    /// link of the temporary file `temp` makes for the generation. `lost` when the lock changed
    /// while waiting (`stale`).
    pub(super) fn claim<T>(
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
pub(super) fn inode_of(path: &Path) -> Option<(u64, u64)> {
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
pub(super) struct OtherClaims {
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
pub(super) struct TempFile {
    pub(super) path: PathBuf,
    renamed: bool,
}

impl TempFile {
    /// The document of `generation` followed by `fields` (see [`object_fields`]), in a new
    /// temporary file; and its content.
    fn document(paths: &Paths, generation: u64, fields: &[u8]) -> Result<(TempFile, Vec<u8>), LockError> {
        let mut content = format!("{{\"generation\":{generation}").into_bytes();
        if fields != b"}" {
            content.push(b',');
        }
        content.extend_from_slice(fields);
        content.push(b'\n');
        Ok((TempFile::write(paths, &content)?, content))
    }

    pub(super) fn write(paths: &Paths, content: &[u8]) -> Result<TempFile, LockError> {
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

    pub(super) fn renamed(mut self) {
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
pub(super) fn hold_before(step: &str) {
    static HELD: AtomicBool = AtomicBool::new(false);
    if std::env::var_os("TENURE_FILE_LOCK_HOLD_BEFORE").is_some_and(|held| held == step) && !HELD.swap(true, Ordering::SeqCst) {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "held before {step}").and_then(|()| out.flush());
        let _ = io::stdin().read_line(&mut String::new());
    }
}

#[cfg(not(feature = "simulation"))]
pub(super) fn hold_before(_step: &str) {}

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

pub(super) fn cancelled_error(paths: &Paths) -> LockError {
    LockError::Unavailable(format!("write to {} abandoned: the caller gave up", paths.path.display()))
}

pub(super) fn create_directories(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// A failed system call as a lock error: permissions and read-only file systems will not heal by
/// retrying, everything else may.
pub(super) fn io_error(action: &str, path: &Path, error: io::Error) -> LockError {
    let message = format!("cannot {action} {}: {error}", path.display());
    if error.kind() == io::ErrorKind::PermissionDenied || error.raw_os_error() == Some(libc::EROFS) {
        LockError::Rejected(message)
    } else {
        LockError::Unavailable(message)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A new, empty directory for one test.
    pub(in crate::locks::file) fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tenure-file-unit-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn a_claimed_file_is_replaced_by_compare_and_swap_and_refuses_a_body_it_cannot_keep() {
        let dir = scratch("claimed");
        let file = ClaimedFile::open(dir.join("state.json")).unwrap();
        assert_eq!(file.read().await.unwrap(), None);
        let first = file.write(None, &serde_json::json!({"step": 1})).await.unwrap();
        assert_eq!(first.content.as_deref().unwrap(), b"{\"generation\":1,\"step\":1}\n");
        assert_eq!(file.read().await.unwrap().as_ref(), Some(&first));
        assert_eq!(file.write(None, &serde_json::json!({"step": 1})).await, Err(LockError::AlreadyExists));
        let second = file.write(Some(&first.version), &serde_json::json!({})).await.unwrap();
        assert_eq!((second.generation, second.content.as_deref().unwrap()), (Some(2), &b"{\"generation\":2}\n"[..]));
        assert_eq!(file.write(Some(&first.version), &serde_json::json!({})).await, Err(LockError::Conflict));
        for body in [serde_json::json!([1, 2]), serde_json::json!("text"), serde_json::json!({"generation": 9})] {
            let refused = file.write(Some(&second.version), &body).await;
            assert!(matches!(&refused, Err(LockError::Rejected(reason)) if reason.contains("state.json")), "{refused:?}");
        }
        // A field that only mentions the word is kept.
        file.write(Some(&second.version), &serde_json::json!({"note": {"generation": 1}})).await.unwrap();
        // Content over the limit reads as no document, and is still replaced by compare-and-swap.
        let small = ClaimedFile::open(dir.join("state.json")).unwrap().with_max_bytes(8);
        let large = small.read().await.unwrap().unwrap();
        assert!(large.content.is_err() && large.generation.is_none(), "{large:?}");
        small.write(Some(&large.version), &serde_json::json!({})).await.unwrap();
        fs::remove_dir_all(&dir).unwrap();
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
        let file = ClaimedFile::open(dir.join("election.json")).unwrap();
        let paths = &file.paths;
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
        let file = ClaimedFile::open(dir.join("election.json")).unwrap();
        let paths = &file.paths;
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
