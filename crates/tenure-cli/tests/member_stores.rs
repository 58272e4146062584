//! `tenure member` on every store, end to end: three sidecar processes on a directory, a real
//! etcd, a real ZooKeeper and a `tenure apiserver` share the partitions, answer `/owns` alike, a
//! member frozen past its lease claims none of the partitions taken over meanwhile from its first
//! answer after the thaw, a killed member's partitions move only after its lease, and a leaving
//! member's move at once (its application released them). Also etcd with TLS, client certificates and a user, named in the
//! `--lock` URL exactly as `tenure elect` takes it. `--ttl 2s` (lease 2 s, renew deadline 1 s);
//! every wait polls with a bounded deadline and checks at every poll that no partition is owned
//! by two members.

mod common;
mod member_support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{file_url, wait_until, TempDir, Tenure, TENURE};
use member_support::{assert_single_owners, owned, owns, partitions, release_draining};
use tenure_testkit::etcd::EtcdCluster;
use tenure_testkit::zookeeper;

const PARTITIONS: usize = 16;
const LEASE: Duration = Duration::from_secs(2);
const RENEW_DEADLINE: Duration = Duration::from_secs(1);

/// Starts `tenure member` as `id` on `url`, with `env` set (and no ambient cluster).
fn start_member(id: &str, url: &str, env: &[(&str, &str)]) -> (Tenure, String) {
    let mut command = Command::new(TENURE);
    command.args(["member", "--group", "g", "--http", "127.0.0.1:0", "--id", id, "--ttl", "2s"]);
    command.args(["--lock", url, "--partitions", &PARTITIONS.to_string(), "--drain-timeout", "10s"]);
    command.env_remove("KUBERNETES_SERVICE_HOST").env_remove("KUBECONFIG");
    for (name, value) in env {
        command.env(name, value);
    }
    let member = Tenure::start_with(id, &mut command);
    let address = member.http_address();
    (member, address)
}

/// Polls (releasing what drains, checking single owners) until `done` holds; its elapsed time.
fn wait_safely(addresses: &[&str], limit: Duration, done: impl Fn() -> bool) -> Option<Duration> {
    let start = Instant::now();
    wait_until(limit, || {
        addresses.iter().for_each(|a| release_draining(a));
        assert_single_owners(addresses);
        done().then(|| start.elapsed())
    })
}

/// True when the members own every partition once between them, in shares within one of each
/// other.
fn split_evenly(addresses: &[&str]) -> bool {
    let shares: Vec<usize> = addresses.iter().map(|a| owned(a).len()).collect();
    let (low, high) = (PARTITIONS / addresses.len(), PARTITIONS.div_ceil(addresses.len()));
    shares.iter().sum::<usize>() == PARTITIONS && shares.iter().all(|s| (low..=high).contains(s))
}

/// Starts a member on `url` that must be refused: its exit code (bounded wait) and its log.
fn refused_member(url: &str) -> (i32, String) {
    let mut member =
        Tenure::start("refused", &["member", "--group", "g", "--http", "127.0.0.1:0", "--id", "x", "--lock", url]);
    let code = member.exit_code(Duration::from_secs(20));
    (code, member.log())
}

