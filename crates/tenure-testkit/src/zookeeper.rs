//! A real ZooKeeper server (standalone, on the JVM) on a free loopback port, optionally with a
//! TLS port; it can be killed and restarted on its port and data (sessions survive).
//!
//! Why here: the ZooKeeper tests, the command's tests, the HA runtime's tests, the benchmarks and
//! the fault-injection suite all run against a real ZooKeeper (Debian's `libzookeeper-java`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::certs::TestPki;
use crate::process::{free_port, log_tail, or_skip, scratch_dir, wait_ready, ServerProcess, ATTEMPTS};

/// The session timeout the tests ask for (the server's tick is 100 ms).
pub const SESSION_TIMEOUT: Duration = Duration::from_millis(1500);

/// How long a start waits for the JVM to serve.
const START_BOUND: Duration = Duration::from_secs(60);

const JAVA_DIR: &str = "/usr/share/java";

/// What the server needs to run; its class path also names Curator (for the tests' Curator
/// probe) and Netty (for the TLS port), which the JVM loads only when used.
const SERVER_JARS: [&str; 4] = ["zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-nop.jar"];

/// What to start; [`ZkConfig::default`] gives a plain server in a directory of its own that
/// grants sessions of at most 10 s.
#[derive(Debug, Clone)]
pub struct ZkConfig {
    /// `Some(client_auth)`: the clients must use TLS (`servers` names the TLS port only), with a
    /// PKI generated for the occasion; with `client_auth` the server demands a client
    /// certificate signed by the CA.
    pub tls: Option<bool>,
    /// The longest session the server grants (`maxSessionTimeout`).
    pub max_session_timeout: Duration,
    /// Where it keeps its data and log, kept after the server is dropped; `None`: a temporary
    /// directory, removed then.
    pub dir: Option<PathBuf>,
    /// Checked while waiting for the server to serve: true ends the wait (an interrupted run).
    pub give_up: fn() -> bool,
}

impl Default for ZkConfig {
    fn default() -> ZkConfig {
        ZkConfig { tls: None, max_session_timeout: Duration::from_secs(10), dir: None, give_up: || false }
    }
}

/// A running ZooKeeper server.
pub struct ZkServer {
    /// The connection string its clients use (its TLS port for a TLS server).
    pub servers: String,
    /// Its plain client port (also open on a TLS server, for the four-letter words).
    pub port: u16,
    pki: Option<TestPki>,
    dir: PathBuf,
    keep_dir: bool,
    process: Mutex<Option<ServerProcess>>,
}

/// The class path of the server and of the tests' Curator probe.
pub fn classpath() -> String {
    let jars = SERVER_JARS.iter().chain(&[
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
    ]);
    jars.map(|j| format!("{JAVA_DIR}/{j}")).collect::<Vec<_>>().join(":")
}

/// Whether Java and the server's jars are installed; why not if they are not.
pub fn zookeeper_installed() -> Result<(), String> {
    let java = Command::new("java").arg("-version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !java.is_ok_and(|s| s.success()) {
        return Err("`java` is not installed (Debian package openjdk-17-jdk-headless)".to_owned());
    }
    match SERVER_JARS.iter().find(|jar| !Path::new(JAVA_DIR).join(jar).exists()) {
        Some(jar) => Err(format!("{JAVA_DIR}/{jar} is missing (Debian package libzookeeper-java)")),
        None => Ok(()),
    }
}

/// The server shared by the tests of this test binary, or `None` (after printing "skipped") when
/// ZooKeeper or Java is not installed; with `CI=true` a missing server fails the test.
pub fn server() -> Option<&'static ZkServer> {
    static SERVER: OnceLock<Result<ZkServer, String>> = OnceLock::new();
    or_skip(SERVER.get_or_init(|| ZkServer::start(&ZkConfig::default())).as_ref().map_err(String::clone))
}

