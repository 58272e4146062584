//! The driver of one ZooKeeper candidate: keeps a session, an ephemeral sequential node in the
//! election, the watches that wake it, and publishes what it sees through the core's
//! [`Publisher`].

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tenure::{ElectorCommand, ElectorError, FailureLog, Leadership, Publisher, Role, Term};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, timeout, Instant};
use zookeeper_client as zk;

use crate::{naming, term_of, with_timeout, ZkError};

/// What the driver needs to know about its election.
pub(crate) struct Config {
    pub servers: String,
    /// The server list to connect to: `servers` without credentials.
    pub address: String,
    pub path: String,
    pub session_timeout: Duration,
    pub drain_timeout: Duration,
    pub identity: String,
    pub access: crate::ZkOptions,
}

type Reply = Option<oneshot::Sender<Result<(), ElectorError>>>;

type WatchFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Why the campaign in one session ended.
enum SessionEnd {
    /// The session expired or was closed: campaign again in a new session with a new node.
    Lost,
    /// Shutdown was asked for (with somebody to answer, unless the handles were dropped).
    Stop(Reply),
}

/// This candidate's node in the election.
struct OwnNode {
    name: String,
    czxid: i64,
}

/// One look at the election: where this candidate stands and what wakes it next.
struct View {
    is_leader: bool,
    leader_identity: String,
    leader_term: Term,
    /// When the requests that produced this view started: the server was alive after that.
    started: Instant,
    /// Completes when the own node, the predecessor or the leader's node changes.
    watches: WatchFuture,
}

/// The result of one observation.
enum Observed {
    View(View),
    /// The children changed under our feet (a node vanished between two reads, or we just
    /// created ours): look again at once.
    Again,
}

struct Driver {
    config: Config,
    publisher: Publisher,
    commands: mpsc::Receiver<ElectorCommand>,
    /// The term of the tenure we hold, if we lead.
    leading: Option<Term>,
    /// The self-fencing deadline of that tenure.
    valid_until: Instant,
    /// When the leader next proves to itself that the server still hears it.
    next_heartbeat: Instant,
    /// The session timeout the server granted to the current session.
    negotiated_timeout: Duration,
    /// The node of a tenure that ended without a release (fenced, disconnected): it must go
    /// before this candidate leads again, or the next tenure would have the same term (S2).
    spent: Option<String>,
    /// Until when the spent node is deleted only once the ended tenure's guards are dropped:
    /// deleting it lets the next candidate lead at once, while the tenure's work (a `tenure run`
    /// command in its grace period) may still run. Kept, the node goes no sooner than the server
    /// expires the session: a session timeout after the last answer, no sooner than this.
    spent_drain_until: Instant,
    /// The node of the current tenure.
    led_node: Option<String>,
    /// The leader (identity, term) last logged, so that each change is logged once.
    observed: Option<Option<(String, Term)>>,
    /// Connections that keep failing: one warning, a summary a minute, the recovery.
    failures: FailureLog,
}

/// Runs one candidate until shutdown (or until every handle is dropped).
pub(crate) async fn run(config: Config, publisher: Publisher, commands: mpsc::Receiver<ElectorCommand>) {
    let now = Instant::now();
    let negotiated_timeout = config.session_timeout;
    let mut driver = Driver {
        config,
        publisher,
        commands,
        leading: None,
        valid_until: now,
        next_heartbeat: now,
        negotiated_timeout,
        spent: None,
        spent_drain_until: now,
        led_node: None,
        observed: None,
        failures: FailureLog::new(),
    };
    tracing::debug!(identity = %driver.config.identity, path = %driver.config.path, "campaigning on ZooKeeper");
    let (reply, result) = driver.run_sessions().await;
    if let Some(reply) = reply {
        let _ = reply.send(result);
    }
}