/// The scenario every store must pass, with members started by `start` (`id`).
fn three_members_share_and_hand_over_on_freeze_leave_and_kill(start: &dyn Fn(&str) -> (Tenure, String)) {
    let (_a_process, a) = start("a");
    let (mut b_process, b) = start("b");
    let (c_process, c) = start("c");
    let all = [a.as_str(), b.as_str(), c.as_str()];
    wait_safely(&all, Duration::from_secs(30), || split_evenly(&all)).expect("the members never split the partitions");

    // /owns: every member maps a key to the same partition, and exactly one owns it.
    for i in 0..48 {
        let key = format!("default/pod-{i}");
        let answers: Vec<serde_json::Value> = all.iter().map(|m| owns(m, &key)).collect();
        assert!(answers.iter().all(|x| x["partition"] == answers[0]["partition"]), "{key}: {answers:?}");
        let owners = answers.iter().filter(|x| x["owns"].as_bool() == Some(true)).count();
        assert_eq!(owners, 1, "{key}: {answers:?}");
    }

    // A freeze past the lease (SIGSTOP: a stopped container, a long pause): the others take its
    // partitions over after the lease, under higher terms. From its very first answer after
    // SIGCONT, it claims none of them, neither owned nor draining (they are lost).
    assert!(!owned(&c).is_empty());
    c_process.signal(libc::SIGSTOP);
    let rest = [a.as_str(), b.as_str()];
    wait_safely(&rest, Duration::from_secs(20), || split_evenly(&rest))
        .expect("the frozen member's partitions never moved");
    let taken: BTreeMap<u32, u64> = rest
        .iter()
        .flat_map(|m| partitions(m).unwrap_or_default())
        .filter(|(_, (state, _))| state == "owned")
        .map(|(partition, (_, term))| (partition, term))
        .collect();
    c_process.signal(libc::SIGCONT);
    // Its answers from the first on, until it holds nothing under an old term any more (asked
    // before anything is released, as an application polling it would see them).
    let mut answers = 0;
    let settled = wait_until(Duration::from_secs(10), || {
        let view = partitions(&c)?;
        answers += 1;
        for (partition, (state, term)) in &view {
            let newer = taken.get(partition).is_some_and(|other| other > term);
            assert!(
                !(newer && (state == "owned" || state == "draining")),
                "answer {answers} after the thaw: partition {partition} {state} under term {term}, owned by another under term {}",
                taken[partition]
            );
        }
        view.iter().all(|(partition, (_, term))| taken.get(partition).is_none_or(|other| other < term)).then_some(())
    });
    settled.expect("the thawed member kept its old partitions");
    assert!(answers > 0);
    wait_safely(&all, Duration::from_secs(30), || split_evenly(&all)).expect("the thawed member never rejoined");

    // A graceful leave (SIGTERM; the application releases at once): the others own everything
    // well before a lease could have run out.
    let leaving = owned(&b);
    let start_leave = Instant::now();
    b_process.signal(libc::SIGTERM);
    let rest = [a.as_str(), c.as_str()];
    let took = wait_safely(&[&a, &b, &c], Duration::from_secs(20), || split_evenly(&rest))
        .expect("the leaver's partitions never moved");
    assert!(took < RENEW_DEADLINE, "a graceful leave took {took:?} (start {start_leave:?})");
    assert!(!leaving.is_empty());
    assert_eq!(b_process.exit_code(Duration::from_secs(10)), 0, "{}", b_process.log());

    // kill -9: the survivor owns everything, not before the killed member's renew deadline,
    // and within a lease and a bit.
    let killed = Instant::now();
    c_process.signal(libc::SIGKILL);
    let took = wait_safely(&[&a, &c], Duration::from_secs(20), || owned(&a).len() == PARTITIONS)
        .expect("the survivor never owned the killed member's partitions");
    assert!(took >= RENEW_DEADLINE, "taken over after {took:?}, before the killed member's deadline");
    assert!(took <= LEASE + Duration::from_secs(1), "taken over after {took:?}, more than a lease");
    assert!(killed.elapsed() >= took);

    // Through all of it the watch lost no change: the once-per-lease read never found one.
    let (code, metrics) = common::get(&a, "/metrics").expect("/metrics answers");
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains("tenure_group_missed_changes_total{group=\"g\"} 0\n"), "{metrics}");
}

