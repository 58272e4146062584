//! The etcd elector against real etcd servers.

use std::process::Stdio;
use std::time::Duration;

use tenure::{Elector, Leadership, Role};
use tenure_etcd::EtcdElection;
use tenure_testkit::clock::monotonic_ns;
use tenure_testkit::etcd::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

const TTL: Duration = Duration::from_secs(2);

/// Waits (bounded) until `elector`'s leadership satisfies `condition`.
async fn wait_for(
    elector: &Elector,
    bound: Duration,
    what: &str,
    condition: impl FnMut(&Leadership) -> bool,
) -> Leadership {
    let mut rx = elector.subscribe();
    let result = match timeout(bound, rx.wait_for(condition)).await {
        Ok(Ok(l)) => Some(l.clone()),
        _ => None,
    };
    result.unwrap_or_else(|| {
        panic!("{}: not within {bound:?}: {what}; last seen {:?}", elector.identity(), elector.leadership())
    })
}

/// Waits until one of `electors` leads and every one of them names it; returns its index.
async fn agreed_leader(electors: &[Elector], bound: Duration) -> usize {
    let deadline = Instant::now() + bound;
    let mut rxs: Vec<_> = electors.iter().map(|e| e.subscribe()).collect();
    loop {
        let snapshots: Vec<Leadership> = rxs.iter_mut().map(|rx| rx.borrow_and_update().clone()).collect();
        let leaders: Vec<usize> =
            snapshots.iter().enumerate().filter(|(_, l)| l.role == Role::Leader).map(|(i, _)| i).collect();
        assert!(leaders.len() <= 1, "two leaders at once: {snapshots:?}");
        if let [leader] = leaders[..] {
            let name = electors[leader].identity();
            if snapshots.iter().all(|l| l.leader.as_deref() == Some(name)) {
                return leader;
            }
        }
        let changes = futures::future::select_all(rxs.iter_mut().map(|rx| Box::pin(rx.changed())));
        if timeout(deadline.saturating_duration_since(Instant::now()), changes).await.is_err() {
            panic!("no agreed leader within {bound:?}: {snapshots:?}");
        }
    }
}

async fn campaign(election: &EtcdElection, names: &[&str]) -> Vec<Elector> {
    names.iter().map(|n| election.campaign(*n, TTL).expect("campaign")).collect()
}

async fn shutdown_all(electors: Vec<Elector>) {
    for elector in electors {
        elector.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn three_candidates_agree_on_exactly_one_leader() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "three").await.unwrap();
    let electors = campaign(&election, &["a", "b", "c"]).await;
    let leader = agreed_leader(&electors, Duration::from_secs(5)).await;
    let stored = election.leader().await.unwrap().expect("a leader key");
    assert_eq!(stored.identity, electors[leader].identity());
    assert_eq!(Some(stored.term), electors[leader].is_leader());
    assert!(stored.key.starts_with("three/"));
    assert_eq!(stored.key, format!("three/{:x}", stored.lease));
    shutdown_all(electors).await;
    assert_eq!(election.leader().await.unwrap(), None, "shutdown deletes the keys");
}

#[tokio::test]
async fn resign_hands_over_within_a_round_trip_and_terms_grow() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "handover").await.unwrap();
    let electors = campaign(&election, &["a", "b", "c"]).await;
    let mut last_term = None;
    let mut leader = agreed_leader(&electors, Duration::from_secs(5)).await;
    for _ in 0..3 {
        let term = electors[leader].is_leader().expect("leads");
        assert!(Some(term) > last_term, "terms grow");
        last_term = Some(term);
        let start = Instant::now();
        electors[leader].resign().await.unwrap();
        let next = agreed_leader(&electors, Duration::from_secs(2)).await;
        let took = start.elapsed();
        println!("handover after resign: {took:?}");
        assert_ne!(next, leader, "the resigned candidate queues behind the others");
        assert!(took < Duration::from_millis(500), "handover took {took:?}");
        leader = next;
    }
    // Shutdown of the leader hands over as fast.
    let mut electors = electors;
    let old = electors.remove(leader);
    let start = Instant::now();
    old.shutdown().await.unwrap();
    agreed_leader(&electors, Duration::from_secs(2)).await;
    let took = start.elapsed();
    println!("handover after shutdown: {took:?}");
    assert!(took < Duration::from_millis(500), "handover took {took:?}");
    shutdown_all(electors).await;
}