impl Driver {
    /// How long after the start of a request the server answered the leader still leads: 2/3 of
    /// the session timeout the server granted (it may grant less than we asked for).
    fn fence_margin(&self) -> Duration {
        self.negotiated_timeout * 2 / 3
    }

    fn heartbeat_interval(&self) -> Duration {
        self.negotiated_timeout / 3
    }

    fn call_timeout(&self) -> Duration {
        self.negotiated_timeout / 2
    }

    /// The time limit of the next call: the call timeout, cut short at the self-fencing deadline
    /// while leading, so that no call the driver waits for outlasts the tenure (S1).
    fn call_limit(&self) -> Duration {
        match self.leading {
            Some(_) => self.call_timeout().min(self.valid_until.saturating_duration_since(Instant::now())),
            None => self.call_timeout(),
        }
    }

    /// Ends the tenure if its self-fencing deadline has passed.
    fn fence_if_due(&mut self) {
        if self.leading.is_some() && Instant::now() >= self.valid_until {
            self.stop_leading("self-fenced: no answer from ZooKeeper within 2/3 of the session timeout");
            self.publish_unknown();
        }
    }

    /// Deletes the node of a tenure that ended, so that this candidate queues again with a new
    /// node (and so a greater term), once the tenure's work is over (or could no longer keep the
    /// next leader out). `Err` when the session is lost or the call failed.
    async fn discard_spent(&mut self, client: &zk::Client, own: &mut Option<OwnNode>) -> Result<(), ZkError> {
        let Some(name) = self.spent.clone() else { return Ok(()) };
        let drained = tokio::time::timeout_at(self.spent_drain_until, self.publisher.wait_for_ended_tenures());
        if drained.await.is_err() {
            tracing::warn!(identity = %self.config.identity, "the ended tenure's guards were still held when its session could have expired; deleting its node");
        }
        match with_timeout(self.call_limit(), client.delete(&self.node_path(&name), None)).await {
            Ok(()) | Err(ZkError::Request(zk::Error::NoNode)) => {
                tracing::debug!(identity = %self.config.identity, node = %name, "deleted the node of an ended tenure");
                if own.as_ref().is_some_and(|node| node.name == name) {
                    *own = None;
                }
                self.spent = None;
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    fn node_path(&self, name: &str) -> String {
        format!("{}/{}", self.config.path, name)
    }

    /// Campaigns session after session; returns who to answer at shutdown, and the answer.
    async fn run_sessions(&mut self) -> (Reply, Result<(), ElectorError>) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let client = match self.connect(&mut backoff).await {
                Ok(client) => client,
                Err(reply) => return (reply, Ok(())),
            };
            self.negotiated_timeout = crate::granted_timeout(client.session_timeout(), self.config.session_timeout);
            tracing::debug!(
                identity = %self.config.identity,
                session = %client.session_id(),
                timeout = ?self.negotiated_timeout,
                "session established"
            );
            let mut own = None;
            match self.campaign(&client, &mut own).await {
                SessionEnd::Lost => {
                    self.stop_leading("session expired or closed");
                    self.publish_unknown();
                }
                SessionEnd::Stop(reply) => {
                    let result = self.shut_down(&client, own).await;
                    drop(client); // closes the session
                    return (reply, result);
                }
            }
        }
    }

    /// Opens a new session, retrying with backoff; `Err` when shutdown was asked for meanwhile.
    async fn connect(&mut self, backoff: &mut Duration) -> Result<zk::Client, Reply> {
        loop {
            let attempt = self.config.access.connector(self.config.session_timeout).connect(&self.config.address);
            let limit = self.config.session_timeout * 2;
            let result = tokio::select! {
                result = timeout(limit, attempt) => result,
                command = self.commands.recv() => match answer_idle(command) {
                    Some(reply) => return Err(reply),
                    None => continue,
                },
            };
            match result {
                Ok(Ok(client)) => {
                    *backoff = Duration::from_millis(50);
                    self.failures.reached(self.publisher.recorder(), &self.config.identity);
                    return Ok(client);
                }
                Ok(Err(err)) => {
                    let servers = tenure::redact_credentials(&self.config.servers);
                    let what = format!("connecting to ZooKeeper at {servers}");
                    self.failures.failed(self.publisher.recorder(), &self.config.identity, &what, &err);
                }
                Err(_) => {
                    let servers = tenure::redact_credentials(&self.config.servers);
                    let what = format!("connecting to ZooKeeper at {servers}");
                    self.failures.failed(self.publisher.recorder(), &self.config.identity, &what, &"no answer in time");
                }
            }
            if let Some(reply) = self.pause(*backoff).await {
                return Err(reply);
            }
            *backoff = (*backoff * 2).min(self.config.session_timeout);
        }
    }

    /// Waits `duration` while answering commands; `Some` when shutdown was asked for.
    async fn pause(&mut self, duration: Duration) -> Option<Reply> {
        let until = Instant::now() + duration;
        loop {
            tokio::select! {
                _ = sleep_until(until) => return None,
                command = self.commands.recv() => {
                    if let Some(reply) = answer_idle(command) {
                        return Some(reply);
                    }
                }
            }
        }
    }

    /// Campaigns within one session until it is lost or shutdown is asked for.
    async fn campaign(&mut self, client: &zk::Client, own: &mut Option<OwnNode>) -> SessionEnd {
        let guid = naming::new_guid();
        let mut states = client.state_watcher();
        let mut retry = Duration::from_millis(20);
        loop {
            match client.state() {
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {}
                zk::SessionState::Disconnected => {
                    // Curator's advice: a suspended connection means stop leading now; the
                    // server may expire the session before we hear from it again.
                    self.stop_leading("connection to ZooKeeper lost");
                    self.publish_unknown();
                    match self.await_reconnect(&mut states).await {
                        Some(end) => return end,
                        None => continue,
                    }
                }
                _ => return SessionEnd::Lost,
            }
            self.fence_if_due();
            if let Err(err) = self.discard_spent(client, own).await {
                if is_session_lost(&err) {
                    return SessionEnd::Lost;
                }
                tracing::debug!(identity = %self.config.identity, error = %err, "deleting the node of an ended tenure failed; retrying");
                if let Some(end) = self.pause_in_session(retry, client, own).await {
                    return end;
                }
                retry = (retry * 2).min(self.config.session_timeout / 4);
                continue;
            }
            let view = match self.observe(client, &guid, own).await {
                Ok(Observed::View(view)) => view,
                Ok(Observed::Again) => continue,
                Err(err) if is_session_lost(&err) => return SessionEnd::Lost,
                Err(err) => {
                    tracing::debug!(identity = %self.config.identity, error = %err, "looking at the election failed; retrying");
                    if let Some(end) = self.pause_in_session(retry, client, own).await {
                        return end;
                    }
                    retry = (retry * 2).min(self.config.session_timeout / 4);
                    continue;
                }
            };
            retry = Duration::from_millis(20);
            self.apply(&view, own);
            if self.spent.is_some() || (view.is_leader && self.leading.is_none()) {
                // A spent node goes first; a look that came too late to lead is taken again.
                continue;
            }
            if let Some(end) = self.wait(client, own, view.watches, &mut states).await {
                return end;
            }
        }
    }

    /// Waits `duration` before a retry within a session, answering commands (a resign steps
    /// down, as we may still lead); `Some` when shutdown was asked for.
    async fn pause_in_session(
        &mut self,
        duration: Duration,
        client: &zk::Client,
        own: &mut Option<OwnNode>,
    ) -> Option<SessionEnd> {
        let until = Instant::now() + duration;
        loop {
            let leading = self.leading.is_some();
            let fence_at = self.valid_until;
            tokio::select! {
                _ = sleep_until(until) => return None,
                _ = sleep_until(fence_at), if leading => {
                    self.fence_if_due();
                    return None;
                }
                command = self.commands.recv() => match command {
                    Some(ElectorCommand::Resign(reply)) => {
                        let result = self.resign(client, own).await;
                        let _ = reply.send(result);
                    }
                    Some(ElectorCommand::Shutdown(reply)) => return Some(SessionEnd::Stop(Some(reply))),
                    None => return Some(SessionEnd::Stop(None)),
                },
            }
        }
    }

    /// Waits for the session to come back after a disconnect; `None` when it did.
    async fn await_reconnect(&mut self, states: &mut zk::StateWatcher) -> Option<SessionEnd> {
        loop {
            tokio::select! {
                state = states.changed() => match state {
                    zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                        tracing::info!(identity = %self.config.identity, "reconnected to ZooKeeper; looking at the election again");
                        return None;
                    }
                    zk::SessionState::Disconnected => {}
                    _ => return Some(SessionEnd::Lost),
                },
                command = self.commands.recv() => {
                    if let Some(reply) = answer_idle(command) {
                        return Some(SessionEnd::Stop(reply));
                    }
                }
            }
        }
    }

