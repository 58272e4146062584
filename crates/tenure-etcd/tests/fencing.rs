//! Self-fencing against a real etcd whose connection hangs at the worst moment (a loopback proxy
//! between the candidate and the server stalls and closes connections): the tenure ends at its
//! deadline even while store calls hang (S1), and a tenure that ended never comes back: the same
//! candidate leads again only with a greater term (S2).

use std::time::Duration;

use tenure::Term;
use tenure_etcd::EtcdElection;
use tenure_testkit::etcd::EtcdCluster;
use tenure_testkit::stall_proxy::{ended_despite_the_stall, leads_again_only_under_a_greater_term, next_renewal};
use tenure_testkit::stall_proxy::{next_leader_waits_for_the_work, StallProxy};
use tokio::time::{timeout, Instant};

/// TTL 3 s: deadline 2 s after the start of the last keep-alive, call timeout 1 s, keep-alive
/// every 750 ms.
const TTL: Duration = Duration::from_secs(3);
/// How late after its deadline the tenure may be seen to end: timer resolution and scheduling
/// on a loaded 2-core machine, far below the call timeout (1 s) that a late fence used to add.
const TOLERANCE: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_whose_store_hangs_during_a_reload_ends_its_tenure_at_the_deadline_and_never_revives_it() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let proxy = StallProxy::start(&cluster.endpoint(0)).await;
    let election = EtcdElection::connect(&[proxy.address().to_owned()], "stall").await.expect("connect");
    let elector = election.campaign("a", TTL).expect("campaign");
    let first = timeout(Duration::from_secs(10), elector.acquired()).await.expect("leads").expect("tenure");

    // Right after a keep-alive, cut every connection and let new ones hang: the watch fails at
    // once, and the reload it triggers (and the one after it) hangs across the deadline. The
    // network comes back just after the deadline, while the server still keeps the lease (until
    // TTL after the last keep-alive it received, a second after the deadline).
    next_renewal(&first).await;
    proxy.stall();
    proxy.close_all();
    let deadline = first.valid_until();
    let ended = ended_despite_the_stall(&proxy, &first, TOLERANCE).await;
    println!("the tenure ended {:?} after its deadline", ended.saturating_duration_since(deadline));
    assert!(ended <= deadline + TOLERANCE, "ended {:?} after the deadline", ended - deadline);
    assert!(!first.is_valid());
    assert!(elector.is_leader().is_none() || elector.is_leader() > Some(first.term()));

    // Leads again, only under a new term; the ended tenure stays ended.
    let second = leads_again_only_under_a_greater_term(&elector, &first, deadline).await;
    assert_ne!(second.term(), Term(0));
    drop((first, second));
    elector.shutdown().await.expect("shutdown");
}

/// `tenure run` on etcd after a store outage: the leader self-fences while its command is still
/// stopping (holding the tenure), the store comes back, and the lost session's lease must not be
/// revoked (which deletes the key and lets the next candidate lead at once) until that work is
/// over. Without the revoke the server keeps the lease until TTL after the last keep-alive, so
/// the next candidate could not lead before then anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_tenure_keeps_its_key_until_its_work_is_over() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let proxy = StallProxy::start(&cluster.endpoint(0)).await;
    let cut_off = EtcdElection::connect(&[proxy.address().to_owned()], "drain").await.expect("connect");
    let reachable = EtcdElection::connect(&cluster.endpoints(), "drain").await.expect("connect");
    let a = cut_off.campaign("a", TTL).expect("campaign");
    let first = timeout(Duration::from_secs(10), a.acquired()).await.expect("leads").expect("tenure");
    let b = reachable.campaign("b", TTL).expect("campaign");
    let mut b_view = b.subscribe();
    timeout(Duration::from_secs(10), b_view.wait_for(|l| l.leader.as_deref() == Some("a")))
        .await
        .expect("b sees a lead")
        .expect("b running");

    // a loses the store right after a keep-alive and gets it back just after its deadline, while
    // the work of its tenure still runs; the server keeps the lease until TTL - 2/3 TTL = 1 s after
    // the deadline. Once the work is over, the lease is revoked: b leads within a few round trips,
    // well before the server would have expired the lease on its own... or at that instant at the
    // latest.
    next_renewal(&first).await;
    proxy.stall();
    proxy.close_all();
    let (deadline, dropped, second) = next_leader_waits_for_the_work(&proxy, first, &b, Duration::from_secs(5)).await;
    let led = Instant::now();
    println!("b led {:?} after the work was over", led - dropped);
    assert!(led <= deadline + TTL / 3 + Duration::from_millis(500), "b led {:?} after a's deadline", led - deadline);
    drop(second);
    b.shutdown().await.expect("shutdown");
    a.shutdown().await.expect("shutdown");
}
