//! A loopback TCP proxy that a test puts between a client and a real server to hang the store
//! at the worst moment: it can stop forwarding (connections stay open, bytes wait in the proxy
//! and the kernel buffers, new connections are accepted but get no answer), close every open
//! connection, and resume forwarding (held bytes then flow on, as after a network stall).
//!
//! Also the steps of the fencing tests that stall a leader's store, which the etcd and ZooKeeper
//! tests share.

use std::time::Duration;

use tenure::{Elector, Role, Tenure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    forwarding: bool,
    /// Bumped by [`StallProxy::close_all`]: connections opened before the bump end.
    generation: u64,
}

/// The proxy; dropping it stops accepting (open connections end when either side closes).
pub struct StallProxy {
    address: String,
    state: watch::Sender<State>,
    acceptor: JoinHandle<()>,
}

impl StallProxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `upstream`.
    pub async fn start(upstream: &str) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let address = listener.local_addr().expect("proxy address").to_string();
        let (state, _) = watch::channel(State { forwarding: true, generation: 0 });
        let upstream = upstream.to_owned();
        let states = state.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let generation = states.borrow().generation;
                let Ok(server) = TcpStream::connect(&upstream).await else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, states.subscribe(), generation));
                tokio::spawn(pipe(server_read, client_write, states.subscribe(), generation));
            }
        });
        StallProxy { address, state, acceptor }
    }

    /// `127.0.0.1:<port>`, to give to the client instead of the server's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Stops forwarding in both directions on every connection, open or new.
    pub fn stall(&self) {
        self.state.send_modify(|s| s.forwarding = false);
    }

    /// Forwards again; bytes held during the stall are delivered.
    pub fn resume(&self) {
        self.state.send_modify(|s| s.forwarding = true);
    }

    /// Closes every open connection (the client sees them end); later ones are served as usual.
    pub fn close_all(&self) {
        self.state.send_modify(|s| s.generation += 1);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.close_all();
    }
}

/// Copies `from` to `to` while the proxy forwards; ends when either side closes or the
/// connection's generation is closed.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut state: watch::Receiver<State>, generation: u64) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        // Read only while forwarding, so that a stall also holds bytes back in the kernel.
        let Ok(current) = state.wait_for(|s| s.forwarding || s.generation != generation).await.map(|s| *s) else {
            return;
        };
        if current.generation != generation {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = state.changed() => continue,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A stall that began while this read was out holds the bytes until it ends.
        let Ok(current) = state.wait_for(|s| s.forwarding || s.generation != generation).await.map(|s| *s) else {
            return;
        };
        if current.generation != generation || to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits until `tenure`'s deadline moves: the store has just answered a renewal (an etcd
/// keep-alive, a ZooKeeper heartbeat).
pub async fn next_renewal(tenure: &Tenure) {
    let before = tenure.valid_until();
    let bound = Instant::now() + Duration::from_secs(5);
    while tenure.valid_until() == before {
        assert!(Instant::now() < bound, "no renewal within 5 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// With `proxy` stalled, waits for `tenure` to end while the store comes back 150 ms after the
/// tenure's deadline (it still keeps the lease or session then: the late answers must not revive
/// the tenure). Returns when the tenure ended; fails unless that was by the deadline + `tolerance`.
pub async fn ended_despite_the_stall(proxy: &StallProxy, tenure: &Tenure, tolerance: Duration) -> Instant {
    let deadline = tenure.valid_until();
    let stall_ends = async {
        sleep_until(deadline + Duration::from_millis(150)).await;
        proxy.resume();
    };
    let (ended, ()) = tokio::join!(
        async {
            let bound = deadline.saturating_duration_since(Instant::now()) + tolerance;
            timeout(bound, tenure.ended()).await.map(|()| Instant::now())
        },
        stall_ends
    );
    ended.expect("the tenure did not end by its deadline + the tolerance")
}

/// Waits until `elector` leads again, under a term greater than the ended `first`'s, and checks
/// that `first` stays ended with the deadline it had. Returns the new tenure.
pub async fn leads_again_only_under_a_greater_term(elector: &Elector, first: &Tenure, deadline: Instant) -> Tenure {
    let mut leadership = elector.subscribe();
    let again = timeout(
        Duration::from_secs(15),
        leadership.wait_for(|l| l.role == Role::Leader && l.term.is_some_and(|t| t > first.term())),
    )
    .await
    .expect("leads again with a greater term")
    .expect("elector running")
    .clone();
    let second = elector.acquired().await.expect("tenure");
    assert!(second.term() > first.term(), "term {} after term {}", second.term(), first.term());
    assert_eq!(again.term, Some(second.term()));
    assert!(!first.is_valid(), "the ended tenure came back");
    assert_eq!(first.valid_until(), deadline, "the ended tenure's deadline moved");
    second
}

/// `tenure run` after a stall of the leader's store: with `proxy` stalled, the store comes back
/// 150 ms after the deadline of `first` (the leader's tenure), which ends; the work of that tenure
/// (`first`, held like `tenure run` holds it until its command exits) takes 600 ms more, and `b`
/// must not lead before it is over (the lease or session outlives the deadline by 1 s). Returns
/// the deadline, when `first` was dropped, and b's tenure (within `limit` after that).
pub async fn next_leader_waits_for_the_work(
    proxy: &StallProxy,
    first: Tenure,
    b: &Elector,
    limit: Duration,
) -> (Instant, Instant, Tenure) {
    let deadline = first.valid_until();
    sleep_until(deadline + Duration::from_millis(150)).await;
    proxy.resume();
    timeout(Duration::from_secs(1), first.ended()).await.expect("the tenure ended by its deadline");
    let work_over = deadline + Duration::from_millis(600);
    let early = timeout(work_over.saturating_duration_since(Instant::now()), b.acquired()).await;
    assert!(early.is_err(), "b led while the ended tenure's work still ran");
    drop(first);
    let dropped = Instant::now();
    let second = timeout(limit, b.acquired()).await.expect("b leads").expect("tenure");
    (deadline, dropped, second)
}
