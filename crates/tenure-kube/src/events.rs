//! Kubernetes Events on the lock object when this instance becomes leader or stops leading, as
//! client-go's `resourcelock.RecordEvent` posts them (reason `LeaderElection`, message
//! `"<identity> became leader"` / `"<identity> stopped leading"`, the lock object as involved
//! object; on both objects of a multi-lock).
//!
//! Why a task that follows the elector's leadership channel, rather than a lock wrapper or a hook
//! in the elector: leadership is decided by the elector, not by lock calls (a leader stops leading
//! when its renew deadline passes, with no call at all), and the leadership channel is exactly
//! what client-go's `OnStartedLeading`/`OnStoppedLeading` callbacks are. Following it keeps events
//! out of the election's path: a slow or failing event post cannot delay a renew, and a failure
//! is only logged.

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::PostParams;
use kube::Api;
use tenure::{Leadership, Term};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The reason client-go gives its leader election events.
pub const EVENT_REASON: &str = "LeaderElection";

/// How long one event post may take before it is given up (events are best effort).
const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// Posts leader election Events for one candidate.
///
/// Why its own client: the events are attributed to the candidate (its `User-Agent`), and the
/// source component is the program's, as client-go's recorder takes it from its broadcaster.
#[derive(Clone)]
pub struct EventRecorder {
    client: kube::Client,
    identity: String,
    component: String,
    host: Option<String>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("identity", &self.identity)
            .field("component", &self.component)
            .field("host", &self.host)
            .finish()
    }
}

/// What happened to this instance's leadership, in client-go's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeadershipChange {
    /// It became leader (`"<identity> became leader"`).
    BecameLeader,
    /// It stopped leading (`"<identity> stopped leading"`).
    StoppedLeading,
}

impl LeadershipChange {
    /// The words after the identity in the event message.
    pub fn as_str(self) -> &'static str {
        match self {
            LeadershipChange::BecameLeader => "became leader",
            LeadershipChange::StoppedLeading => "stopped leading",
        }
    }
}

/// The changes between two leadership states, given as the term this instance leads with (or
/// `None`): a new term is a stop of the old tenure and a start of the new one, even if the
/// follower state in between was never seen.
pub fn changes(before: Option<Term>, after: Option<Term>) -> Vec<LeadershipChange> {
    if before == after {
        return Vec::new();
    }
    let stopped = before.map(|_| LeadershipChange::StoppedLeading);
    stopped.into_iter().chain(after.map(|_| LeadershipChange::BecameLeader)).collect()
}

fn leading_term(leadership: &Leadership) -> Option<Term> {
    leadership.is_leader().then(|| leadership.term.unwrap_or(Term(0)))
}

impl EventRecorder {
    /// A recorder for the candidate `identity`, posting with `client` (source component `tenure`).
    pub fn new(client: kube::Client, identity: impl Into<String>) -> Self {
        EventRecorder { client, identity: identity.into(), component: "tenure".to_owned(), host: None }
    }

    /// The event source's component (client-go: the program, such as `kube-controller-manager`).
    #[must_use]
    pub fn component(mut self, component: impl Into<String>) -> Self {
        self.component = component.into();
        self
    }

    /// The event source's host (client-go's recorders usually set the node or pod name).
    #[must_use]
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// The Event client-go's recorder would post about `subject` for `change`, at `now`.
    pub fn event(&self, subject: &ObjectReference, change: LeadershipChange, now: chrono::DateTime<Utc>) -> Event {
        let nanos = now.timestamp_nanos_opt().unwrap_or_default();
        // client-go: "<object name>.<unix nanoseconds in hex>".
        let name = format!("{}.{nanos:x}", subject.name.as_deref().unwrap_or_default());
        let metadata = ObjectMeta { name: Some(name), namespace: subject.namespace.clone(), ..ObjectMeta::default() };
        let time = crate::codec::to_kube_time(now).ok().map(Time);
        Event {
            metadata,
            involved_object: subject.clone(),
            reason: Some(EVENT_REASON.to_owned()),
            message: Some(format!("{} {}", self.identity, change.as_str())),
            type_: Some("Normal".to_owned()),
            source: Some(EventSource { component: Some(self.component.clone()), host: self.host.clone() }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone().unwrap_or_else(|| self.identity.clone())),
            first_timestamp: time.clone(),
            last_timestamp: time,
            count: Some(1),
            ..Event::default()
        }
    }