    /// Waits for whatever comes first: a watch, a session state change, the leader's heartbeat
    /// or self-fencing deadline, or a command. `None` means: look at the election again.
    async fn wait(
        &mut self,
        client: &zk::Client,
        own: &mut Option<OwnNode>,
        mut watches: WatchFuture,
        states: &mut zk::StateWatcher,
    ) -> Option<SessionEnd> {
        loop {
            let leading = self.leading.is_some();
            let heartbeat_at = self.next_heartbeat;
            let fence_at = self.valid_until;
            tokio::select! {
                _ = &mut watches => return None,
                state = states.changed() => match state {
                    zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => return None,
                    zk::SessionState::Disconnected => {
                        // Stop at once, even if the client reconnects before we look again.
                        self.stop_leading("connection to ZooKeeper lost");
                        self.publish_unknown();
                        return None;
                    }
                    _ => return Some(SessionEnd::Lost),
                },
                _ = sleep_until(heartbeat_at), if leading => {
                    if let Some(end) = self.heartbeat(client, own).await {
                        return end;
                    }
                }
                _ = sleep_until(fence_at), if leading => {
                    self.fence_if_due();
                    return None;
                }
                command = self.commands.recv() => match command {
                    Some(ElectorCommand::Resign(reply)) => {
                        let result = self.resign(client, own).await;
                        let _ = reply.send(result);
                        return None;
                    }
                    Some(ElectorCommand::Shutdown(reply)) => return Some(SessionEnd::Stop(Some(reply))),
                    None => return Some(SessionEnd::Stop(None)),
                },
            }
        }
    }

