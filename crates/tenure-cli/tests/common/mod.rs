//! Helpers for the command-line tests: real `tenure` processes, real signals, and bounded waits
//! for conditions (never sleeps as synchronisation).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary under test.
pub const TENURE: &str = env!("CARGO_BIN_EXE_tenure");

/// Polls `probe` every few milliseconds until it returns `Some` or `limit` has passed.
pub fn wait_until<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A running `tenure` process whose standard error is collected as it is written.
pub struct Tenure {
    pub name: String,
    child: Child,
    /// The write end of standard input, for a process started by [`Tenure::start_piped`].
    pub stdin: Option<std::process::ChildStdin>,
    stderr: Arc<Mutex<String>>,
    stdout: Arc<Mutex<String>>,
    reaped: Option<ExitStatus>,
}

impl Tenure {
    /// Starts `tenure ARGS...` with standard output discarded and standard error collected.
    pub fn start(name: &str, args: &[&str]) -> Tenure {
        Self::start_with(name, without_cluster(Command::new(TENURE).args(args)))
    }

    /// Starts a prepared command (with its arguments and environment set).
    pub fn start_with(name: &str, command: &mut Command) -> Tenure {
        Self::spawn(name, command.stdin(Stdio::null()))
    }

    /// Starts `tenure ARGS...` with standard input a pipe held in [`Tenure::stdin`].
    pub fn start_piped(name: &str, args: &[&str]) -> Tenure {
        let mut tenure = Self::spawn(name, without_cluster(Command::new(TENURE).args(args)).stdin(Stdio::piped()));
        tenure.stdin = tenure.child.stdin.take();
        tenure
    }

    fn spawn(name: &str, command: &mut Command) -> Tenure {
        let mut child = command
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tenure");
        let stderr = collect(child.stderr.take().expect("stderr is piped"));
        let stdout = collect(child.stdout.take().expect("stdout is piped"));
        Tenure { name: name.to_owned(), child, stdin: None, stderr, stdout, reaped: None }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Everything written to standard error so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Everything written to standard output so far.
    pub fn output(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits for a line of standard error containing `needle`; panics with the log if none comes.
    pub fn wait_for_log(&self, needle: &str, limit: Duration) -> String {
        wait_until(limit, || self.log().lines().find(|l| l.contains(needle)).map(str::to_owned)).unwrap_or_else(|| {
            panic!("{}: no log line with {needle:?} within {limit:?}; log:\n{}", self.name, self.log())
        })
    }

    /// The address the process serves HTTP on, from its log.
    pub fn http_address(&self) -> String {
        let line = self.wait_for_log("over HTTP", Duration::from_secs(10));
        if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) {
            return event["address"].as_str().expect("address field").to_owned();
        }
        let start = line.find("address=").expect("address field") + "address=".len();
        line[start..].split_whitespace().next().unwrap().trim_matches('"').to_owned()
    }

    /// Sends a signal to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// Waits for the process to exit, up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.reaped {
            return Some(status);
        }
        let child = &mut self.child;
        let status = wait_until(limit, || child.try_wait().unwrap())?;
        self.reaped = Some(status);
        Some(status)
    }

    /// Waits for the process to exit and returns its status code; panics if it does not.
    pub fn exit_code(&mut self, limit: Duration) -> i32 {
        let status =
            self.wait_exit(limit).unwrap_or_else(|| panic!("{} did not exit; log:\n{}", self.name, self.log()));
        status.code().unwrap_or_else(|| panic!("{} ended by {status:?}; log:\n{}", self.name, self.log()))
    }

    pub fn is_running(&mut self) -> bool {
        self.reaped.is_none() && self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Tenure {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Collects what a pipe delivers, line by line, on a thread of its own.
fn collect(pipe: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut text = sink.lock().unwrap();
            text.push_str(&line);
            text.push('\n');
        }
    });
    text
}

/// `GET path` on `address`; the body of a 200 answer.
pub fn http_get(address: &str, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    if !response.starts_with("HTTP/1.1 200") {
        return None;
    }
    response.split("\r\n\r\n").nth(1).map(str::to_owned)
}

/// The leader a `tenure elect --http` answers, `Some("")` when it knows none.
pub fn http_leader(address: &str) -> Option<String> {
    let body = http_get(address, "/")?;
    let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
    answer["name"].as_str().map(str::to_owned)
}

/// Waits up to `limit` until the `tenure elect --http` at `address` names `leader`; panics with
/// `what` otherwise.
pub fn wait_for_leader(address: &str, leader: &str, limit: Duration, what: &str) {
    wait_until(limit, || (http_leader(address)? == leader).then_some(())).expect(what);
}

