//! tenure's own writes to standard error and standard output, made so that they can never stop
//! the election.
//!
//! Why this exists: Rust's `eprintln!`/`println!` panic when the write fails (a log pipe whose
//! reader died, `2>/dev/full`), and a plain write blocks while a pipe's reader is not reading. A
//! panic ends tenure without releasing the lock and, under `tenure run`, kills the command
//! without its grace period; a blocked write stalls the election. So:
//!
//! - log lines (tracing's writer and tenure's own error lines) go through a bounded queue to a
//!   thread of their own, which writes them to standard error and ignores failures. When the
//!   queue is full (nobody reads standard error) new lines are dropped and counted, and the count
//!   is reported once writing works again. A closed log pipe loses log lines, nothing else.
//! - results printed to standard output (`status`, `demo`, `break-lock`, `apiserver`'s URL) are written
//!   directly and a failure is reported as a value instead of a panic.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::OnceLock;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How many log lines may wait for standard error before new ones are dropped.
const QUEUE_LINES: usize = 4096;

/// Log lines queued and not yet written. The bound is counted here rather than given to
/// `mpsc::sync_channel`, which allocates and touches a slot for every line up front (160 KB that
/// an idle sidecar would keep resident); the unbounded channel grows with what is queued.
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// What the writer thread is asked to do.
enum Job {
    /// Write these bytes (one formatted log line, usually).
    Write(Vec<u8>),
    /// Answer once everything queued before has been written (or has failed).
    Flush(mpsc::Sender<()>),
}

/// The queue to the writer thread, started on first use; `None` if the thread cannot start (then
/// log lines are dropped, which is still better than stopping).
fn queue() -> Option<&'static Sender<Job>> {
    static QUEUE: OnceLock<Option<Sender<Job>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (sender, receiver) = mpsc::channel();
            std::thread::Builder::new().name("tenure-log".into()).spawn(move || write_jobs(receiver)).ok()?;
            Some(sender)
        })
        .as_ref()
}

/// Lines dropped because the queue was full, not yet reported.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// The writer thread: writes each job to standard error, ignoring failures.
fn write_jobs(receiver: Receiver<Job>) {
    let mut stderr = std::io::stderr();
    for job in receiver {
        match job {
            Job::Write(bytes) => {
                let dropped = DROPPED.swap(0, Ordering::Relaxed);
                if dropped > 0 {
                    let note = format!("tenure: {dropped} log lines were dropped: standard error was not being read\n");
                    let _ = stderr.write_all(note.as_bytes());
                }
                let _ = stderr.write_all(&bytes);
                QUEUED.fetch_sub(1, Ordering::AcqRel);
            }
            Job::Flush(done) => {
                let _ = stderr.flush();
                let _ = done.send(());
            }
        }
    }
}

/// Queues `bytes` for standard error without waiting; drops them if the queue is full.
fn enqueue(bytes: Vec<u8>) {
    let Some(queue) = queue() else { return };
    if !take_place(&QUEUED, QUEUE_LINES) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if queue.send(Job::Write(bytes)).is_err() {
        QUEUED.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts one more line in `queued` if fewer than `limit` are queued; false if the queue is full.
fn take_place(queued: &AtomicUsize, limit: usize) -> bool {
    if queued.fetch_add(1, Ordering::AcqRel) < limit {
        return true;
    }
    queued.fetch_sub(1, Ordering::AcqRel);
    false
}

/// Writes one line of tenure's own (not tracing's) to standard error, the non-panicking
/// `eprintln!`.
pub fn error_line(line: &str) {
    enqueue(format!("{line}\n").into_bytes());
}

/// Waits until the log lines queued so far are written, at most `limit`: called before exiting
/// so that the last lines (why tenure stopped) are not lost, without letting a standard error
/// nobody reads hold up the exit for longer than `limit`.
pub fn flush_logs(limit: Duration) {
    let Some(queue) = queue() else { return };
    let (done, written) = mpsc::channel();
    if queue.send(Job::Flush(done)).is_ok() {
        let _ = written.recv_timeout(limit);
    }
}

/// tracing's writer: each formatted event goes into the queue to standard error.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        enqueue(buf.to_vec());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

/// Writes `text` and a newline to standard output: a result the user asked for (`status`,
/// `demo`). Unlike `println!` it returns the failure (a closed pipe, a full disk) instead of
/// panicking, so the caller decides what it means.
pub fn print_line(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.write_all(b"\n")?;
    stdout.flush()
}

/// [`print_line`] for output whose loss changes nothing (the demo's narration, `break-lock`'s
/// account, whose outcome the exit status carries): a failure is ignored.
pub fn say(text: &str) {
    let _ = print_line(text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_takes_lines_up_to_its_limit_and_again_once_one_is_written() {
        let queued = AtomicUsize::new(0);
        assert!((0..3).all(|_| take_place(&queued, 3)), "three places");
        assert!(!take_place(&queued, 3), "the fourth line is dropped");
        assert_eq!(queued.load(Ordering::Relaxed), 3, "a dropped line takes no place");
        queued.fetch_sub(1, Ordering::AcqRel); // the writer wrote one
        assert!(take_place(&queued, 3));
    }
}