    /// Posts one event about `subject`. Errors are returned for the caller to log; leadership
    /// never depends on them.
    pub async fn post(&self, subject: &ObjectReference, change: LeadershipChange) -> Result<(), kube::Error> {
        let event = self.event(subject, change, Utc::now());
        let namespace = subject.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &event).await.map(|_| ())
    }

    /// Posts an event on each subject, logging failures and giving each post [`POST_TIMEOUT`].
    async fn post_logged(&self, subjects: &[ObjectReference], change: LeadershipChange) {
        for subject in subjects {
            let name = subject.name.as_deref().unwrap_or("");
            match tokio::time::timeout(POST_TIMEOUT, self.post(subject, change)).await {
                Ok(Ok(())) => {
                    tracing::debug!(identity = %self.identity, object = name, change = change.as_str(), "event posted")
                }
                Ok(Err(error)) => {
                    tracing::warn!(identity = %self.identity, object = name, %error, "posting a leader election event failed")
                }
                Err(_) => {
                    tracing::warn!(identity = %self.identity, object = name, "posting a leader election event timed out")
                }
            }
        }
    }

    /// Follows `leadership` (from [`tenure::Elector::subscribe`]) and posts an event on each of the
    /// objects `subjects` returns whenever this instance becomes leader or stops leading, until the
    /// elector stops. `subjects` is asked at each change, so the references carry the uid and
    /// version of the object as last seen.
    pub fn spawn(
        self,
        mut leadership: watch::Receiver<Leadership>,
        subjects: impl Fn() -> Vec<ObjectReference> + Send + Sync + 'static,
    ) -> LeadershipEvents {
        let task = tokio::spawn(async move {
            let mut leading: Option<Term> = None;
            loop {
                let open = leadership.changed().await.is_ok();
                // The last state is read even when the elector has gone: it publishes its final
                // state (not leading) before it stops.
                let now_leading = leading_term(&leadership.borrow_and_update());
                for change in changes(leading, now_leading) {
                    self.post_logged(&subjects(), change).await;
                }
                leading = now_leading;
                if !open {
                    if leading.is_some() {
                        // The elector vanished without saying it stopped: it no longer leads.
                        self.post_logged(&subjects(), LeadershipChange::StoppedLeading).await;
                    }
                    return;
                }
            }
        });
        LeadershipEvents { task }
    }
}

/// The task that posts leader election events for one elector.
///
/// Why a handle: a process that shuts down should let the last event ("stopped leading") go out;
/// [`LeadershipEvents::finish`] waits for that, bounded. Dropping the handle leaves the task
/// running until the elector stops.
#[derive(Debug)]
pub struct LeadershipEvents {
    task: JoinHandle<()>,
}

impl LeadershipEvents {
    /// Waits (at most a few seconds per pending event) until the elector has stopped and its last
    /// events are posted. Call after [`tenure::Elector::shutdown`].
    pub async fn finish(self) {
        let mut task = self.task;
        if tokio::time::timeout(POST_TIMEOUT * 4, &mut task).await.is_err() {
            task.abort();
        }
    }

    /// Stops posting events now.
    pub fn abort(self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject() -> ObjectReference {
        ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some("ns".into()),
            name: Some("lock".into()),
            uid: Some("u-1".into()),
            resource_version: Some("7".into()),
            field_path: None,
        }
    }

    #[test]
    fn leadership_changes_follow_client_go_callbacks() {
        use LeadershipChange::*;
        assert_eq!(changes(None, None), vec![]);
        assert_eq!(changes(None, Some(Term(3))), vec![BecameLeader]);
        assert_eq!(changes(Some(Term(3)), Some(Term(3))), vec![]);
        assert_eq!(changes(Some(Term(3)), None), vec![StoppedLeading]);
        // Lost and re-acquired between two looks: both callbacks would have run.
        assert_eq!(changes(Some(Term(3)), Some(Term(5))), vec![StoppedLeading, BecameLeader]);
    }

    #[tokio::test]
    async fn events_read_as_client_go_writes_them() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let recorder = EventRecorder::new(kube::Client::try_from(config).unwrap(), "pod-a_1").component("my-ctl");
        let now = chrono::DateTime::parse_from_rfc3339("2024-05-01T10:00:00.000000001Z").unwrap().to_utc();
        let json = serde_json::to_value(recorder.event(&subject(), LeadershipChange::BecameLeader, now)).unwrap();
        assert_eq!(json["metadata"]["name"], format!("lock.{:x}", now.timestamp_nanos_opt().unwrap()));
        assert_eq!(json["metadata"]["namespace"], "ns");
        assert_eq!(json["reason"], "LeaderElection");
        assert_eq!(json["message"], "pod-a_1 became leader");
        assert_eq!(json["type"], "Normal");
        assert_eq!(json["source"]["component"], "my-ctl");
        assert_eq!(json["involvedObject"]["kind"], "Lease");
        assert_eq!(json["involvedObject"]["uid"], "u-1");
        assert_eq!(json["count"], 1);
        let stopped = recorder.event(&subject(), LeadershipChange::StoppedLeading, now);
        assert_eq!(stopped.message.as_deref(), Some("pod-a_1 stopped leading"));
    }
}
