//! `tenure elect` and `status` on a ZooKeeper with digest users (and over TLS, with the feature
//! `zk-tls`), with the user, password file and CA named in the `--lock` URL.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{run_to_end, wait_for_leader};
use tenure_testkit::zookeeper;

/// A directory of password files, removed when dropped.
struct PasswordFiles(std::path::PathBuf);

impl PasswordFiles {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tenure-cli-secure-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the test directory");
        PasswordFiles(dir)
    }

    fn write(&self, name: &str, password: &str) -> std::path::PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, format!("{password}\n")).expect("write the password file");
        path
    }
}

impl Drop for PasswordFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn elect_and_status_on_zookeeper_with_a_digest_user_and_a_wrong_password_refused() {
    let Some(server) = zookeeper::server() else { return };
    let path = zookeeper::unique_path("cli-digest");
    let url = |pw: &Path| format!("zk://tenure@{}{path}?password-file={}", server.servers, pw.display());
    let files = PasswordFiles::new("digest");
    let right = url(&files.write("zk-pw", "s3cret"));
    let (_one, one_http) = common::start_elect("one", "z", &right, "3s");
    wait_for_leader(&one_http, "one", Duration::from_secs(15), "the candidate leads");
    assert_eq!(common::status_json("z", &right)["leader"], "one");

    let wrong = url(&files.write("zk-wrong-pw", "guess"));
    let (code, _, stderr) = run_to_end(&["status", "--election", "z", "--lock", &wrong]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("may not campaign") && stderr.contains("wrong password"), "{stderr}");
    assert!(!stderr.contains("guess"), "{stderr}");
}

#[cfg(feature = "zk-tls")]
#[test]
fn elect_on_zookeeper_over_tls() {
    let Some((server, pki)) = zookeeper::tls_server(false) else { return };
    let url = format!("zk://{}{}?cacert={}", server.servers, zookeeper::unique_path("cli-tls"), pki.ca.display());
    let (_one, one_http) = common::start_elect("one", "z", &url, "3s");
    wait_for_leader(&one_http, "one", Duration::from_secs(15), "the candidate leads over TLS");
    let other_ca = format!("zk://{}/x?cacert={}", server.servers, pki.other_ca.display());
    let (code, _, stderr) = run_to_end(&["status", "--election", "z", "--lock", &other_ca]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("TLS handshake failed") && stderr.contains("UnknownIssuer"), "{stderr}");
}
