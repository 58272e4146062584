//! Test harness: a real ZooKeeper server per test binary on a free loopback port, candidates in
//! child processes (the test binary re-executed), a Curator LeaderLatch probe, and waiting for
//! conditions with bounded timeouts.
#![allow(dead_code)]

#[path = "../../../../tests/support/certs.rs"]
pub mod certs;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tenure::{Elector, Leadership};

/// Session timeout used by the tests (the server's tick is 100 ms).
pub const SESSION_TIMEOUT: Duration = Duration::from_millis(1500);

const JAVA_DIR: &str = "/usr/share/java";

/// A running ZooKeeper server.
pub struct ZkServer {
    pub servers: String,
    pub port: u16,
    dir: PathBuf,
    pid: Mutex<u32>,
}

fn jar(name: &str) -> String {
    format!("{JAVA_DIR}/{name}")
}

/// The class path of the server and of the Curator probe.
pub fn classpath() -> String {
    [
        "zookeeper.jar",
        "zookeeper-jute.jar",
        "slf4j-api.jar",
        "slf4j-nop.jar",
        "curator-framework.jar",
        "curator-recipes.jar",
        "curator-client.jar",
        "guava.jar",
        // Netty: the server's TLS port (secureClientPort) needs NettyServerCnxnFactory.
        "netty-buffer.jar",
        "netty-codec.jar",
        "netty-common.jar",
        "netty-handler.jar",
        "netty-resolver.jar",
        "netty-transport.jar",
        "netty-transport-native-epoll.jar",
        "netty-transport-native-unix-common.jar",
    ]
    .iter()
    .map(|j| jar(j))
    .collect::<Vec<_>>()
    .join(":")
}

fn have_zookeeper() -> Result<(), String> {
    for tool in ["java", "javac"] {
        let found = Command::new(tool).arg("-version").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if !found.map(|s| s.success()).unwrap_or(false) {
            return Err(format!("`{tool}` is not installed (apt-get install openjdk-17-jdk-headless)"));
        }
    }
    for j in
        ["zookeeper.jar", "zookeeper-jute.jar", "curator-recipes.jar", "curator-framework.jar", "curator-client.jar"]
    {
        if !Path::new(&jar(j)).exists() {
            return Err(format!("{} is missing (apt-get install libzookeeper-java libcurator-recipes-java)", jar(j)));
        }
    }
    Ok(())
}

/// The server shared by the tests of this binary, or `None` (after printing "skipped") when
/// ZooKeeper or Java is not installed. With `CI=true` a missing server fails the test.
pub fn server() -> Option<&'static ZkServer> {
    static SERVER: OnceLock<Result<ZkServer, String>> = OnceLock::new();
    or_skip(SERVER.get_or_init(|| start_server_with(None)).as_ref().map_err(String::clone))
}

/// The server, or `None` (after printing "skipped") when it could not start; with `CI=true` a
/// missing server fails the test.
fn or_skip<T>(started: Result<T, String>) -> Option<T> {
    if let Err(why) = &started {
        if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
            panic!("ZooKeeper integration tests need a server and CI=true: {why}");
        }
        eprintln!("skipped: {why}");
    }
    started.ok()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// Removes the temporary directories of earlier test processes that are gone (the shared
