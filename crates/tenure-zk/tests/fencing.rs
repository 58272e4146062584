//! Self-fencing against a real ZooKeeper whose connection hangs at the worst moment (a loopback
//! proxy between the candidate and the server stalls): the tenure ends at its deadline even while
//! a heartbeat hangs (S1), and a tenure that ended never comes back: the same candidate leads
//! again only with a new node and so a greater term (S2). Also: the timing reported is the
//! session timeout the server grants, not the one asked for.

mod common;

use std::time::Duration;

use common::*;
use tenure_testkit::stall_proxy::{ended_despite_the_stall, leads_again_only_under_a_greater_term, next_renewal};
use tenure_testkit::stall_proxy::{next_leader_waits_for_the_work, StallProxy};
use tenure_zk::ZkElection;
use tokio::time::{timeout, Instant};

/// How late after its deadline the tenure may be seen to end: timer resolution and scheduling
/// on a loaded 2-core machine, far below the heartbeat's call timeout that a late fence added.
const TOLERANCE: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_whose_server_stops_answering_ends_its_tenure_at_the_deadline_and_never_revives_it() {
    let Some(server) = server() else { return };
    let proxy = StallProxy::start(&server.servers).await;
    let path = unique_path("stall");
    // Deadline 2/3 of the timeout after a heartbeat's start; heartbeats every third; the server
    // keeps the session a third longer than the deadline.
    let session_timeout = Duration::from_secs(3);
    let election = ZkElection::connect(proxy.address(), &path, session_timeout).await.expect("connect");
    let elector = election.campaign("a").expect("campaign");
    let first = timeout(Duration::from_secs(10), elector.acquired()).await.expect("leads").expect("tenure");

    // Right after a heartbeat, stop answering: the next heartbeat hangs across the deadline. The
    // server is heard again just after the deadline, before it expires the session.
    next_renewal(&first).await;
    proxy.stall();
    let deadline = first.valid_until();
    let ended = ended_despite_the_stall(&proxy, &first, TOLERANCE).await;
    if ended >= deadline {
        println!("the tenure ended {:?} after its deadline", ended - deadline);
    } else {
        println!("the tenure ended {:?} before its deadline (the connection was seen lost)", deadline - ended);
    }
    assert!(!first.is_valid());

    let second = leads_again_only_under_a_greater_term(&elector, &first, deadline).await;
    drop((first, second));
    elector.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_timeout_capped_by_the_server_is_what_the_elector_reports_and_fences_by() {
    let Some(server) = server() else { return };
    let path = unique_path("capped");
    // The test server's maxSessionTimeout is 10 s.
    let asked = Duration::from_secs(3600);
    let election = ZkElection::connect(&server.servers, &path, asked).await.expect("connect");
    assert_eq!(election.session_timeout(), asked);
    assert_eq!(election.negotiated_session_timeout(), Duration::from_secs(10));

    let elector = election.campaign("capped").expect("campaign");
    let timing = *elector.timing();
    assert_eq!(timing.lease_duration, Duration::from_secs(10));
    assert_eq!(timing.renew_deadline, Duration::from_secs(10) * 2 / 3);
    let tenure = timeout(Duration::from_secs(10), elector.acquired()).await.expect("leads").expect("tenure");
    let left = tenure.valid_until().saturating_duration_since(Instant::now());
    assert!(left <= timing.renew_deadline, "fences {left:?} ahead, beyond the granted session's deadline");
    assert!(left > Duration::from_secs(5), "fences by the granted timeout, not a shorter one: {left:?}");
    drop(tenure);
    elector.shutdown().await.expect("shutdown");
}

/// `tenure run` on ZooKeeper after a stall: the leader self-fences while its command is still
/// stopping (holding the tenure), the server is heard again before the session expires, and the
/// ended tenure's node must not be deleted (which lets the next candidate lead at once) until that
/// work is over. Kept, the node goes no sooner than the server expires the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_tenure_keeps_its_node_until_its_work_is_over() {
    let Some(server) = server() else { return };
    let proxy = StallProxy::start(&server.servers).await;
    let path = unique_path("drain");
    let session_timeout = Duration::from_secs(3);
    let cut_off = ZkElection::connect(proxy.address(), &path, session_timeout).await.expect("connect");
    let reachable = ZkElection::connect(&server.servers, &path, session_timeout).await.expect("connect");
    let a = cut_off.campaign("a").expect("campaign");
    let first = timeout(Duration::from_secs(10), a.acquired()).await.expect("leads").expect("tenure");
    let b = reachable.campaign("b").expect("campaign");
    let mut b_view = b.subscribe();
    timeout(Duration::from_secs(10), b_view.wait_for(|l| l.leader.as_deref() == Some("a")))
        .await
        .expect("b sees a lead")
        .expect("b running");

    // a stops hearing the server right after a heartbeat and hears it again just after its
    // deadline, while the work of its tenure still runs (the server keeps the session 1 s after
    // the deadline).
    next_renewal(&first).await;
    proxy.stall();
    let (_, dropped, second) = next_leader_waits_for_the_work(&proxy, first, &b, Duration::from_secs(10)).await;
    println!("b led {:?} after the work was over", dropped.elapsed());
    drop(second);
    b.shutdown().await.expect("shutdown");
    let _ = a.shutdown().await;
}