#[tokio::test]
async fn dropping_the_handle_is_a_shutdown() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "dropped").await.unwrap();
    let mut electors = campaign(&election, &["a", "b"]).await;
    let leader = agreed_leader(&electors, Duration::from_secs(5)).await;
    let start = Instant::now();
    drop(electors.remove(leader));
    agreed_leader(&electors, Duration::from_secs(1)).await;
    println!("handover after dropping the handle: {:?}", start.elapsed());
    shutdown_all(electors).await;
}

#[tokio::test]
async fn guarded_txn_applies_only_while_the_term_holds() {
    use tenure_etcd::proto::etcdserverpb::{request_op, PutRequest, RequestOp};
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "guarded").await.unwrap();
    let elector = election.campaign("a", TTL).unwrap();
    let tenure = elector.acquired().await.unwrap();
    let put = |v: &str| RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: b"protected".to_vec(),
            value: v.as_bytes().to_vec(),
            ..Default::default()
        })),
    };
    assert!(election.guarded_txn(tenure.term(), vec![put("1")]).await.unwrap().succeeded);
    let term = tenure.term();
    drop(tenure);
    elector.resign().await.unwrap();
    wait_for(&elector, Duration::from_secs(5), "leads again with a new term", |l| {
        l.role == Role::Leader && l.term > Some(term)
    })
    .await;
    assert!(!election.guarded_txn(term, vec![put("2")]).await.unwrap().succeeded, "an old term is fenced off");
    elector.shutdown().await.unwrap();
}

#[tokio::test]
async fn own_key_deleted_externally_stops_leading_at_once_and_recampaigns() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "deleted").await.unwrap();
    let electors = campaign(&election, &["a", "b"]).await;
    let leader = agreed_leader(&electors, Duration::from_secs(5)).await;
    let tenure = electors[leader].tenure().expect("tenure");
    let key = election.leader().await.unwrap().expect("leader").key;
    let status = tokio::process::Command::new("etcdctl")
        .args(["--endpoints", &cluster.endpoint(0), "del", &key])
        .stdout(Stdio::null())
        .status()
        .await
        .expect("run etcdctl");
    assert!(status.success());
    timeout(Duration::from_millis(500), tenure.ended()).await.expect("the tenure ends at once");
    assert!(tenure.check().is_err());
    drop(tenure);
    let next = agreed_leader(&electors, Duration::from_secs(2)).await;
    assert_ne!(next, leader);
    // The old leader is a candidate again, queued with a new key.
    wait_for(&electors[leader], Duration::from_secs(2), "follows", |l| l.role == Role::Follower).await;
    shutdown_all(electors).await;
}

#[test]
fn rejects_ttl_below_etcds_minimum() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let Some(cluster) = EtcdCluster::start(1).await else { return };
        let election = EtcdElection::connect(&cluster.endpoints(), "ttl").await.unwrap();
        let error = election.campaign("a", Duration::from_secs(1)).err().expect("rejected");
        assert!(error.to_string().contains("minimum"), "{error}");
    });
}

// ---------------------------------------------------------------------------------------------
// A candidate in a child process (this test binary, re-invoked), to kill or pause it for real.