#[test]
fn members_on_a_file_share_answer_owns_and_hand_over_on_freeze_leave_and_kill() {
    let dir = TempDir::new("member-file");
    let url = file_url(&dir.join("group"));
    three_members_share_and_hand_over_on_freeze_leave_and_kill(&|id| start_member(id, &url, &[]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_on_etcd_share_answer_owns_and_hand_over_on_freeze_leave_and_kill() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let url = format!("etcd://{}/cli-member", cluster.endpoint(0));
    tokio::task::block_in_place(|| {
        three_members_share_and_hand_over_on_freeze_leave_and_kill(&|id| start_member(id, &url, &[]))
    });
}

#[test]
fn members_on_zookeeper_share_answer_owns_and_hand_over_on_freeze_leave_and_kill() {
    let Some(server) = zookeeper::server() else { return };
    let url = format!("zk://127.0.0.1:{}{}", server.port, zookeeper::unique_path("cli-member"));
    three_members_share_and_hand_over_on_freeze_leave_and_kill(&|id| start_member(id, &url, &[]));
}

#[test]
fn members_on_kubernetes_share_answer_owns_and_hand_over_on_freeze_leave_and_kill() {
    let dir = TempDir::new("member-kube");
    let kubeconfig = dir.join("kubeconfig").display().to_string();
    let server = Tenure::start("apiserver", &["apiserver", "--listen", "127.0.0.1:0", "--kubeconfig", &kubeconfig]);
    wait_until(Duration::from_secs(10), || server.output().lines().next().map(str::to_owned))
        .unwrap_or_else(|| panic!("the API server printed no URL; log:\n{}", server.log()));
    let url = "kube://default/leases/cli-member";
    three_members_share_and_hand_over_on_freeze_leave_and_kill(&|id| {
        start_member(id, url, &[("KUBECONFIG", &kubeconfig)])
    });
}

/// A `tenure member` takes the same secured etcd URL as `tenure elect`: TLS only, client
/// certificates, a user whose password is in a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_reach_an_etcd_with_tls_client_certificates_and_a_user() {
    let Some(cluster) = EtcdCluster::start_tls(1, true).await else { return };
    cluster.enable_auth("tenure", "s3cret", "secure");
    let pki = &cluster.tls.as_ref().expect("a TLS cluster").pki;
    let password_file = pki.ca.with_file_name("member-pw");
    std::fs::write(&password_file, "s3cret\n").expect("write the password file");
    let url = format!(
        "etcd://tenure@{}/secure-member?cacert={}&cert={}&key={}&password-file={}",
        cluster.endpoint(0),
        pki.ca.display(),
        pki.client_cert.display(),
        pki.client_key.display(),
        password_file.display()
    );
    tokio::task::block_in_place(|| {
        let (a_process, a) = start_member("a", &url, &[]);
        let (_b_process, b) = start_member("b", &url, &[]);
        let both = [a.as_str(), b.as_str()];
        wait_safely(&both, Duration::from_secs(30), || split_evenly(&both))
            .unwrap_or_else(|| panic!("the members never split the partitions; log:\n{}", a_process.log()));
        assert!(!a_process.log().contains("s3cret"), "the password shows in the log");
    });
    // A wrong password is refused with the reason, not ignored.
    std::fs::write(&password_file, "guess\n").expect("write the password file");
    let (code, stderr) = refused_member(&url);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("refused to authenticate user \"tenure\""), "{stderr}");
    assert!(!stderr.contains("guess"), "the password shows: {stderr}");
}

/// A `tenure member` takes the same ZooKeeper URL with a digest user as `tenure elect`; a wrong
/// password is refused with the reason.
#[test]
fn members_reach_a_zookeeper_with_a_digest_user_and_a_wrong_password_is_refused() {
    let Some(server) = zookeeper::server() else { return };
    let dir = TempDir::new("member-zk-digest");
    let path = zookeeper::unique_path("cli-member-digest");
    let url = |password: &str| {
        let file = dir.join(&format!("pw-{password}"));
        std::fs::write(&file, format!("{password}\n")).expect("write the password file");
        format!("zk://tenure@{}{path}?password-file={}", server.servers, file.display())
    };
    let right = url("s3cret");
    let (a_process, a) = start_member("a", &right, &[]);
    let (_b_process, b) = start_member("b", &right, &[]);
    let both = [a.as_str(), b.as_str()];
    wait_safely(&both, Duration::from_secs(30), || split_evenly(&both))
        .unwrap_or_else(|| panic!("the members never split the partitions; log:\n{}", a_process.log()));
    let wrong = url("guess");
    let (code, stderr) = refused_member(&wrong);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("wrong password"), "{stderr}");
    assert!(!stderr.contains("guess"), "the password shows: {stderr}");
}

/// `tenure member` on a ZooKeeper that serves TLS, with the CA named in the URL as for `tenure elect`.
#[cfg(feature = "zk-tls")]
#[test]
fn members_reach_a_zookeeper_over_tls() {
    let Some((server, pki)) = zookeeper::tls_server(false) else { return };
    let url =
        format!("zk://{}{}?cacert={}", server.servers, zookeeper::unique_path("cli-member-tls"), pki.ca.display());
    let (a_process, a) = start_member("a", &url, &[]);
    let (_b_process, b) = start_member("b", &url, &[]);
    let both = [a.as_str(), b.as_str()];
    wait_safely(&both, Duration::from_secs(30), || split_evenly(&both))
        .unwrap_or_else(|| panic!("the members never split the partitions; log:\n{}", a_process.log()));
}