/// A unique election path for one test (the tests of a binary share one server).
pub fn unique_path(test: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    format!("/tenure-test/{}/{}-{}", std::process::id(), test, COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// A server of its own whose clients must use TLS, and the PKI generated for it (in its
/// directory); with `client_auth` the server demands a client certificate signed by the CA.
/// `None` as for [`server`].
pub fn tls_server(client_auth: bool) -> Option<(ZkServer, TestPki)> {
    let server = or_skip(ZkServer::start(&ZkConfig { tls: Some(client_auth), ..ZkConfig::default() }))?;
    let pki = server.pki.clone().expect("a TLS server has a PKI");
    Some((server, pki))
}

impl ZkServer {
    /// A server of its own, for a test that stops and restarts it; `None` as for [`server`].
    pub fn private() -> Option<ZkServer> {
        or_skip(ZkServer::start(&ZkConfig::default()))
    }

    /// Starts a server and waits (polling, at most 60 s) until it serves. A JVM that exits at
    /// once had a port taken since it was found free: the server is started again on new ports,
    /// up to 5 times.
    pub fn start(config: &ZkConfig) -> Result<ZkServer, String> {
        zookeeper_installed()?;
        let mut why = String::new();
        for _ in 0..ATTEMPTS {
            match Self::try_start(config) {
                Ok(server) => return Ok(server),
                Err(_) if (config.give_up)() => return Err("interrupted".to_owned()),
                Err(error) => why = error,
            }
        }
        Err(why)
    }

    fn try_start(config: &ZkConfig) -> Result<ZkServer, String> {
        let dir = match &config.dir {
            Some(dir) => dir.clone(),
            None => scratch_dir("zk").map_err(|e| format!("a temporary directory: {e}"))?,
        };
        let data = dir.join("data");
        let _ = std::fs::remove_dir_all(&data); // a new server starts on no data
        std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
        let port = free_port().map_err(|e| e.to_string())?;
        let mut config_file = format!(
            "tickTime=100\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr\nminSessionTimeout=200\nmaxSessionTimeout={}\nmaxClientCnxns=0\n",
            data.display(),
            config.max_session_timeout.as_millis()
        );
        let mut servers = format!("127.0.0.1:{port}");
        let pki = config.tls.map(|_| TestPki::generate(&dir.join("pki")));
        if let (Some(pki), Some(client_auth)) = (&pki, config.tls) {
            // ZooKeeper's PEM key store wants the key and the certificate in one file.
            let bundle = dir.join("server-bundle.pem");
            let pem = [std::fs::read(&pki.server_key), std::fs::read(&pki.server_cert)]
                .into_iter()
                .collect::<Result<Vec<_>, _>>();
            std::fs::write(&bundle, pem.map_err(|e| e.to_string())?.concat()).map_err(|e| e.to_string())?;
            let secure_port = free_port().map_err(|e| e.to_string())?;
            config_file.push_str(&format!(
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
        std::fs::write(dir.join("zoo.cfg"), config_file).map_err(|e| e.to_string())?;
        let server = ZkServer { servers, port, pki, dir, keep_dir: config.dir.is_some(), process: Mutex::new(None) };
        server.launch(config.give_up)?;
        Ok(server)
    }

    /// Starts the JVM on this server's configuration and waits until it serves.
    fn launch(&self, give_up: fn() -> bool) -> Result<(), String> {
        let mut command = Command::new("java");
        command
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", &classpath()])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(self.dir.join("zoo.cfg"));
        let log = self.dir.join("server.log");
        let process = ServerProcess::spawn(command, &log).map_err(|e| format!("cannot start java: {e}"))?;
        let exited = || process.exited();
        // `ruok` can answer before start-up is over: wait for `srvr` to report the mode too.
        let serving = || {
            four_letter_word(self.port, "ruok").is_some_and(|a| a.contains("imok"))
                && four_letter_word(self.port, "srvr").is_some_and(|a| a.contains("Mode:"))
        };
        let waited = wait_ready(START_BOUND, give_up, exited, serving);
        *self.process.lock().unwrap_or_else(|e| e.into_inner()) = Some(process);
        waited.map_err(|why| format!("ZooKeeper: {why}; its log ends:\n{}", log_tail(&log, 20)))
    }

    /// The process id of the server's JVM (also its process group's), `None` while it is killed:
    /// to freeze the server (SIGSTOP) and thaw it (SIGCONT), a store outage without a restart.
    pub fn pid(&self) -> Option<u32> {
        self.process.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(ServerProcess::pid)
    }

    /// Kills the server (SIGKILL) and waits until it is gone, its port closed.
    pub fn kill(&self) {
        self.process.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Starts the server again (killed first if it runs) on the same port and data (sessions
    /// survive); panics if it does not serve.
    pub fn restart(&self) {
        self.try_restart(|| false).expect("restart ZooKeeper");
    }

    /// [`ZkServer::restart`] for a harness: an error instead of a panic, and `give_up` checked
    /// while waiting.
    pub fn try_restart(&self, give_up: fn() -> bool) -> Result<(), String> {
        self.kill();
        self.launch(give_up)
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.kill();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Sends a four-letter word (`ruok`, `srvr`) to the server's plain port and returns the answer.
pub fn four_letter_word(port: u16, word: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}