/// The child's side: campaigns and reports on stdout, until killed.
#[tokio::test]
async fn child_candidate() {
    let Ok(endpoints) = std::env::var("TENURE_ETCD_CHILD_ENDPOINTS") else { return };
    let election_name = std::env::var("TENURE_ETCD_CHILD_ELECTION").unwrap();
    let identity = std::env::var("TENURE_ETCD_CHILD_IDENTITY").unwrap();
    let endpoints: Vec<String> = endpoints.split(',').map(String::from).collect();
    let election = EtcdElection::connect(&endpoints, &election_name).await.unwrap();
    let elector = election.campaign(identity, TTL).unwrap();
    let mut last = None;
    loop {
        // The self-fencing deadline as a CLOCK_MONOTONIC reading, whenever it moves.
        let deadline = elector
            .valid_until()
            .map(|until| monotonic_ns() + until.saturating_duration_since(Instant::now()).as_nanos());
        if deadline != last {
            match deadline {
                Some(ns) => println!("CHILD deadline {ns}"),
                None => println!("CHILD follower"),
            }
            last = deadline;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct ChildCandidate {
    child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    last_deadline: Option<u128>,
}

impl ChildCandidate {
    fn spawn(endpoints: &[String], election: &str, identity: &str) -> ChildCandidate {
        let exe = std::env::current_exe().unwrap();
        let mut child = tokio::process::Command::new(exe)
            .args(["--exact", "child_candidate", "--nocapture", "--test-threads", "1"])
            .env("TENURE_ETCD_CHILD_ENDPOINTS", endpoints.join(","))
            .env("TENURE_ETCD_CHILD_ELECTION", election)
            .env("TENURE_ETCD_CHILD_IDENTITY", identity)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if line.starts_with("CHILD") && tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildCandidate { child, lines, last_deadline: None }
    }

    /// Waits until the child reports that it leads.
    async fn wait_leading(&mut self, bound: Duration) {
        timeout(bound, async {
            while let Some(line) = self.lines.recv().await {
                if let Some(ns) = line.strip_prefix("CHILD deadline ") {
                    self.last_deadline = Some(ns.parse().unwrap());
                    return;
                }
            }
            panic!("child exited");
        })
        .await
        .expect("the child leads");
    }

    /// Reads every line printed so far and returns the last self-fencing deadline.
    fn drain_deadline(&mut self) -> Option<u128> {
        while let Ok(line) = self.lines.try_recv() {
            if let Some(ns) = line.strip_prefix("CHILD deadline ") {
                self.last_deadline = Some(ns.parse().unwrap());
            }
        }
        self.last_deadline
    }

    /// Waits until the kernel reports the child as stopped (state `T` in /proc/PID/stat).
    async fn wait_stopped(&self) {
        let path = format!("/proc/{}/stat", self.child.id().unwrap());
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let stat = std::fs::read_to_string(&path).unwrap();
            let state = stat.rsplit(')').next().unwrap_or("").split_whitespace().next().unwrap_or("");
            if state == "T" {
                return;
            }
            assert!(Instant::now() < deadline, "the child did not stop: {stat}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }
}

#[tokio::test]
async fn killed_leader_is_replaced_within_the_ttl() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "crash").await.unwrap();
    let mut child = ChildCandidate::spawn(&cluster.endpoints(), "crash", "child");
    child.wait_leading(Duration::from_secs(10)).await;
    let follower = election.campaign("follower", TTL).unwrap();
    wait_for(&follower, Duration::from_secs(5), "sees the child lead", |l| l.leader.as_deref() == Some("child")).await;
    let start = Instant::now();
    child.signal(nix::sys::signal::Signal::SIGKILL);
    follower.acquired().await.unwrap();
    let took = start.elapsed();
    println!("crash failover: {took:?} ({:.2} x TTL)", took.as_secs_f64() / TTL.as_secs_f64());
    assert!(took < TTL + Duration::from_secs(1), "failover took {took:?}");
    follower.shutdown().await.unwrap();
}

#[tokio::test]
async fn paused_leader_stops_leading_before_another_is_elected() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "paused").await.unwrap();
    let mut child = ChildCandidate::spawn(&cluster.endpoints(), "paused", "child");
    child.wait_leading(Duration::from_secs(10)).await;
    let follower = election.campaign("follower", TTL).unwrap();
    wait_for(&follower, Duration::from_secs(5), "sees the child lead", |l| l.leader.as_deref() == Some("child")).await;
    child.signal(nix::sys::signal::Signal::SIGSTOP);
    child.wait_stopped().await;
    // From now on the child starts no keep-alive: its deadline is at most this + TTL - margin.
    let stopped_at = monotonic_ns();
    follower.acquired().await.unwrap();
    let elected_at = monotonic_ns();
    // The child is stopped: everything it printed is in the pipe.
    let fenced_at = child.drain_deadline().expect("the child reported a deadline");
    let latest_possible = stopped_at + (TTL - tenure_etcd::self_fencing_margin(TTL)).as_nanos();
    println!(
        "paused leader: last reported deadline {} ms, latest possible deadline {} ms before the next leader was elected",
        elected_at.saturating_sub(fenced_at) / 1_000_000,
        elected_at.saturating_sub(latest_possible) / 1_000_000
    );
    assert!(fenced_at < elected_at, "the paused leader's deadline ({fenced_at}) is after the election ({elected_at})");
    assert!(latest_possible < elected_at, "the paused leader may have led until {latest_possible}, after {elected_at}");
    child.signal(nix::sys::signal::Signal::SIGKILL);
    follower.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Interoperability with etcd's own election client.

/// Runs `etcdctl` with `args` and returns a receiver of its stdout lines.
fn etcdctl(endpoint: &str, args: &[&str]) -> (tokio::process::Child, mpsc::UnboundedReceiver<String>) {
    let mut child = tokio::process::Command::new("etcdctl")
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run etcdctl");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

async fn wait_line(lines: &mut mpsc::UnboundedReceiver<String>, wanted: &str, bound: Duration) {
    let found = timeout(bound, async {
        while let Some(line) = lines.recv().await {
            if line == wanted {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "etcdctl did not print {wanted:?}");
}

#[tokio::test]
async fn tenure_and_etcdctl_elect_agree_on_one_leader() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let endpoint = cluster.endpoint(0);
    let election = EtcdElection::connect(&cluster.endpoints(), "interop").await.unwrap();

    // etcdctl campaigns first and wins: Tenure candidates follow it and report its proposal.
    let (etcdctl_candidate, mut elected) = etcdctl(&endpoint, &["elect", "interop", "from-etcdctl"]);
    wait_line(&mut elected, "from-etcdctl", Duration::from_secs(10)).await;
    let electors = campaign(&election, &["a", "b"]).await;
    for elector in &electors {
        wait_for(elector, Duration::from_secs(5), "follows etcdctl", |l| {
            l.leader.as_deref() == Some("from-etcdctl") && l.role == Role::Follower
        })
        .await;
    }
    assert_eq!(election.leader().await.unwrap().unwrap().identity, "from-etcdctl");

    // etcdctl gives up (SIGINT: it revokes its session): a Tenure candidate takes over.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(etcdctl_candidate.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let leader = agreed_leader(&electors, Duration::from_secs(5)).await;

    // etcd's observer sees the Tenure leader's identity.
    let (_observer, mut observed) = etcdctl(&endpoint, &["elect", "-l", "interop"]);
    wait_line(&mut observed, electors[leader].identity(), Duration::from_secs(10)).await;

    // An etcdctl candidate arriving now queues behind the Tenure candidates and wins only after
    // both leave.
    let (_late, mut late_elected) = etcdctl(&endpoint, &["elect", "interop", "late-etcdctl"]);
    wait_for(&electors[leader], Duration::from_secs(1), "still leads", |l| l.role == Role::Leader).await;
    shutdown_all(electors).await;
    wait_line(&mut late_elected, "late-etcdctl", Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------------------------
// A three-member cluster: members and the raft leader killed, the whole cluster restarted.

/// The index of the member that is the raft leader.
async fn raft_leader(cluster: &EtcdCluster) -> usize {
    let output = tokio::process::Command::new("etcdctl")
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(["endpoint", "status", "-w", "json"])
        .output()
        .await
        .expect("etcdctl endpoint status");
    let statuses: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json status");
    let statuses = statuses.as_array().expect("a list");
    for status in statuses {
        let member = &status["Status"]["header"]["member_id"];
        if member == &status["Status"]["leader"] {
            let endpoint = status["Endpoint"].as_str().unwrap_or_default();
            return cluster.endpoints().iter().position(|e| endpoint.ends_with(e.as_str())).expect("known endpoint");
        }
    }
    panic!("no raft leader in {statuses:?}");
}

/// Waits until the candidates agree on a leader that renewed on a keep-alive started after
/// `since` (its self-fencing deadline moved past `since + TTL - margin`): proof that the leader
/// (the same one, or a new one if the session was lost) works through the surviving members.
async fn renewed_leader_after(electors: &[Elector], since: Instant, bound: Duration) -> usize {
    let deadline = Instant::now() + bound;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let leader = agreed_leader(electors, remaining).await;
        let ttl = electors[leader].timing().lease_duration;
        let wanted = since + ttl - tenure_etcd::self_fencing_margin(ttl);
        if electors[leader].valid_until().is_some_and(|until| until > wanted) {
            return leader;
        }
        assert!(Instant::now() < deadline, "no leader renewed within {bound:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Resigns the leader and checks that every candidate sees the next one (watches work).
async fn handover_works(electors: &[Elector], leader: usize) -> usize {
    electors[leader].resign().await.unwrap();
    let next = agreed_leader(electors, Duration::from_secs(3)).await;
    assert_ne!(next, leader);
    next
}

#[tokio::test]
async fn three_member_cluster_member_loss_raft_leader_loss_and_full_restart() {
    let Some(mut cluster) = EtcdCluster::start(3).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "cluster").await.unwrap();
    // A TTL well above etcd's election timeout (1 s, randomized up to 2 s), so that a raft
    // election need not cost the session.
    const TTL: Duration = Duration::from_secs(4);
    let electors: Vec<Elector> = ["a", "b", "c"].iter().map(|n| election.campaign(*n, TTL).unwrap()).collect();
    let first = agreed_leader(&electors, Duration::from_secs(5)).await;
    let first_term = electors[first].is_leader();

    // The member every candidate talks to (the first endpoint) dies: they fail over.
    let start = Instant::now();
    cluster.kill(0);
    let leader = renewed_leader_after(&electors, start, TTL * 3).await;
    println!(
        "member 0 killed: leader {} -> {}, renewed through another member after {:?}, same tenure: {}",
        electors[first].identity(),
        electors[leader].identity(),
        start.elapsed(),
        electors[leader].is_leader() == first_term
    );
    handover_works(&electors, leader).await;
    cluster.restart(0);
    assert!(cluster.wait_serving(Duration::from_secs(20)).await, "member 0 rejoins");

    // The raft leader dies.
    let raft = raft_leader(&cluster).await;
    let leader = agreed_leader(&electors, TTL).await;
    let before = electors[leader].is_leader();
    let start = Instant::now();
    cluster.kill(raft);
    let after = renewed_leader_after(&electors, start, TTL * 3).await;
    println!(
        "raft leader m{raft} killed: leader {} -> {}, renewed after {:?}, same tenure: {}",
        electors[leader].identity(),
        electors[after].identity(),
        start.elapsed(),
        electors[after].is_leader() == before
    );
    handover_works(&electors, after).await;
    cluster.restart(raft);
    assert!(cluster.wait_serving(Duration::from_secs(20)).await, "the old raft leader rejoins");

    // The whole cluster goes down for longer than the leader can hold on: it fences itself.
    let leader = agreed_leader(&electors, TTL * 2).await;
    let tenure = electors[leader].tenure().expect("leads");
    let start = Instant::now();
    for i in 0..3 {
        cluster.kill(i);
    }
    timeout(TTL, tenure.ended()).await.expect("the leader fences itself while the cluster is down");
    println!("cluster down: leader fenced after {:?}", start.elapsed());
    drop(tenure);
    for i in 0..3 {
        cluster.restart(i);
    }
    assert!(cluster.wait_serving(Duration::from_secs(20)).await, "the cluster comes back");
    let restarted = Instant::now();
    let back = agreed_leader(&electors, TTL * 5).await;
    println!("whole cluster restarted: leader {} after {:?}", electors[back].identity(), restarted.elapsed());
    let stored = election.leader().await.unwrap().expect("a leader key");
    assert_eq!(stored.identity, electors[back].identity());
    handover_works(&electors, back).await;
    shutdown_all(electors).await;
}

#[tokio::test]
async fn followers_log_each_leader_they_observe_like_the_record_lock_elector() {
    let lines = tenure_testkit::log_capture::capture();
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "observed").await.unwrap();
    let (a, b) = (election.campaign("a", TTL).unwrap(), || election.campaign("b", TTL).unwrap());
    tenure_testkit::log_capture::assert_each_observed_leader_is_logged(&lines, a, b).await;
}

#[tokio::test]
async fn keep_alives_count_as_renews_and_an_unreachable_cluster_as_lock_errors_in_the_stats() {
    let Some(mut cluster) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&cluster.endpoints(), "stats").await.unwrap();
    let electors = campaign(&election, &["a"]).await;
    wait_for(&electors[0], Duration::from_secs(5), "leads", |l| l.role == Role::Leader).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while electors[0].stats().renews < 2 {
        assert!(Instant::now() < deadline, "no renews counted: {:?}", electors[0].stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = electors[0].stats();
    assert!(stats.last_renew_latency.is_some() && stats.last_renew_started.is_some(), "{stats:?}");

    cluster.kill(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = electors[0].stats();
        if stats.lock_unreachable_since.is_some() && stats.failed_renews >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no failed keep-alive counted: {stats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
