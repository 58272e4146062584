//! The processes a test starts: store servers that die with the test process, candidates whose
//! output it reads line by line, the ports and directories they use, and what happens when the
//! software is not installed.
//!
//! Why one module: every server start needs the same hygiene (a child that outlives a crashed or
//! killed test would hold its ports and files on a shared machine), and every start must survive a
//! port that another process takes between the moment it was found free and the server binding it.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How often a start polls a server that is not ready yet.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// How many times a server is started on new ports when it exits at once (a port taken since it
/// was found free: by another test's server or a client's ephemeral port).
pub(crate) const ATTEMPTS: usize = 5;

/// A free TCP port on 127.0.0.1, the kernel's choice. It may be taken again before the server
/// binds it, which the starts of this crate notice (the server exits) and retry on new ports.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `Some` of what was started, or `None` after printing "skipped: <why>" when the software is
/// missing; with `CI=true` it panics instead, as CI must run every test.
pub fn or_skip<T>(started: Result<T, String>) -> Option<T> {
    if let Err(why) = &started {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{why}, and CI=true: CI must run these tests");
        }
        println!("skipped: {why}");
    }
    started.ok()
}

/// A new directory `tenure-<kind>-test-<pid>-<n>` under the temporary directory. First removes
/// those of test processes that are gone (a killed test leaves its servers' files behind, and a
/// server shared by a test binary lives in a static, which is never dropped).
pub fn scratch_dir(kind: &str) -> std::io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = format!("tenure-{kind}-test-");
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(&prefix) else { continue };
            let pid = rest.split('-').next().unwrap_or_default();
            if !pid.is_empty() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{prefix}{}-{n}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The last `lines` lines of a log file, to explain a server that did not come up.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(lines).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Polls `ready` until it holds (true), the server exited, `give_up` holds or `bound` passed
/// (false, with why).
pub(crate) fn wait_ready(
    bound: Duration,
    give_up: fn() -> bool,
    mut exited: impl FnMut() -> bool,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + bound;
    loop {
        if exited() {
            return Err("it exited at start (a port taken since it was found free?)".to_owned());
        }
        if ready() {
            return Ok(());
        }
        if Instant::now() >= deadline || give_up() {
            return Err(format!("it did not serve within {bound:?}"));
        }
        std::thread::sleep(POLL);
    }
}

#[derive(Default)]
struct Exit {
    status: Mutex<Option<ExitStatus>>,
    changed: Condvar,
}

/// A store server: started from a thread that waits for it, with a parent-death signal (so it
/// dies with the test process however that ends, even by SIGKILL), in a process group of its own
/// (a Ctrl-C at the terminal reaches the harness, which stops it, not the server behind its back),
/// standard output and error appended to a log file. Killed when dropped.
pub struct ServerProcess {
    pid: Pid,
    exit: Arc<Exit>,
}

impl ServerProcess {
    /// Starts `command` with its output appended to `log`.
    pub fn spawn(mut command: Command, log: &Path) -> std::io::Result<ServerProcess> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        command.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out).process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // The parent-death signal fires when the thread that forked ends: that thread waits for
        // the server, so it lives as long as the server does.
        let (started, pid) = mpsc::channel();
        let exit = Arc::new(Exit::default());
        let waiter = exit.clone();
        std::thread::spawn(move || match command.spawn() {
            Ok(mut child) => {
                let _ = started.send(Ok(child.id()));
                let status = child.wait().ok();
                *waiter.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
                waiter.changed.notify_all();
            }
            Err(e) => {
                let _ = started.send(Err(e));
            }
        });
        let pid = pid.recv().unwrap_or_else(|_| Err(std::io::Error::other("the spawning thread died")))?;
        Ok(ServerProcess { pid: Pid::from_raw(pid as i32), exit })
    }

    /// The server's process id, also the id of its process group (it leads one of its own):
    /// what a harness signals to freeze the server (SIGSTOP) and thaw it (SIGCONT).
    pub fn pid(&self) -> u32 {
        self.pid.as_raw().unsigned_abs()
    }

    /// Whether the server has exited.
    pub fn exited(&self) -> bool {
        self.exit.status.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Kills the server (SIGKILL) and waits (at most 10 s) until it is gone, its ports closed.
    pub fn kill(&self) {
        let status = self.exit.status.lock().unwrap_or_else(|e| e.into_inner());
        if status.is_none() {
            let _ = kill(self.pid, Signal::SIGKILL);
        }
        let _ = self.exit.changed.wait_timeout_while(status, Duration::from_secs(10), |s| s.is_none());
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A process whose standard output is read line by line on a thread (a candidate that reports
/// what it does), with its standard input for commands; killed when dropped.
pub struct ChildProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdin: Option<ChildStdin>,
    /// A name for messages.
    pub name: String,
}

impl ChildProcess {
    /// Starts `command` with piped standard input and output.
    pub fn spawn(name: &str, mut command: Command) -> ChildProcess {
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = command.spawn().expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildProcess { child, lines, stdin, name: name.to_owned() }
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The next line that starts with `prefix`, within `limit`; other lines are passed to `seen`.
    pub fn expect_line(&self, prefix: &str, limit: Duration, mut seen: impl FnMut(&str)) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // libtest's "test name ... " may precede the first line of a child on one line.
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(line) if line.contains(&format!("... {prefix}")) => {
                    let at = line.find(&format!("... {prefix}")).unwrap_or(0) + 4;
                    return line[at..].to_owned();
                }
                Ok(line) => seen(&line),
                Err(_) => panic!("{}: no line starting with {prefix:?} within {limit:?}", self.name),
            }
        }
    }

    /// Every line available now.
    pub fn drain(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Writes `line` to its standard input.
    pub fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    /// Sends it `signal`.
    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid()), signal).expect("signal child");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