/// server lives in a static, which is never dropped).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("tenure-zk-test-") else { continue };
        let pid = rest.split('-').next().unwrap_or_default();
        if !pid.is_empty() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A server of its own whose clients must use TLS: `servers` names its TLS port only (the plain
/// port stays open on `port` for the readiness probe). The PKI is generated into its directory.
/// With `client_auth` the server demands a client certificate signed by the CA.
pub fn tls_server(client_auth: bool) -> Option<(ZkServer, certs::TestPki)> {
    let dir = std::env::temp_dir().join(format!("tenure-zk-test-{}-pki-{}", std::process::id(), free_port()));
    let pki = certs::TestPki::generate(&dir);
    or_skip(start_server_with(Some((&pki, client_auth))).map(|server| (server, pki)))
}

fn start_server_with(tls: Option<(&certs::TestPki, bool)>) -> Result<ZkServer, String> {
    have_zookeeper()?;
    remove_stale_dirs();
    // A port found free may be taken before the JVM binds it (by another test's server or a
    // client's ephemeral port): the JVM then exits at once, and a start on new ports follows.
    let mut why = String::new();
    for _ in 0..3 {
        match try_start_server(tls) {
            Ok(server) => return Ok(server),
            Err(error) => why = error,
        }
    }
    Err(why)
}

fn try_start_server(tls: Option<(&certs::TestPki, bool)>) -> Result<ZkServer, String> {
    let dir = std::env::temp_dir().join(format!("tenure-zk-test-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(dir.join("data")).map_err(|e| e.to_string())?;
    let port = free_port();
    let config = format!(
        "tickTime=100\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
         4lw.commands.whitelist=ruok,srvr\nminSessionTimeout=200\nmaxSessionTimeout=10000\nmaxClientCnxns=0\n",
        dir.join("data").display()
    );
    let mut config = config;
    let mut servers = format!("127.0.0.1:{port}");
    if let Some((pki, client_auth)) = tls {
        // ZooKeeper's PEM key store wants the key and the certificate in one file.
        let bundle = dir.join("server-bundle.pem");
        let pem = [std::fs::read(&pki.server_key), std::fs::read(&pki.server_cert)]
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?
            .concat();
        std::fs::write(&bundle, pem).map_err(|e| e.to_string())?;
        let secure_port = free_port();
        config.push_str(&format!(
            "secureClientPort={secure_port}\nsecureClientPortAddress=127.0.0.1\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
             ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth={}\n",
            bundle.display(),
            pki.ca.display(),
            if client_auth { "need" } else { "none" }
        ));
        servers = format!("127.0.0.1:{secure_port}");
    }
    std::fs::write(dir.join("zoo.cfg"), config).map_err(|e| e.to_string())?;
    let server = ZkServer { servers, port, dir, pid: Mutex::new(0) };
    server.launch()?;
    Ok(server)
}

impl ZkServer {
    /// A server of its own for a test that stops and restarts it; `None` as for [`server`].
    pub fn private() -> Option<ZkServer> {
        or_skip(start_server_with(None))
    }

    /// Starts the JVM on this server's configuration and waits until it serves.
    fn launch(&self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .map_err(|e| e.to_string())?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new("java");
        command
            .arg("-Xmx256m")
            .arg("-XX:+UseSerialGC")
            .arg("-XX:TieredStopAtLevel=1")
            .arg("-cp")
            .arg(classpath())
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(self.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let (pid, exited) = spawn_tied_to_process(command).map_err(|e| format!("cannot start java: {e}"))?;
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = pid;
        let deadline = Instant::now() + Duration::from_secs(30);
        // `ruok` can answer before start-up is over: wait for `srvr` to report the mode too.
        while !answers(self.port, "ruok", "imok") || !answers(self.port, "srvr", "Mode:") {
            if let Ok(status) = exited.try_recv() {
                return Err(format!("ZooKeeper exited at start ({status}): a port taken since it was found free?"));
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                return Err(format!("ZooKeeper did not answer within 30 s; log:\n{log}"));
            }
            std::thread::sleep(Duration::from_millis(50)); // polling a process we cannot watch
        }
        Ok(())
    }

    /// Kills the server (SIGKILL) and waits until its port is closed.
    pub fn kill(&self) {
        let pid = *self.pid.lock().unwrap_or_else(|e| e.into_inner());
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same port and data (sessions survive).
    pub fn restart(&self) {
        self.launch().expect("restart ZooKeeper");
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Spawns `command` from a thread that lives as long as the process, with a parent-death
/// signal, so the child dies with the test binary whatever way it exits. Returns its pid and
/// a receiver of its exit status.
fn spawn_tied_to_process(mut command: Command) -> std::io::Result<(u32, mpsc::Receiver<std::process::ExitStatus>)> {
    let (tx, rx) = mpsc::channel();
    let (exit_tx, exit_rx) = mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: prctl is async-signal-safe; called between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let spawned = command.spawn();
        match spawned {
            Ok(mut child) => {
                let _ = tx.send(Ok(child.id()));
                if let Ok(status) = child.wait() {
                    let _ = exit_tx.send(status);
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    });
    let pid = rx.recv().unwrap_or_else(|_| Err(std::io::Error::other("spawner thread died")))?;
    Ok((pid, exit_rx))
}

/// True when the server answers `word` with text containing `expected`.
fn answers(port: u16, word: &str, expected: &str) -> bool {
    four_letter_word(port, word).is_some_and(|answer| answer.contains(expected))
}

/// Sends a four-letter word and returns the answer.
pub fn four_letter_word(port: u16, word: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// A unique election path for one test.
pub fn unique_path(test: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    format!("/tenure-test/{}/{}-{}", std::process::id(), test, COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Waits (bounded) until `condition` holds over the electors' latest snapshots, waking on every
/// published change.
pub async fn wait_until(
    electors: &[&Elector],
    limit: Duration,
    what: &str,
    mut condition: impl FnMut(&[Leadership]) -> bool,
) {
    let mut receivers: Vec<_> = electors.iter().map(|e| e.subscribe()).collect();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let snapshots: Vec<Leadership> = receivers.iter_mut().map(|r| r.borrow_and_update().clone()).collect();
        if condition(&snapshots) {
            return;
        }
        let changes = futures::future::select_all(receivers.iter_mut().map(|r| Box::pin(r.changed())));
        if tokio::time::timeout_at(deadline, changes).await.is_err() {
            panic!("timed out after {limit:?} waiting for {what}; last snapshots: {snapshots:?}");
        }
    }
}

/// Exactly one leader, and every candidate names it with the same term.
pub fn one_agreed_leader(snapshots: &[Leadership], identities: &[&str]) -> bool {
    let leaders: Vec<usize> = (0..snapshots.len()).filter(|&i| snapshots[i].is_leader()).collect();
    if leaders.len() != 1 {
        return false;
    }
    let leader = identities[leaders[0]];
    let term = snapshots[leaders[0]].term;
    snapshots.iter().all(|s| s.leader.as_deref() == Some(leader) && s.term == term && term.is_some())
}

/// The current CLOCK_MONOTONIC reading in nanoseconds: one clock for every process on the host.
pub fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// A tokio instant as a CLOCK_MONOTONIC reading (std's Instant is CLOCK_MONOTONIC on Linux).
pub fn instant_to_monotonic_ns(instant: tokio::time::Instant) -> u128 {
    let now_ns = monotonic_ns();
    let now = tokio::time::Instant::now();
    if instant >= now {
        now_ns + (instant - now).as_nanos()
    } else {
        now_ns.saturating_sub((now - instant).as_nanos())
    }
}

/// A process with line-oriented stdout read on a thread.
pub struct ChildProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdin: Option<ChildStdin>,
    pub name: String,
}

impl ChildProcess {
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

    pub fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal).expect("signal child");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Environment variable that turns a re-executed test binary into a candidate process.
pub const CHILD_ENV: &str = "TENURE_ZK_CHILD";

/// Starts this test binary again as a candidate process running `entry` (a test function that
/// calls [`child_candidate_main`]).
pub fn spawn_candidate(entry: &str, servers: &str, path: &str, identity: &str) -> ChildProcess {
    let mut command = Command::new(std::env::current_exe().expect("current exe"));
    command
        .args([entry, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{servers}|{path}|{identity}|{}", SESSION_TIMEOUT.as_millis()));
    ChildProcess::spawn(identity, command)
}

/// The body of a candidate process: campaigns and prints `LEADING <term> <deadline_ns>` when
/// it starts leading, `DEADLINE <deadline_ns>` when its self-fencing deadline moves (a
/// CLOCK_MONOTONIC reading), and `FOLLOWING` when it stops. Returns at once when not a child.
pub fn child_candidate_main() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let (servers, path, identity) = (parts[0].to_owned(), parts[1].to_owned(), parts[2].to_owned());
    let timeout = Duration::from_millis(parts[3].parse().expect("timeout"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let election = tenure_zk::ZkElection::connect(&servers, &path, timeout).await.expect("connect");
        let elector = election.campaign(identity).expect("campaign");
        let mut leadership = elector.subscribe();
        let mut last_deadline = None;
        let out = Mutex::new(std::io::stdout());
        let say = |line: String| {
            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        };
        let mut ticker = tokio::time::interval(Duration::from_millis(5));
        let mut was_leader = false;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = leadership.changed() => {}
            }
            match elector.tenure() {
                Some(tenure) => {
                    let valid_until = tenure.valid_until();
                    let deadline = instant_to_monotonic_ns(valid_until);
                    if !was_leader {
                        say(format!("LEADING {} {deadline}", tenure.term()));
                        was_leader = true;
                    } else if last_deadline != Some(valid_until) {
                        say(format!("DEADLINE {deadline}"));
                    }
                    last_deadline = Some(valid_until);
                }
                None => {
                    if was_leader {
                        say("FOLLOWING".to_owned());
                        was_leader = false;
                        last_deadline = None;
                    }
                }
            }
        }
    });
}

/// A Curator `LeaderLatch` in a JVM, driven over stdin and stdout (see tests/java/LatchProbe.java).
pub fn spawn_latch_probe(servers: &str, path: &str, id: &str) -> ChildProcess {
    static COMPILED: OnceLock<PathBuf> = OnceLock::new();
    let classes = COMPILED.get_or_init(|| {
        let out = std::env::temp_dir().join(format!("tenure-zk-test-{}-latch-probe", std::process::id()));
        std::fs::create_dir_all(&out).expect("class dir");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/LatchProbe.java");
        let status = Command::new("javac")
            .args(["-nowarn", "-cp", &classpath(), "-d"])
            .arg(&out)
            .arg(source)
            .status()
            .expect("run javac");
        assert!(status.success(), "javac failed on LatchProbe.java");
        out
    });
    let mut command = Command::new("java");
    command
        .args(["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp"])
        .arg(format!("{}:{}", classes.display(), classpath()))
        .args(["LatchProbe", servers, path, id]);
    ChildProcess::spawn(id, command)
}