    /// The leader's proof that the server still hears it: a cheap read of its own node. Its
    /// start moves the self-fencing deadline. `Some(None)` asks for a fresh look at the election.
    async fn heartbeat(&mut self, client: &zk::Client, own: &Option<OwnNode>) -> Option<Option<SessionEnd>> {
        let Some(node) = own else { return Some(None) };
        let started = Instant::now();
        self.next_heartbeat = started + self.heartbeat_interval();
        let path = self.node_path(&node.name);
        let answer = with_timeout(self.call_limit(), client.check_stat(&path)).await;
        let stats = self.publisher.recorder();
        match &answer {
            Ok(_) => {
                stats.record_renew(started, Ok(started.elapsed()));
                stats.record_lock_reached();
            }
            Err(_) => {
                stats.record_renew(started, Err(()));
                stats.record_lock_error();
            }
        }
        match answer {
            Ok(Some(_)) if self.extend(started + self.fence_margin()) => None,
            Ok(Some(_)) => {
                // Answered, but after the deadline: the tenure is over for good.
                self.stop_leading("self-fenced: ZooKeeper answered after the deadline");
                self.publish_unknown();
                Some(None)
            }
            Ok(None) => Some(None),
            Err(err) if is_session_lost(&err) => Some(Some(SessionEnd::Lost)),
            Err(err) => {
                tracing::debug!(identity = %self.config.identity, error = %err, "heartbeat failed");
                // Try again soon: the fencing deadline decides when we stop.
                self.next_heartbeat = Instant::now() + self.heartbeat_interval() / 4;
                None
            }
        }
    }