/// A directory removed at the end of the test.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("tenure-cli-test-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Hides the environment that makes `tenure` choose a Kubernetes lock (a developer's KUBECONFIG,
/// a CI job running in a pod), so that tests of the default lock test the default lock.
pub fn without_cluster(command: &mut Command) -> &mut Command {
    command.env_remove("KUBECONFIG").env_remove("KUBERNETES_SERVICE_HOST").env_remove("KUBERNETES_SERVICE_PORT")
}

/// `file://` URL of a path.
pub fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// A command line's words, for arguments without spaces.
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Runs `tenure ARGS...` to completion; returns (exit code, stdout, stderr).
pub fn run_to_end(args: &[&str]) -> (i32, String, String) {
    let output = without_cluster(Command::new(TENURE).args(args)).stdin(Stdio::null()).output().expect("run tenure");
    (
        output.status.code().expect("exited normally"),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `tenure status --output json` of `election` on `lock_url`, which must exit 0.
pub fn status_json(election: &str, lock_url: &str) -> serde_json::Value {
    let (code, stdout, stderr) = run_to_end(&["status", "--election", election, "--lock", lock_url, "--output=json"]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// Starts `tenure elect` as `id` in `election` on `lock_url` with `--ttl`, serving HTTP on a free
/// loopback port; returns the process and its HTTP address.
pub fn start_elect(id: &str, election: &str, lock_url: &str, ttl: &str) -> (Tenure, String) {
    let tenure = Tenure::start(
        id,
        &["elect", "--election", election, "--id", id, "--lock", lock_url, "--ttl", ttl, "--http", "127.0.0.1:0"],
    );
    let address = tenure.http_address();
    (tenure, address)
}

/// `GET path`: the status code and the body, whatever the status.
pub fn get(address: &str, path: &str) -> Option<(u16, String)> {
    request(address, "GET", path, "")
}

/// `POST path` with an empty body: the status code and the body, whatever the status.
pub fn post(address: &str, path: &str) -> Option<(u16, String)> {
    request(address, "POST", path, "")
}

/// `METHOD path` with `body`: the status code and the body, whatever the status.
pub fn request(address: &str, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(35))).ok()?;
    let length = body.len();
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{body}")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.get(9..12)?.parse().ok()?;
    let (_, body) = response.split_once("\r\n\r\n")?;
    Some((code, body.to_owned()))
}

/// The value of the sample `series` (name and labels) in the answer of `/metrics`.
pub fn metric(address: &str, series: &str) -> Option<f64> {
    let (_, body) = get(address, "/metrics")?;
    body.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Reads Server-Sent Events from a connection, one `data:` payload at a time.
pub struct EventStream {
    lines: std::io::Lines<BufReader<TcpStream>>,
}

impl EventStream {
    pub fn open(address: &str) -> EventStream {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(stream, "GET /events HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut lines = BufReader::new(stream).lines();
        let status = lines.next().unwrap().unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        EventStream { lines }
    }

    /// The next event: its id and its JSON data. Fails after 5 s without one.
    pub fn next(&mut self) -> (u64, serde_json::Value) {
        let (mut id, mut name) = (None, None);
        loop {
            let line = self.lines.next().expect("the stream is open").expect("an event within 5 s");
            if let Some(value) = line.strip_prefix("id: ") {
                id = value.parse().ok();
            } else if let Some(value) = line.strip_prefix("event: ") {
                name = Some(value.to_owned());
            } else if let Some(data) = line.strip_prefix("data: ") {
                assert_eq!(name.as_deref(), Some("leadership"));
                return (id.expect("an id before the data"), serde_json::from_str(data).unwrap());
            }
        }
    }
}

/// Starts `tenure status --watch` on an election, printing JSON lines and reading every 100 ms
/// where the store does not notify changes.
pub fn watch_election(election: &str, lock_url: &str) -> Tenure {
    Tenure::start(
        "watch",
        &["status", "--election", election, "--lock", lock_url, "--watch", "--interval", "100ms", "--output", "json"],
    )
}

/// What a watch printed so far: (leader, term) per line, `None` where nobody leads.
pub fn watched(watch: &Tenure) -> Vec<(Option<String>, Option<i64>)> {
    watch
        .output()
        .lines()
        .map(|line| {
            let report: serde_json::Value = serde_json::from_str(line).expect("one JSON object per line");
            (report["leader"].as_str().map(str::to_owned), report["term"].as_i64())
        })
        .collect()
}

/// Waits until a watch has printed the leaders `expected`, in order (lines naming nobody in
/// between are allowed: a release is seen before the next acquisition), with strictly growing
/// terms; panics with what it printed otherwise.
pub fn wait_for_watched_leaders(watch: &Tenure, expected: &[&str]) {
    let leaders = || -> Vec<(String, i64)> {
        watched(watch).into_iter().filter_map(|(leader, term)| Some((leader?, term.unwrap_or_default()))).collect()
    };
    let seen = wait_until(Duration::from_secs(10), || {
        let seen = leaders();
        (seen.iter().map(|(leader, _)| leader.as_str()).collect::<Vec<_>>() == expected).then_some(seen)
    })
    .unwrap_or_else(|| panic!("the watch printed {:?}, not {expected:?}; log:\n{}", watched(watch), watch.log()));
    assert!(seen.windows(2).all(|pair| pair[0].1 < pair[1].1), "terms do not grow: {seen:?}");
}

/// Starts candidate "one" (`--ttl 3s`) on `lock_url`, then, once it leads, "two": each with its
/// HTTP address, once "two" follows "one".
pub fn start_one_then_two(election: &str, lock_url: &str) -> [(Tenure, String); 2] {
    let one = start_elect("one", election, lock_url, "3s");
    wait_for_leader(&one.1, "one", Duration::from_secs(10), "one leads");
    let two = start_elect("two", election, lock_url, "3s");
    wait_for_leader(&two.1, "one", Duration::from_secs(10), "two follows");
    [one, two]
}

/// "one" leads and "two" follows on `lock_url` (a store other than the file lock), `status`
/// agrees, `while_one_leads` checks more; on SIGTERM "one" exits 0 and "two" takes over within a
/// second, under a greater term.
pub fn assert_status_agrees_and_sigterm_hands_over(election: &str, lock_url: &str, while_one_leads: impl FnOnce()) {
    let [(mut one, _), (_two, two_http)] = start_one_then_two(election, lock_url);
    let status = status_json(election, lock_url);
    assert_eq!(status["leader"], "one");
    let first_term = status["term"].as_i64().expect("a numeric term");
    while_one_leads();

    one.signal(libc::SIGTERM);
    let stopped = Instant::now();
    wait_for_leader(&two_http, "two", Duration::from_secs(5), "the follower takes over");
    assert!(stopped.elapsed() < Duration::from_secs(1), "handover took {:?}", stopped.elapsed());
    assert_eq!(one.exit_code(Duration::from_secs(5)), 0);
    let status = status_json(election, lock_url);
    assert_eq!(status["leader"], "two");
    assert!(status["term"].as_i64().unwrap() > first_term, "terms grow: {status}");
}

/// `tenure run --ttl 3s` on `lock_url`: the command sees a positive `TENURE_TERM`, and its exit
/// status is tenure's.
pub fn assert_run_passes_the_term_and_the_exit_status(election: &str, lock_url: &str) {
    let script = "echo term=$TENURE_TERM; exit 7";
    let (code, stdout, stderr) =
        run_to_end(&["run", "--election", election, "--lock", lock_url, "--ttl", "3s", "--", "sh", "-c", script]);
    assert_eq!(code, 7, "{stderr}");
    let term: u64 = stdout.trim().strip_prefix("term=").and_then(|t| t.parse().ok()).expect("a numeric term");
    assert!(term > 0);
}

/// Starts a `status --watch`, then candidates "one" and "two" (`--ttl 3s`) on `lock_url`, stops
/// "one", and checks that the watch printed "one" and then "two".
pub fn assert_watch_follows_a_handover(election: &str, lock_url: &str) {
    let watch = watch_election(election, lock_url);
    let [(mut first, _), _second] = start_one_then_two(election, lock_url);
    wait_for_watched_leaders(&watch, &["one"]);
    first.signal(libc::SIGTERM);
    wait_for_watched_leaders(&watch, &["one", "two"]);
    assert_eq!(first.exit_code(Duration::from_secs(5)), 0);
}

/// Starts `tenure apiserver` on a free loopback port, writing its kubeconfig to `kubeconfig`;
/// returns once it serves.
pub fn start_apiserver(kubeconfig: &Path) -> Tenure {
    let server = Tenure::start(
        "apiserver",
        &["apiserver", "--listen", "127.0.0.1:0", "--kubeconfig", kubeconfig.to_str().unwrap()],
    );
    wait_until(Duration::from_secs(10), || server.output().lines().next().map(str::to_owned))
        .unwrap_or_else(|| panic!("the API server printed no URL; log:\n{}", server.log()));
    server
}

/// `tenure write` from a command that `tenure run` runs on `url`: the leader's write under its
/// own term lands, one under the term before it is refused as deposed (exit 3) and changes
/// nothing; `read` gives what the store holds at `target` afterwards.
pub fn assert_write_is_fenced(election: &str, url: &str, target: &str, read: impl FnOnce() -> Option<Vec<u8>>) {
    let write = format!("{TENURE} write --election {election} --lock \"$TENURE_LOCK\"");
    let script = format!(
        "printf leader | {write} {target} || exit 10; \
         printf stale | {write} --term $((TENURE_TERM - 1)) {target}; test $? -eq 3 || exit 11"
    );
    let (code, _, stderr) = run_to_end(&["run", "--election", election, "--lock", url, "--ttl", "2s", "--", "sh", "-c", &script]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("deposed"), "{stderr}");
    assert_eq!(read().as_deref(), Some(&b"leader"[..]));
}
