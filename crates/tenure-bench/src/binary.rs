//! Finding (and if need be building) the `tenure` binary, and the command lines the process
//! benchmarks run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The environment variable that names the `tenure` binary to measure.
pub const TENURE_BIN: &str = "TENURE_BIN";

/// The `tenure` binary to measure: `$TENURE_BIN` if set; else `tenure` in the directory of the
/// running benchmark's profile (`<target-dir>/release/tenure`, by default
/// `<workspace>/target/release/tenure`), brought up to date first with `cargo build --release -p
/// tenure-cli --bin tenure` (a no-op when nothing changed). Panics with an explanation if no
/// usable binary results.
///
/// Why: the process benchmarks measure the real CLI as users run it, built with optimisations
/// from the same sources as the benchmark (never a stale binary); `TENURE_BIN` lets them measure
/// a binary built elsewhere (another branch, an older release).
pub fn tenure_binary() -> PathBuf {
    let binary = match std::env::var_os(TENURE_BIN) {
        Some(path) => PathBuf::from(path),
        None => {
            let release_dir = release_dir();
            build(&release_dir);
            release_dir.join("tenure")
        }
    };
    check_usable(&binary);
    binary
}

/// The `tenure` binary to measure, as it was built: `$TENURE_BIN` if set, else
/// `<target-dir>/release/tenure`. Builds nothing; panics, naming the build command, if there is
/// no usable binary.
///
/// Why: the footprint gate (`idle_rss`) measures the release build someone made, the way they
/// made it (a build from inside the benchmark would take the bench's cores and minutes on a
/// shared machine, and could differ from the binary under test in its environment).
pub fn built_release_binary() -> PathBuf {
    let binary = std::env::var_os(TENURE_BIN).map_or_else(|| release_dir().join("tenure"), PathBuf::from);
    assert!(
        binary.is_file(),
        "no tenure binary at {}: run `cargo build --release -p tenure-cli` first (or set {TENURE_BIN})",
        binary.display()
    );
    check_usable(&binary);
    binary
}

/// `<target-dir>/release`: benchmarks run from `<target-dir>/<profile>/deps/<name>-<hash>`, this
/// crate's programs from `<target-dir>/<profile>/<name>`; the binary measured is always the
/// release build, whatever profile built the program measuring it.
fn release_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running benchmark");
    let mut directory = exe.parent().expect("the benchmark lives in a directory");
    if directory.file_name().is_some_and(|name| name == "deps") {
        directory = directory.parent().expect("the deps directory has a parent");
    }
    directory.parent().expect("the profile directory has a parent").join("release")
}

fn build(release_dir: &Path) {
    let target_dir = release_dir.parent().expect("the release directory has a parent");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("updating {}: cargo build --release -p tenure-cli --bin tenure", release_dir.join("tenure").display());
    let status = Command::new(cargo)
        .args(["build", "--release", "-p", "tenure-cli", "--bin", "tenure", "--target-dir"])
        .arg(target_dir)
        .current_dir(&workspace)
        .stdout(Stdio::null())
        .status()
        .expect("run cargo to build the tenure binary");
    assert!(status.success(), "building the tenure binary failed ({status}); set {TENURE_BIN} to a built binary");
}

/// Refuses a binary that is not the CLI with `tenure elect` (a stub, a wrong path).
fn check_usable(binary: &Path) {
    let output = Command::new(binary)
        .args(["elect", "--help"])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (set {TENURE_BIN}): {e}", binary.display()));
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && help.contains("--election") && help.contains("--lock"),
        "{} has no usable `tenure elect` (status {}); build the CLI or set {TENURE_BIN}",
        binary.display(),
        output.status
    );
}

/// The arguments of one `tenure elect` process.
#[derive(Debug, Clone)]
pub struct Elect<'a> {
    /// `--election`.
    pub election: &'a str,
    /// `--id`.
    pub id: &'a str,
    /// The lock file, passed as `--lock file://<path>`.
    pub lock: &'a Path,
    /// `--ttl`, e.g. `"2s"`; the CLI's default when `None`.
    pub ttl: Option<&'a str>,
    /// `--http`; no HTTP server when `None`.
    pub http: Option<SocketAddr>,
}

impl Elect<'_> {
    /// The command line, with standard input and output closed and standard error written to
    /// `log` (created or truncated).
    pub fn command(&self, binary: &Path, log: &Path) -> std::io::Result<Command> {
        assert!(self.lock.is_absolute(), "the lock path must be absolute: {}", self.lock.display());
        let path = self.lock.to_str().filter(|p| p.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b)));
        let path = path.unwrap_or_else(|| panic!("the lock path needs no URL escaping: {}", self.lock.display()));
        let mut command = Command::new(binary);
        command.args(["elect", "--election", self.election, "--id", self.id, "--lock", &format!("file://{path}")]);
        if let Some(ttl) = self.ttl {
            command.args(["--ttl", ttl]);
        }
        if let Some(http) = self.http {
            command.args(["--http", &http.to_string()]);
        }
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(log)?);
        Ok(command)
    }
}

/// A loopback address with a port that was free a moment ago (bound and released).
pub fn free_loopback_address() -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.local_addr()
}