    /// Reads the children, makes sure our node is among them (finding it by guid first, so a
    /// create whose reply was lost is not repeated), and sets the watches.
    async fn observe(
        &mut self,
        client: &zk::Client,
        guid: &str,
        own: &mut Option<OwnNode>,
    ) -> Result<Observed, ZkError> {
        let started = Instant::now();
        let children = match with_timeout(self.call_limit(), client.list_children(&self.config.path)).await {
            Ok(children) => children,
            Err(ZkError::Request(zk::Error::NoNode)) => {
                self.make_path(client).await?;
                return Ok(Observed::Again);
            }
            Err(err) => return Err(err),
        };
        let ordered = naming::in_election_order(children);
        let Some(index) = ordered.iter().position(|name| naming::is_own(name, guid)) else {
            if own.take().is_some() {
                tracing::warn!(identity = %self.config.identity, "own node is gone (deleted from outside); campaigning again");
                self.stop_leading("own node deleted");
            }
            self.create_node(client, guid, own).await?;
            return Ok(Observed::Again);
        };
        let name = &ordered[index];
        if own.as_ref().map(|node| &node.name) != Some(name) {
            // Created by an earlier attempt whose reply was lost: adopt it.
            match with_timeout(self.call_limit(), client.get_data(&self.node_path(name))).await {
                Ok((_, stat)) => *own = Some(OwnNode { name: name.clone(), czxid: stat.czxid }),
                Err(ZkError::Request(zk::Error::NoNode)) => return Ok(Observed::Again),
                Err(err) => return Err(err),
            }
        }
        let Some(node) = own.as_ref() else { return Ok(Observed::Again) };
        let own_path = self.node_path(&node.name);
        let (stat, own_watch) = with_timeout(self.call_limit(), client.check_and_watch_stat(&own_path)).await?;
        if stat.is_none() {
            return Ok(Observed::Again);
        }
        let mut watches = vec![own_watch];
        let (leader_identity, leader_term) = if index == 0 {
            (self.config.identity.clone(), term_of(node.czxid))
        } else {
            // Watch only the predecessor: when it goes, only we need to look again.
            let predecessor = self.node_path(&ordered[index - 1]);
            let (data, stat, watch) =
                match with_timeout(self.call_limit(), client.get_and_watch_data(&predecessor)).await {
                    Ok(found) => found,
                    Err(ZkError::Request(zk::Error::NoNode)) => return Ok(Observed::Again),
                    Err(err) => return Err(err),
                };
            watches.push(watch);
            if index == 1 {
                (String::from_utf8_lossy(&data).into_owned(), term_of(stat.czxid))
            } else {
                // Followers report the current leader: watch its node too.
                let leader = self.node_path(&ordered[0]);
                let (data, stat, watch) =
                    match with_timeout(self.call_limit(), client.get_and_watch_data(&leader)).await {
                        Ok(found) => found,
                        Err(ZkError::Request(zk::Error::NoNode)) => return Ok(Observed::Again),
                        Err(err) => return Err(err),
                    };
                watches.push(watch);
                (String::from_utf8_lossy(&data).into_owned(), term_of(stat.czxid))
            }
        };
        let watches: WatchFuture = Box::pin(async move {
            futures::future::select_all(watches.into_iter().map(|watch| Box::pin(watch.changed()))).await;
        });
        Ok(Observed::View(View { is_leader: index == 0, leader_identity, leader_term, started, watches }))
    }

    async fn make_path(&self, client: &zk::Client) -> Result<(), ZkError> {
        let options = zk::CreateMode::Persistent.with_acls(self.config.access.acls());
        with_timeout(self.call_limit(), client.mkdir(&self.config.path, &options)).await
    }

    /// Creates our ephemeral sequential node, named and filled as a LeaderLatch would.
    async fn create_node(&self, client: &zk::Client, guid: &str, own: &mut Option<OwnNode>) -> Result<(), ZkError> {
        let prefix = naming::node_prefix(&self.config.path, guid);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.config.access.acls());
        let result =
            with_timeout(self.call_limit(), client.create(&prefix, self.config.identity.as_bytes(), &options)).await;
        match result {
            Ok((stat, sequence)) => {
                let full = format!("{prefix}{:010}", sequence.into_i64());
                let name = full.rsplit('/').next().unwrap_or_default().to_owned();
                tracing::debug!(identity = %self.config.identity, node = %name, czxid = stat.czxid, "created node");
                *own = Some(OwnNode { name, czxid: stat.czxid });
                Ok(())
            }
            Err(ZkError::Request(zk::Error::NoNode)) => self.make_path(client).await,
            Err(err) => Err(err),
        }
    }

    /// Starts, extends or ends the tenure as the view says, and publishes it.
    fn apply(&mut self, view: &View, own: &Option<OwnNode>) {
        let valid_until = view.started + self.fence_margin();
        let role = if view.is_leader && Instant::now() >= valid_until {
            // The look took so long that a tenure would start (or go on) already fenced.
            self.stop_leading("self-fenced: ZooKeeper answered after the deadline");
            Role::Follower
        } else if view.is_leader {
            match self.leading {
                Some(term) if term == view.leader_term => {
                    if !self.extend(valid_until) {
                        self.stop_leading("self-fenced: ZooKeeper answered after the deadline");
                    }
                }
                _ => {
                    self.publisher.start_tenure(view.leader_term, valid_until);
                    self.leading = Some(view.leader_term);
                    self.led_node = own.as_ref().map(|node| node.name.clone());
                    self.valid_until = valid_until;
                    self.next_heartbeat = view.started + self.heartbeat_interval();
                    tracing::info!(
                        identity = %self.config.identity,
                        term = view.leader_term.0,
                        node = own.as_ref().map(|n| n.name.as_str()).unwrap_or(""),
                        "started leading"
                    );
                }
            }
            if self.leading.is_some() {
                Role::Leader
            } else {
                Role::Follower
            }
        } else {
            self.stop_leading("another node is first");
            Role::Follower
        };
        let leadership = if view.is_leader && role != Role::Leader {
            // Fenced with our own node first: nobody leads as far as we know.
            Leadership::unknown()
        } else {
            Leadership { leader: Some(view.leader_identity.clone()), term: Some(view.leader_term), role }
        };
        self.publish(leadership);
    }

    /// Moves the self-fencing deadline; `false` when the tenure had lapsed already (it is then
    /// over for good, and the caller must stop leading).
    fn extend(&mut self, valid_until: Instant) -> bool {
        if valid_until > self.valid_until {
            self.valid_until = valid_until;
            return self.publisher.extend_tenure(valid_until);
        }
        Instant::now() < self.valid_until
    }

    /// Ends the tenure if we hold one; its node is spent.
    fn stop_leading(&mut self, reason: &str) {
        if let Some(term) = self.leading.take() {
            self.publisher.end_tenure();
            self.spent = self.led_node.take();
            self.spent_drain_until = self.valid_until + (self.negotiated_timeout - self.fence_margin());
            tracing::info!(identity = %self.config.identity, term = term.0, reason, "stopped leading");
        }
    }

    /// Nobody known to lead (disconnected, fenced, between sessions).
    fn publish_unknown(&mut self) {
        self.publish(Leadership::unknown());
    }

    /// Publishes `leadership`, logging each change of leader in the record-lock elector's words.
    fn publish(&mut self, leadership: Leadership) {
        let observed = leadership.leader.clone().zip(leadership.term);
        if self.observed.as_ref() != Some(&observed) {
            tracing::info!(
                identity = %self.config.identity,
                leader = observed.as_ref().map_or("", |(identity, _)| identity.as_str()),
                term = observed.as_ref().map(|(_, term)| term.0),
                "leader observed"
            );
            self.observed = Some(observed);
        }
        self.publisher.prune_ended();
        self.publisher.publish(leadership);
    }

    /// Ends the tenure, lets its guards finish (up to the drain timeout) and deletes our node,
    /// so the next candidate leads within one round trip. Not leading: nothing to do.
    async fn resign(&mut self, client: &zk::Client, own: &mut Option<OwnNode>) -> Result<(), ElectorError> {
        let Some(term) = self.leading else { return Ok(()) };
        self.release(client, own, term).await
    }

    /// `Err(ReleaseTimedOut)` when the node could not be deleted: the next candidate then leads
    /// when our session ends.
    async fn release(
        &mut self,
        client: &zk::Client,
        own: &mut Option<OwnNode>,
        term: Term,
    ) -> Result<(), ElectorError> {
        self.stop_leading("stepped down");
        self.publish(Leadership {
            leader: Some(self.config.identity.clone()),
            term: Some(term),
            role: Role::Releasing,
        });
        let drained = self.publisher.wait_for_ended_tenures();
        if timeout(self.config.drain_timeout, drained).await.is_err() {
            tracing::warn!(identity = %self.config.identity, "tenure guards still held after the drain timeout; releasing anyway");
        }
        let deleted = self.delete_own(client, own).await;
        self.publish_unknown();
        deleted
    }

    async fn delete_own(&mut self, client: &zk::Client, own: &mut Option<OwnNode>) -> Result<(), ElectorError> {
        let Some(node) = own.take() else { return Ok(()) };
        let path = self.node_path(&node.name);
        match with_timeout(self.call_timeout(), client.delete(&path, None)).await {
            Ok(()) | Err(ZkError::Request(zk::Error::NoNode)) => {
                tracing::debug!(identity = %self.config.identity, node = %node.name, "deleted own node");
                if self.spent.as_deref() == Some(node.name.as_str()) {
                    self.spent = None;
                }
                Ok(())
            }
            Err(err) => {
                tracing::warn!(identity = %self.config.identity, error = %err, "could not delete own node; it goes with the session");
                Err(ElectorError::ReleaseTimedOut)
            }
        }
    }

    /// Shutdown: end the tenure, wait for guards, delete the node (the session closes after).
    async fn shut_down(&mut self, client: &zk::Client, mut own: Option<OwnNode>) -> Result<(), ElectorError> {
        let result = match self.leading {
            Some(term) => self.release(client, &mut own, term).await,
            None => {
                let deleted = self.delete_own(client, &mut own).await;
                self.publish_unknown();
                deleted
            }
        };
        // Guards of tenures that ended earlier (a loss) are waited for too, so that a shutdown
        // returns only when no leader work is left running.
        let drained = self.publisher.wait_for_ended_tenures();
        let _ = timeout(self.config.drain_timeout, drained).await;
        result
    }
}

/// Answers a command that arrives while no session is up (nothing is held): `Some` means stop.
fn answer_idle(command: Option<ElectorCommand>) -> Option<Reply> {
    match command {
        Some(ElectorCommand::Resign(reply)) => {
            let _ = reply.send(Ok(()));
            None
        }
        Some(ElectorCommand::Shutdown(reply)) => Some(Some(reply)),
        None => Some(None),
    }
}

fn is_session_lost(err: &ZkError) -> bool {
    matches!(
        err,
        ZkError::Request(
            zk::Error::SessionExpired | zk::Error::SessionMoved | zk::Error::ClientClosed | zk::Error::AuthFailed
        )
    )
}
