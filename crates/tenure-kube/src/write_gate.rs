//! A write gate for kube-rs clients: a process that does not lead (or does not own an object's
//! partition) sends no write to the API server (invariant W1, like Kubernetes KEP-6361 and
//! Pinniped's leader-election middleware).
//!
//! Why it exists: checking `tenure.check()?` before each side effect is easy to forget in one
//! place, and a check made before an `await` is stale after it (a process paused past its lease
//! resumes in the middle of a reconcile, with its write already built). The gate sits in the
//! client itself, so every write of every code path goes through the same check, made at the
//! moment the request leaves, on this process's monotonic clock.
//!
//! [`WriteGate::client`] wraps the `kube::Client` you already have (its connection, credentials,
//! user agent and default namespace stay), and the gate is also a `tower` layer for a client you
//! build from a `kube::Config` (see **Cost** below). Either way the result is an ordinary
//! `kube::Client`, so `Api<K>`, kube-runtime's `Controller` and `watcher`, and your own code use
//! it unchanged.
//!
//! - **Reads pass**: `GET`, `HEAD`, `OPTIONS` (a watch and a list are `GET`s) go through whatever
//!   the leadership, without a check. A `GET` that asks for a protocol upgrade (`exec`, `attach`,
//!   `portforward`) runs something in a pod: it is gated as a write (the API server's authorizer
//!   also calls it `create`).
//! - **Writes are checked before they leave**: `POST`, `PUT`, `PATCH`, `DELETE` (and any other
//!   method) need the permission *now*, or fail with [`WriteRefused`] without a byte sent.
//! - **Writes in flight are cancelled** the moment the permission ends: the request future is
//!   dropped, so the client stops sending and abandons the connection, and the caller gets
//!   [`WriteRefused`] with [`RefusalReason::Cancelled`]. Such a write may or may not have been
//!   applied (like a timeout); a reconciler re-reads and tries again under its next tenure.
//!   Fencing by term stays the last line of defence for what was already sent.
//!
//! Two permission sources:
//!
//! - **Active/Passive** ([`WriteGate::leader`]): writes while this process leads: an
//!   [`Elector`], its [`ElectorView`] or a [`Subscriber`] hands out a [`Tenure`] guard, checked
//!   with [`Tenure::is_valid`] (the self-fencing deadline on the local clock, so a process thawed
//!   after a pause past its lease refuses its very first write) and held for the duration of the
//!   request: a graceful release waits for the write, which is itself cancelled the moment the
//!   tenure ends, so the release is never held up by a slow API server.
//! - **Active/Active** ([`WriteGate::owner`]): writes to objects whose partition this member of a
//!   [`tenure_group::Group`] owns now. The request's key is `namespace/name` (or `name` for a
//!   cluster-scoped object, as `tenure_ha::kube_shard::object_key`): from the path for `PUT`,
//!   `PATCH`, `DELETE` and subresources (`pods/x/status`, `pods/x/eviction`), from the body's
//!   `metadata.name` for a create. The partition's [`PartitionGuard`] is held for the request and
//!   the write is cancelled when it stops being valid (revoked, lost, or the membership ran out on
//!   the local clock). [`WriteGate::owner_keyed`] takes your own key function, for controllers that
//!   write objects related to the one they reconcile.
//!
//! **Writes that name no object** under the default key (decision): a create without a name (a
//! `generateName` create, or a review such as `SelfSubjectAccessReview`) is allowed while this
//! member's membership is valid: the object does not exist yet, so no other member works on it,
//! and once created it belongs to the partition of its name like any other. A `DELETE` of a whole
//! collection (or a `PUT`/`PATCH` without a name) may touch objects of any partition, so it is
//! refused ([`RefusalReason::NotOwner`]), and so is a create whose body is not JSON (its name, and
//! so its partition, is unknown; kube-rs always sends JSON). With your own key function, `None`
//! means "not keyed": allowed while the membership is valid, whatever the method.
//!
//! **Cost.** No I/O. A read costs a method comparison; an Active/Passive write takes a guard from
//! the elector's watch channel (a read lock, two atomic increments, a clock read) and races the
//! request against the tenure's end (a cancellation token and a timer for the self-fencing
//! deadline); an Active/Active write also parses the path (allocating only the key) and, for a
//! create, the body's `metadata.name`, and takes the partition's guard (one lock). Measured by
//! `examples/write_gate_bench.rs` (medians, release build, 2 shared cores; the crate's README has
//! the table): in a hot loop the gate adds 0.1 us to a read and 0.5 us (Active/Passive) or 0.9 us
//! (Active/Active) to a write; against `tenure apiserver` on loopback (a GET 70 to 220 us, a PUT
//! 100 to 245 us) the layered gate adds about 1 us to a GET and 4 to 9 us to a PUT (cold caches,
//! and the race against the permission's end). [`WriteGate::client`] adds a second `tower` buffer
//! hop on top (7 to 15 us per request on loopback): where latency matters, build the client with
//! the gate as a layer:
//!
//! ```no_run
//! # async fn f(elector: tenure::Elector) -> Result<(), Box<dyn std::error::Error>> {
//! use tenure_kube::WriteGate;
//! let config = kube::Config::infer().await?;
//! let gate = WriteGate::leader(&elector);
//! let client = kube::client::ClientBuilder::try_from(config)?.with_layer(&gate).build();
//! # Ok(()) }
//! ```
//!
//! Refusals and cancellations are counted in [`WriteGateMetrics`]
//! (`tenure_write_gate_rejections_total{reason}`).
//!
//! **Gate the client of your work, never the client of the lock**: the elector must write its
//! Lease (and a group member its records) precisely when it does not lead yet. Gating creates a
//! new client and leaves the one you pass in ungated, so one connection can serve both.
//!
//! ```no_run
//! # async fn f(elector: tenure::Elector, client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, PostParams};
//! use tenure_kube::write_gate::{WriteGate, WriteRefused};
//!
//! let gated = WriteGate::leader(&elector).client(client);
//! let configmaps: Api<ConfigMap> = Api::default_namespaced(gated);
//! let cm = ConfigMap { metadata: kube::api::ObjectMeta { name: Some("x".into()), ..Default::default() }, ..Default::default() };
//! match configmaps.create(&PostParams::default(), &cm).await {
//!     Ok(_) => println!("written while leading"),
//!     Err(error) => match WriteRefused::find(&error) {
//!         Some(refused) => println!("not sent: {refused}"),   // not leading: nothing left the process
//!         None => return Err(error.into()),
//!     },
//! }
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body::Body as _;
use kube::client::Body;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tenure::{Elector, ElectorView, Subscriber, Tenure};
use tenure_group::{Ownership, PartitionGuard};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The key an object is sharded by: `namespace/name`, or `name` for a cluster-scoped object.
///
/// Why here: the write gate keys a request by it and `tenure_ha::kube_shard` keys the objects it
/// reconciles by it; one definition keeps the two from ever disagreeing about an object's
/// partition.
///
/// ```
/// assert_eq!(tenure_kube::write_gate::object_key(Some("default"), "web"), "default/web");
/// assert_eq!(tenure_kube::write_gate::object_key(None, "node-1"), "node-1");
/// ```
pub fn object_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => [namespace, "/", name].concat(),
        None => name.to_owned(),
    }
}

/// True if a request may change something and so needs the permission: every method but `GET`,
/// `HEAD` and `OPTIONS`, and those too when they ask for a protocol upgrade (`exec`, `attach`,
/// `portforward` run something in a pod).
fn is_write(method: &Method, headers: &HeaderMap) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) || headers.contains_key(http::header::UPGRADE)
}

/// What a write addresses, parsed from its path (and, for a create, the body's `metadata.name`)
/// the way the API server lays paths out: `/api/v1/...` for the core group,
/// `/apis/GROUP/VERSION/...` for the others, namespaced objects under `namespaces/NS/`.
///
/// Why it exists: an Active/Active gate needs the object's key before the request leaves, and a
/// key function of your own ([`WriteGate::owner_keyed`]) receives it to key writes by something
/// else (a parent object). It borrows from the request, so the check allocates nothing but the
/// key; [`WriteRefused`] carries an owned copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteTarget<'a> {
    path: Cow<'a, str>,
    group: Cow<'a, str>,
    version: Cow<'a, str>,
    resource: Cow<'a, str>,
    namespace: Option<Cow<'a, str>>,
    name: Option<Cow<'a, str>>,
    subresource: Option<Cow<'a, str>>,
    name_from_body: bool,
}

/// The subresources of a Namespace object: `namespaces/NAME/status` is the Namespace's status,
/// not a resource `status` in namespace NAME (as the API server's request parser decides).
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

impl<'a> WriteTarget<'a> {
    /// Parses a request path (without its query). A path that is not a resource path
    /// (`/version`, `/api`) gives a target without a resource.
    ///
    /// ```
    /// use tenure_kube::write_gate::WriteTarget;
    /// let target = WriteTarget::parse("/apis/apps/v1/namespaces/shop/deployments/web/scale");
    /// assert_eq!(target.group(), "apps");
    /// assert_eq!(target.resource(), Some("deployments"));
    /// assert_eq!(target.namespace(), Some("shop"));
    /// assert_eq!(target.name(), Some("web"));
    /// assert_eq!(target.subresource(), Some("scale"));
    /// assert_eq!(target.object_key().as_deref(), Some("shop/web"));
    /// ```
    pub fn parse(path: &'a str) -> WriteTarget<'a> {
        let mut segments = path.split('/').filter(|s| !s.is_empty());
        let (group, version) = match segments.next() {
            Some("api") => (Some(""), segments.next()),
            Some("apis") => (segments.next(), segments.next()),
            _ => (None, None),
        };
        // Not a resource path: no group, version or resource (a version is never empty).
        let (group, version) = group.zip(version).unwrap_or_default();
        let mut rest: [Option<&'a str>; 5] = [None; 5];
        if !version.is_empty() {
            for (slot, segment) in rest.iter_mut().zip(segments) {
                *slot = Some(segment);
            }
        }
        let (resource, namespace, name, subresource) = match rest {
            // namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE[/...]]]
            [Some("namespaces"), Some(namespace), Some(resource), name, subresource]
                if !NAMESPACE_SUBRESOURCES.contains(&resource) =>
            {
                (resource, Some(namespace), name, subresource)
            }
            // RESOURCE[/NAME[/SUBRESOURCE[/...]]]: cluster-scoped (a Namespace itself included), or
            // a collection across all namespaces.
            [Some(resource), name, subresource, ..] => (resource, None, name, subresource),
            [None, ..] => ("", None, None, None),
        };
        WriteTarget {
            path: Cow::Borrowed(path),
            group: decode(group),
            version: decode(version),
            resource: decode(resource),
            namespace: namespace.map(decode),
            name: name.map(decode),
            subresource: subresource.map(decode),
            name_from_body: false,
        }
    }

    /// The request path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The API group (`""` for the core group, and for a path that is not a resource path).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The API version (`""` for a path that is not a resource path).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The resource (plural, `configmaps`), `None` for a path that is not a resource path.
    pub fn resource(&self) -> Option<&str> {
        Some(&*self.resource).filter(|r| !r.is_empty())
    }

    /// The namespace in the path; `None` for a cluster-scoped object (a Namespace included) and
    /// for a collection across all namespaces.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The object's name: from the path, or for a create of a collection from the body's
    /// `metadata.name`; `None` for a collection (a `generateName` create, a collection delete).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The subresource (`status`, `scale`, `eviction`), if any.
    pub fn subresource(&self) -> Option<&str> {
        self.subresource.as_deref()
    }

    /// The object's key ([`object_key`]) when the write names one object: what the default
    /// Active/Active gate checks ownership of.
    pub fn object_key(&self) -> Option<String> {
        Some(object_key(self.namespace(), self.name()?))
    }

    /// An owned copy, for errors that outlive the request.
    pub fn into_owned(self) -> WriteTarget<'static> {
        let owned = |cow: Cow<'a, str>| Cow::Owned(cow.into_owned());
        WriteTarget {
            path: owned(self.path),
            group: owned(self.group),
            version: owned(self.version),
            resource: owned(self.resource),
            namespace: self.namespace.map(owned),
            name: self.name.map(owned),
            subresource: self.subresource.map(owned),
            name_from_body: self.name_from_body,
        }
    }

    /// Takes the name of a create from its body, when the path names none.
    fn with_body_name(mut self, name: Option<Cow<'a, str>>) -> Self {
        if self.name.is_none() && name.is_some() {
            self.name = name;
            self.name_from_body = true;
        }
        self
    }
}

impl fmt::Display for WriteTarget<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)?;
        match &self.name {
            Some(name) if self.name_from_body => write!(f, " (name {name})"),
            _ => Ok(()),
        }
    }
}

/// A path segment, percent-decoded if it needs it (names never do in practice: a DNS label); an
/// invalid escape stays as it is, and so does the whole segment if its decoded bytes are not UTF-8.
fn decode(segment: &str) -> Cow<'_, str> {
    percent_encoding::percent_decode_str(segment).decode_utf8().unwrap_or(Cow::Borrowed(segment))
}

/// The `metadata.name` of a JSON object (a create's body), if it has a non-empty one; `Err` if
/// the body is not a JSON object.
fn name_in_body(body: &[u8]) -> Result<Option<Cow<'_, str>>, ()> {
    #[derive(serde::Deserialize)]
    struct Object<'a> {
        #[serde(borrow, default)]
        metadata: Option<Metadata<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Metadata<'a> {
        #[serde(borrow, default)]
        name: Option<Cow<'a, str>>,
    }
    let object: Object<'_> = serde_json::from_slice(body).map_err(drop)?;
    Ok(object.metadata.and_then(|m| m.name).filter(|name| !name.is_empty()))
}

/// Why a write was not sent, or was cancelled; the `reason` label of
/// `tenure_write_gate_rejections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// Active/Passive: this process does not lead now (no tenure, or it ended or ran out on the
    /// local clock).
    NotLeader,
    /// Active/Active: this member does not own the partition of the object's key now, or the
    /// write may touch objects of any partition (a collection delete under the default key).
    NotOwner,
    /// Active/Active: a write that names no object, and this process is not a member of the
    /// group now (its membership lapsed on the local clock, or it left).
    NotMember,
    /// The write was let through, but the permission ended before its response arrived: the
    /// request was dropped. It may or may not have been applied.
    Cancelled,
}

impl RefusalReason {
    /// Every reason, for metrics that show each at zero.
    pub const ALL: [RefusalReason; 4] =
        [RefusalReason::NotLeader, RefusalReason::NotOwner, RefusalReason::NotMember, RefusalReason::Cancelled];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::NotLeader => "not_leader",
            RefusalReason::NotOwner => "not_owner",
            RefusalReason::NotMember => "not_member",
            RefusalReason::Cancelled => "cancelled",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            RefusalReason::NotLeader => "not sent: this process does not lead",
            RefusalReason::NotOwner => "not sent: this member does not own the object's partition",
            RefusalReason::NotMember => "not sent: this process is not a member of the group",
            RefusalReason::Cancelled => {
                "cancelled in flight: the permission ended before the answer came (it may have been applied)"
            }
        }
    }
}

/// A write the gate did not send (or cancelled in flight), returned by the gated client.
///
/// Why a type of its own: a reconciler must tell "not my job now" (stop, do not retry here)
/// from an API error (retry with back-off). The client returns it as `kube::Error::Service`;
/// [`WriteRefused::find`] gets it back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("write gate: {method} {target}{}: {}", key_note(.key), .reason.describe())]
pub struct WriteRefused {
    /// The request's method.
    pub method: Method,
    /// What the request addressed.
    pub target: WriteTarget<'static>,
    /// The key whose partition was checked (Active/Active), if the write had one.
    pub key: Option<String>,
    /// Why.
    pub reason: RefusalReason,
}

fn key_note(key: &Option<String>) -> String {
    key.as_ref().map(|key| format!(" (key {key})")).unwrap_or_default()
}

impl WriteRefused {
    /// The refusal inside an error of a gated client, if that is what it is.
    pub fn find(error: &kube::Error) -> Option<&WriteRefused> {
        if let kube::Error::Service(inner) = error { inner.downcast_ref::<WriteRefused>() } else { None }
    }

    /// The refusal anywhere in an error's chain of sources (a reconciler's error that wraps the
    /// client's, kube-runtime's `Error::ReconcilerFailed`).
    pub fn find_in<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e WriteRefused> {
        std::iter::successors(Some(error), |error| error.source()).find_map(|error| error.downcast_ref())
    }
}

/// The label set of the rejection counter.
pub type ReasonLabel = [(&'static str, &'static str); 1];

/// Metrics of a [`WriteGate`]. Clones share the same series.
///
/// Why: a gate that refuses is working as designed, but one that refuses often (a follower whose
/// code writes anyway, a controller whose keys do not match its shard) is a bug worth an alert,
/// and cancellations show how often leadership ended under a write.
#[derive(Debug, Clone, Default)]
pub struct WriteGateMetrics {
    /// Writes refused before they were sent, and writes cancelled in flight, by reason.
    pub rejections: Family<ReasonLabel, Counter>,
}

impl WriteGateMetrics {
    /// New metrics registered in `registry` as `tenure_write_gate_rejections_total{reason}`, every
    /// reason present from the start (at 0).
    pub fn register(registry: &mut Registry) -> WriteGateMetrics {
        let metrics = WriteGateMetrics::default();
        for reason in RefusalReason::ALL {
            drop(metrics.rejections.get_or_create(&[("reason", reason.as_str())]));
        }
        registry.register(
            "tenure_write_gate_rejections",
            "Writes the write gate refused before they were sent, or cancelled in flight, by reason",
            metrics.rejections.clone(),
        );
        metrics
    }

    /// How many writes were refused (or cancelled) for `reason`.
    pub fn rejections_for(&self, reason: RefusalReason) -> u64 {
        self.rejections.get_or_create(&[("reason", reason.as_str())]).get()
    }

    fn count(&self, reason: RefusalReason) {
        self.rejections.get_or_create(&[("reason", reason.as_str())]).inc();
    }

    /// Counts and logs a refusal, and makes the error the client returns.
    fn refused(&self, method: Method, target: WriteTarget<'_>, key: Option<String>, reason: RefusalReason) -> BoxError {
        self.count(reason);
        tracing::debug!(%method, %target, ?key, reason = reason.as_str(), "write gate: write not sent");
        Box::new(WriteRefused { method, target: target.into_owned(), key, reason })
    }
}

/// Where an Active/Passive gate gets its [`Tenure`] guards: an [`Elector`], an [`ElectorView`] or
/// a [`Subscriber`].
///
/// Why not the `Elector` itself: the gate lives as long as the clients made from it, and must
/// never keep the elector campaigning; the view and the subscriber read leadership without owning
/// the election.
#[derive(Debug, Clone)]
pub struct LeaderSource(LeaderSourceKind);

#[derive(Debug, Clone)]
enum LeaderSourceKind {
    View(ElectorView),
    Subscriber(Subscriber),
}

impl LeaderSource {
    fn tenure(&self) -> Option<Tenure> {
        match &self.0 {
            LeaderSourceKind::View(view) => view.tenure(),
            LeaderSourceKind::Subscriber(subscriber) => subscriber.tenure(),
        }
    }
}

impl From<&Elector> for LeaderSource {
    fn from(elector: &Elector) -> Self {
        LeaderSource(LeaderSourceKind::View(elector.view()))
    }
}

impl From<ElectorView> for LeaderSource {
    fn from(view: ElectorView) -> Self {
        LeaderSource(LeaderSourceKind::View(view))
    }
}

impl From<Subscriber> for LeaderSource {
    fn from(subscriber: Subscriber) -> Self {
        LeaderSource(LeaderSourceKind::Subscriber(subscriber))
    }
}

type KeyFn = Arc<dyn Fn(&WriteTarget<'_>) -> Option<String> + Send + Sync>;

#[derive(Clone)]
enum Permission {
    Leader(LeaderSource),
    Owner { ownership: Ownership, key: Option<KeyFn> },
}

/// Decides which requests of a kube-rs client may leave this process: reads always, writes only
/// while this process leads (Active/Passive) or owns the object's partition (Active/Active).
/// Cheap to clone. [`WriteGate::client`] wraps a `kube::Client` you have; as a `tower` layer it
/// goes into a client you build (`ClientBuilder::try_from(config)?.with_layer(&gate).build()`),
/// one buffer hop cheaper. See the module documentation for the rules.
#[derive(Clone)]
pub struct WriteGate {
    permission: Permission,
    metrics: WriteGateMetrics,
}

impl fmt::Debug for WriteGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let permission = match &self.permission {
            Permission::Leader(source) => format!("leader({source:?})"),
            Permission::Owner { key: None, .. } => "owner(object key)".to_owned(),
            Permission::Owner { key: Some(_), .. } => "owner(custom key)".to_owned(),
        };
        f.debug_struct("WriteGate").field("permission", &permission).finish_non_exhaustive()
    }
}

impl WriteGate {
    /// Active/Passive: writes only while this process leads (`&elector`, `elector.view()` or a
    /// [`Subscriber`]).
    pub fn leader(source: impl Into<LeaderSource>) -> WriteGate {
        WriteGate { permission: Permission::Leader(source.into()), metrics: WriteGateMetrics::default() }
    }

    /// Active/Active: writes only to objects whose key (`namespace/name`, [`object_key`]) this
    /// member owns now (`group.ownership()`); a create without a name while it is a member; never
    /// a collection delete.
    pub fn owner(ownership: Ownership) -> WriteGate {
        WriteGate { permission: Permission::Owner { ownership, key: None }, metrics: WriteGateMetrics::default() }
    }

    /// Active/Active with your own key: `key(target)` names the key whose partition must be owned
    /// (for a controller that writes objects related to the one it reconciles, the parent's key);
    /// `None` means the write is not keyed and is allowed while the membership is valid.
    ///
    /// ```
    /// # fn f(group: tenure_group::Group) {
    /// use tenure_kube::write_gate::{object_key, WriteGate};
    /// // ConfigMaps "<parent>-config" are written by the owner of their parent "<parent>".
    /// let gate = WriteGate::owner_keyed(group.ownership(), |target| {
    ///     let name = target.name()?;
    ///     let parent = name.strip_suffix("-config").unwrap_or(name);
    ///     Some(object_key(target.namespace(), parent))
    /// });
    /// # }
    /// ```
    pub fn owner_keyed(
        ownership: Ownership,
        key: impl Fn(&WriteTarget<'_>) -> Option<String> + Send + Sync + 'static,
    ) -> WriteGate {
        WriteGate { permission: Permission::Owner { ownership, key: Some(Arc::new(key)) }, metrics: Default::default() }
    }

    /// Counts refusals and cancellations into these metrics (e.g. from
    /// [`WriteGateMetrics::register`]); default: unregistered.
    #[must_use]
    pub fn with_metrics(mut self, metrics: WriteGateMetrics) -> WriteGate {
        self.metrics = metrics;
        self
    }

    /// The metrics this gate counts into.
    pub fn metrics(&self) -> &WriteGateMetrics {
        &self.metrics
    }

    /// A client that sends through `client` whatever this gate lets through, with `client`'s
    /// default namespace. `client` itself stays ungated.
    ///
    /// Why beside the layer: it gates the client a program already has, however it was built.
    /// The price is a second `tower` buffer hop per request (1.4 us in a hot loop, 7 to 15 us per
    /// request against an API server on loopback; see `examples/write_gate_bench.rs`); a client
    /// built with the gate as a layer (`ClientBuilder::with_layer(&gate)`) has none. Must be
    /// called inside a tokio runtime (like `kube::Client::new`, it starts the client's buffer
    /// task).
    pub fn client(&self, client: kube::Client) -> kube::Client {
        let namespace = client.default_namespace().to_owned();
        let valid_until = *client.valid_until();
        let service = tower_layer::Layer::layer(self, SendThrough(Arc::new(client)));
        kube::Client::new(service, namespace).with_valid_until(valid_until)
    }

    /// The decision for one request, before it is sent: `None` for a read (no permission
    /// needed), else the permission to hold while the write is in flight, or the refusal. No
    /// I/O; for a create under an Active/Active gate, the body (already in memory) is read
    /// without being consumed.
    fn admit(&self, request: &Request<Body>) -> Option<Result<Admitted, BoxError>> {
        if !is_write(request.method(), request.headers()) {
            return None;
        }
        let (method, path) = (request.method(), request.uri().path());
        let admitted = |permit, key| Admitted { permit, method: method.clone(), uri: request.uri().clone(), key };
        let refused = |target, key, reason| self.metrics.refused(method.clone(), target, key, reason);
        Some(match &self.permission {
            Permission::Leader(source) => match source.tenure() {
                Some(tenure) => Ok(admitted(Permit::Tenure(tenure), None)),
                None => Err(refused(WriteTarget::parse(path), None, RefusalReason::NotLeader)),
            },
            Permission::Owner { ownership, key: key_fn } => {
                let mut target = WriteTarget::parse(path);
                // A create of a collection: its name is in the body.
                let body = (*method == Method::POST && target.resource().is_some() && target.name().is_none())
                    .then(|| body_bytes(request.body()));
                let unnamed = match body.as_ref().map(|bytes| bytes.as_deref().map(name_in_body)) {
                    Some(Some(Ok(name))) => {
                        target = target.with_body_name(name);
                        false
                    }
                    // Not a body this gate can read without consuming it (a stream), or not JSON.
                    Some(None | Some(Err(()))) => true,
                    None => false,
                };
                let key = key_fn.as_ref().map_or_else(|| target.object_key(), |key_fn| key_fn(&target));
                let permit = match &key {
                    Some(key) => ownership.guard_for_key(key).map(Permit::Partition).ok_or(RefusalReason::NotOwner),
                    // The default key names no object. A create is of a new object, which no
                    // member works on yet; anything else (a collection delete), or a create whose
                    // name could not be read, may touch objects of every partition.
                    None if key_fn.is_none() && (*method != Method::POST || unnamed) => Err(RefusalReason::NotOwner),
                    None if ownership.is_member() => Ok(Permit::Member(ownership.clone())),
                    None => Err(RefusalReason::NotMember),
                };
                match permit {
                    Ok(permit) => Ok(admitted(permit, key)),
                    Err(reason) => Err(refused(target, key, reason)),
                }
            }
        })
    }
}

/// A write let through, and what its cancellation error needs.
struct Admitted {
    permit: Permit,
    method: Method,
    uri: http::Uri,
    key: Option<String>,
}

/// What lets one write through while it is in flight: held until its answer came (a graceful
/// release or handover waits for it), and raced against, so that the write is dropped the
/// moment the permission ends.
enum Permit {
    /// Active/Passive: the tenure.
    Tenure(Tenure),
    /// Active/Active: the guard of the key's partition.
    Partition(PartitionGuard),
    /// Active/Active: the membership alone (a write that names no object).
    Member(Ownership),
}

impl Permit {
    /// Completes when the permission has ended.
    async fn ended(&self) {
        match self {
            Permit::Tenure(tenure) => tenure_over(tenure).await,
            Permit::Partition(guard) => guard.ended().await,
            Permit::Member(ownership) => ownership.membership_ended().await,
        }
    }
}

/// Completes when the tenure is over: ended by the elector, or its self-fencing deadline passed
/// on this clock (even if the elector's task has not run since).
async fn tenure_over(tenure: &Tenure) {
    loop {
        tokio::select! {
            _ = tenure.ended() => return,
            _ = tokio::time::sleep_until(tenure.valid_until()) => if !tenure.is_valid() { return },
        }
    }
}

/// A create's body, if it is already in memory (every body kube-rs's `Api` sends), read without
/// consuming it: `None` for a stream, which cannot be read before it is sent.
fn body_bytes(body: &Body) -> Option<Bytes> {
    let mut copy = body.try_clone()?;
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match Pin::new(&mut copy).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().ok(),
        Poll::Ready(None) => Some(Bytes::new()),
        _ => None,
    }
}

type GateFuture<B> = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

/// The `tower` service of a gated client: checks each request, then sends it through the inner
/// service (the rest of the client's stack, or the client a gate wraps). Errors of the inner
/// service pass through unchanged.
///
/// Why public: it is the service of the gate as a [`tower_layer::Layer`], for clients built with
/// `kube::client::ClientBuilder::with_layer`.
#[derive(Clone)]
pub struct WriteGateService<S> {
    inner: S,
    gate: WriteGate,
}

impl<S> fmt::Debug for WriteGateService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGateService").field("gate", &self.gate).finish_non_exhaustive()
    }
}

impl<S> tower_layer::Layer<S> for WriteGate {
    type Service = WriteGateService<S>;

    fn layer(&self, inner: S) -> WriteGateService<S> {
        WriteGateService { inner, gate: self.clone() }
    }
}

impl<S, B> tower_service::Service<Request<Body>> for WriteGateService<S>
where
    S: tower_service::Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = GateFuture<B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> GateFuture<B> {
        match self.gate.admit(&request) {
            None => {
                let response = self.inner.call(request);
                Box::pin(async move { response.await.map_err(Into::into) })
            }
            Some(Err(refused)) => Box::pin(std::future::ready(Err(refused))),
            Some(Ok(admitted)) => {
                let response = self.inner.call(request);
                // Only what a cancellation needs: the gate's permission source stays behind.
                let metrics = self.gate.metrics.clone();
                Box::pin(async move {
                    // A response that is ready wins over a permission that ended at the same
                    // time: it was applied, and the caller should know.
                    let outcome = tokio::select! {
                        biased;
                        outcome = response => Some(outcome.map_err(Into::into)),
                        _ = admitted.permit.ended() => None,
                    };
                    let Admitted { permit, method, uri, key } = admitted;
                    drop(permit);
                    outcome.unwrap_or_else(|| {
                        Err(metrics.refused(method, WriteTarget::parse(uri.path()), key, RefusalReason::Cancelled))
                    })
                })
            }
        }
    }
}

/// The inner service of [`WriteGate::client`]: sends through the caller's own client. Its
/// errors stay the `kube::Error` they were (the outer client takes them back as such).
#[derive(Clone)]
struct SendThrough(Arc<kube::Client>);

impl tower_service::Service<Request<Body>> for SendThrough {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move { client.send(request).await.map_err(BoxError::from) })
    }
}

#[cfg(test)]
mod tests {
    use http::Uri;

    use super::*;

    type Parsed<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a str>, Option<&'a str>);

    /// Checks what `path` parses to: (group, resource, namespace, name, subresource), and its key.
    fn assert_parses(path: &str, expected: Parsed<'_>, key: Option<&str>) {
        let t = WriteTarget::parse(path);
        assert_eq!((t.group(), t.resource(), t.namespace(), t.name(), t.subresource()), expected, "{path}");
        assert_eq!(t.object_key().as_deref(), key, "{path}");
    }

    #[test]
    fn reads_pass_and_everything_else_is_a_write() {
        let plain = HeaderMap::new();
        for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert!(!is_write(&method, &plain), "{method}");
        }
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::CONNECT, Method::TRACE] {
            assert!(is_write(&method, &plain), "{method}");
        }
        assert!(is_write(&Method::from_bytes(b"PROPPATCH").unwrap(), &plain), "unknown methods are writes");
        let mut upgrade = HeaderMap::new();
        upgrade.insert(http::header::UPGRADE, http::HeaderValue::from_static("websocket"));
        assert!(is_write(&Method::GET, &upgrade), "exec, attach and portforward run something in a pod");
    }

    #[test]
    fn keys_of_namespaced_objects_in_the_core_and_named_groups() {
        let cm = "/api/v1/namespaces/default/configmaps/cm-1";
        assert_parses(cm, ("", Some("configmaps"), Some("default"), Some("cm-1"), None), Some("default/cm-1"));
        let lease = ("coordination.k8s.io", Some("leases"), Some("kube-system"), Some("x"), None);
        assert_parses("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x", lease, Some("kube-system/x"));
        let web = "/apis/apps/v1/namespaces/shop/deployments/web";
        assert_parses(web, ("apps", Some("deployments"), Some("shop"), Some("web"), None), Some("shop/web"));
        assert_eq!(WriteTarget::parse(web).version(), "v1");
    }

    #[test]
    fn subresources_key_as_their_object() {
        for (path, sub) in [
            ("/api/v1/namespaces/default/pods/web-0/status", "status"),
            ("/api/v1/namespaces/default/pods/web-0/eviction", "eviction"),
            ("/apis/apps/v1/namespaces/default/deployments/web-0/scale", "scale"),
            ("/api/v1/namespaces/default/pods/web-0/proxy/some/path", "proxy"),
        ] {
            let target = WriteTarget::parse(path);
            assert_eq!(target.subresource(), Some(sub), "{path}");
            assert_eq!(target.object_key().as_deref(), Some("default/web-0"), "{path}");
        }
    }

    #[test]
    fn cluster_scoped_objects_key_by_name_and_a_namespace_is_cluster_scoped() {
        let node = |sub| ("", Some("nodes"), None, Some("node-1"), sub);
        assert_parses("/api/v1/nodes/node-1", node(None), Some("node-1"));
        assert_parses("/api/v1/nodes/node-1/status", node(Some("status")), Some("node-1"));
        let view = ("rbac.authorization.k8s.io", Some("clusterroles"), None, Some("view"), None);
        assert_parses("/apis/rbac.authorization.k8s.io/v1/clusterroles/view", view, Some("view"));
        // A Namespace object, and its subresources: not "a resource named status in namespace x".
        let namespace = |sub| ("", Some("namespaces"), None, Some("x"), sub);
        assert_parses("/api/v1/namespaces/x", namespace(None), Some("x"));
        assert_parses("/api/v1/namespaces/x/status", namespace(Some("status")), Some("x"));
        assert_parses("/api/v1/namespaces/x/finalize", namespace(Some("finalize")), Some("x"));
    }

    #[test]
    fn collections_and_non_resource_paths_have_no_key() {
        let configmaps = ("", Some("configmaps"), Some("default"), None, None);
        assert_parses("/api/v1/namespaces/default/configmaps", configmaps, None);
        assert_parses("/api/v1/configmaps", ("", Some("configmaps"), None, None, None), None);
        assert_parses("/api/v1/namespaces", ("", Some("namespaces"), None, None, None), None);
        for path in ["/version", "/api", "/api/v1", "/apis/apps/v1", "/", ""] {
            let target = WriteTarget::parse(path);
            assert_eq!((target.resource(), target.object_key()), (None, None), "{path}");
        }
    }

    #[test]
    fn percent_encoded_segments_are_decoded_and_queries_are_not_part_of_the_path() {
        let uri: Uri = "/api/v1/namespaces/default/configmaps/a%2Eb?fieldManager=x".parse().unwrap();
        assert_eq!(WriteTarget::parse(uri.path()).object_key().as_deref(), Some("default/a.b"));
        assert_eq!(decode("a%zz"), "a%zz", "an invalid escape is kept");
    }

    #[test]
    fn a_creates_name_comes_from_the_body() {
        let body = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"labels":{"a":"b"},"name":"cm-1","namespace":"default"},"data":{"name":"not this"}}"#;
        assert_eq!(name_in_body(body).unwrap().as_deref(), Some("cm-1"));
        let target =
            WriteTarget::parse("/api/v1/namespaces/default/configmaps").with_body_name(name_in_body(body).unwrap());
        assert_eq!(target.object_key().as_deref(), Some("default/cm-1"));
        assert_eq!(target.to_string(), "/api/v1/namespaces/default/configmaps (name cm-1)");
        // An escaped name is decoded.
        assert_eq!(name_in_body(br#"{"metadata":{"name":"a\u002db"}}"#).unwrap().as_deref(), Some("a-b"));
        // No name: generateName, an empty name, no metadata; not JSON at all.
        assert_eq!(name_in_body(br#"{"metadata":{"generateName":"cm-"}}"#), Ok(None));
        assert_eq!(name_in_body(br#"{"metadata":{"name":""}}"#), Ok(None));
        assert_eq!(name_in_body(br#"{"spec":{}}"#), Ok(None));
        assert_eq!(name_in_body(b"\x0a\x0bk8s\x00protobuf"), Err(()), "not JSON: unreadable");
        // A name in the path wins over the body (a subresource create such as an eviction).
        let eviction = WriteTarget::parse("/api/v1/namespaces/default/pods/web-0/eviction")
            .with_body_name(name_in_body(br#"{"metadata":{"name":"other"}}"#).unwrap());
        assert_eq!(eviction.object_key().as_deref(), Some("default/web-0"));
    }

    #[test]
    fn a_refusal_is_found_in_the_clients_error_and_in_errors_that_wrap_it() {
        let refused = WriteRefused {
            method: Method::PUT,
            target: WriteTarget::parse("/api/v1/namespaces/default/configmaps/x").into_owned(),
            key: None,
            reason: RefusalReason::NotLeader,
        };
        let error = kube::Error::Service(Box::new(refused.clone()));
        assert_eq!(WriteRefused::find(&error), Some(&refused));
        #[derive(Debug, thiserror::Error)]
        #[error("reconcile failed")]
        struct Wrapper(#[source] kube::Error);
        let wrapped = Wrapper(error);
        assert_eq!(WriteRefused::find_in(&wrapped), Some(&refused));
        assert_eq!(
            refused.to_string(),
            "write gate: PUT /api/v1/namespaces/default/configmaps/x: not sent: this process does not lead"
        );
        assert_eq!(WriteRefused::find(&kube::Error::LinesCodecMaxLineLengthExceeded), None);
    }

    /// The gate's behaviour against a fake API server (no network), on tokio's paused clock.
    mod behaviour {
        use std::sync::Mutex;
        use std::time::Duration;

        use tenure::locks::memory::MemoryStore;
        use tenure::Timing;
        use tenure_group::stores::memory::MemoryGroupStore;
        use tenure_group::{Group, GroupConfig};
        use tokio::time::Instant;

        use super::*;

        /// Records every request that reaches it; answers `{}` at once, or never for writes while
        /// `hold_writes` is on (a write in flight).
        #[derive(Clone, Default)]
        struct FakeApi {
            seen: Arc<Mutex<Vec<(Method, String)>>>,
            hold_writes: Arc<std::sync::atomic::AtomicBool>,
        }

        impl FakeApi {
            fn writes(&self) -> usize {
                self.seen.lock().unwrap().iter().filter(|(m, _)| *m != Method::GET).count()
            }

            fn hold_writes(&self, hold: bool) {
                self.hold_writes.store(hold, std::sync::atomic::Ordering::SeqCst);
            }
        }

        impl tower_service::Service<Request<Body>> for FakeApi {
            type Response = Response<Body>;
            type Error = BoxError;
            type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

            fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, request: Request<Body>) -> Self::Future {
                let write = request.method() != Method::GET;
                self.seen.lock().unwrap().push((request.method().clone(), request.uri().path().to_owned()));
                let hold = write && self.hold_writes.load(std::sync::atomic::Ordering::SeqCst);
                Box::pin(async move {
                    if hold {
                        std::future::pending::<()>().await;
                    }
                    Ok(Response::new(Body::from(b"{}".to_vec())))
                })
            }
        }

        fn request(method: Method, path: &str, body: &str) -> Request<Body> {
            Request::builder().method(method).uri(path).body(Body::from(body.as_bytes().to_vec())).unwrap()
        }

        async fn send(client: &kube::Client, method: Method, path: &str, body: &str) -> Result<(), kube::Error> {
            client.send(request(method, path, body)).await.map(drop)
        }

        fn refusal(outcome: Result<(), kube::Error>) -> RefusalReason {
            let error = outcome.expect_err("the write must be refused");
            WriteRefused::find(&error).unwrap_or_else(|| panic!("not a refusal: {error}")).reason
        }

        const CM: &str = "/api/v1/namespaces/default/configmaps";

        /// Sends a write with `api` holding writes; returns once the write reached `api`, in flight.
        async fn in_flight(
            api: &FakeApi,
            client: &kube::Client,
            method: Method,
            path: String,
        ) -> tokio::task::JoinHandle<Result<(), kube::Error>> {
            api.hold_writes(true);
            let (client, writes) = (client.clone(), api.writes());
            let write = tokio::spawn(async move { send(&client, method, &path, "{}").await });
            while api.writes() == writes {
                tokio::task::yield_now().await;
            }
            write
        }

        /// The outcome of a write spawned in flight, failing the test if it never ends.
        async fn outcome(in_flight: tokio::task::JoinHandle<Result<(), kube::Error>>) -> Result<(), kube::Error> {
            tokio::time::timeout(Duration::from_secs(60), in_flight).await.expect("the write in flight ends").unwrap()
        }

        fn timing() -> Timing {
            Timing::new(Duration::from_secs(4), Duration::from_secs(3), Duration::from_secs(1)).unwrap()
        }

        #[tokio::test(start_paused = true)]
        async fn a_follower_sends_no_write_but_every_read() {
            let store = MemoryStore::new();
            let leader = tenure::Elector::builder("a", store.client("a")).timing(timing()).spawn().unwrap();
            leader.acquired().await.unwrap();
            let follower = tenure::Elector::builder("b", store.client("b")).timing(timing()).spawn().unwrap();
            let api = FakeApi::default();
            let gate = WriteGate::leader(&follower);
            let client = gate.client(kube::Client::new(api.clone(), "default"));
            assert_eq!(client.default_namespace(), "default");

            for (method, path) in [
                (Method::POST, CM.to_owned()),
                (Method::PUT, format!("{CM}/x")),
                (Method::PATCH, format!("{CM}/x")),
                (Method::DELETE, format!("{CM}/x")),
                (Method::DELETE, CM.to_owned()),
            ] {
                assert_eq!(refusal(send(&client, method, &path, "{}").await), RefusalReason::NotLeader);
            }
            let mut exec = request(Method::GET, "/api/v1/namespaces/default/pods/p/exec", "");
            exec.headers_mut().insert(http::header::UPGRADE, http::HeaderValue::from_static("websocket"));
            let error = client.send(exec).await.expect_err("exec is gated");
            assert_eq!(WriteRefused::find(&error).map(|r| r.reason), Some(RefusalReason::NotLeader));
            assert_eq!(api.writes(), 0, "nothing left the process");
            assert_eq!(gate.metrics().rejections_for(RefusalReason::NotLeader), 6);

            send(&client, Method::GET, &format!("{CM}/x"), "").await.expect("a get passes");
            send(&client, Method::GET, &format!("{CM}?watch=true"), "").await.expect("a watch passes");
            assert_eq!(api.seen.lock().unwrap().len(), 2);

            // The leader's gated client writes.
            let leader_client = WriteGate::leader(leader.view()).client(kube::Client::new(api.clone(), "default"));
            send(&leader_client, Method::PUT, &format!("{CM}/x"), "{}").await.expect("the leader writes");
            assert_eq!(api.writes(), 1);
        }

        #[tokio::test(start_paused = true)]
        async fn a_write_in_flight_is_cancelled_at_the_self_fencing_deadline() {
            let store = MemoryStore::new();
            let elector = tenure::Elector::builder("a", store.client("a")).timing(timing()).spawn().unwrap();
            let tenure = elector.acquired().await.unwrap();
            drop(tenure);
            let api = FakeApi::default();
            let gate = WriteGate::leader(&elector);
            let client = gate.client(kube::Client::new(api.clone(), "default"));
            send(&client, Method::POST, CM, r#"{"metadata":{"name":"x"}}"#).await.expect("written while leading");

            let in_flight = in_flight(&api, &client, Method::PUT, format!("{CM}/x")).await;
            // The lock becomes unreachable: no renew succeeds, the tenure ends at its deadline.
            let deadline = elector.valid_until().expect("leading");
            store.partition("a", true);
            let outcome = outcome(in_flight).await;
            let cancelled = Instant::now();
            assert_eq!(refusal(outcome), RefusalReason::Cancelled);
            assert!(
                cancelled >= deadline && cancelled < deadline + Duration::from_millis(5),
                "cancelled at the deadline"
            );
            assert_eq!(gate.metrics().rejections_for(RefusalReason::Cancelled), 1);
            assert_eq!(refusal(send(&client, Method::DELETE, &format!("{CM}/x"), "").await), RefusalReason::NotLeader);
            assert_eq!(api.writes(), 2, "the refused delete never left");
        }

        #[tokio::test(start_paused = true)]
        async fn a_resign_cancels_the_write_in_flight_and_is_not_held_up_by_it() {
            let store = MemoryStore::new();
            let elector = tenure::Elector::builder("a", store.client("a")).timing(timing()).spawn().unwrap();
            drop(elector.acquired().await.unwrap());
            let api = FakeApi::default();
            let gate = WriteGate::leader(elector.view());
            let client = gate.client(kube::Client::new(api.clone(), "default"));
            let in_flight = in_flight(&api, &client, Method::PATCH, format!("{CM}/x")).await;
            let started = Instant::now();
            // The elector waits for the tenure's guards (the write holds one) before it releases;
            // the write is cancelled at once, so the resign completes without waiting.
            elector.resign().await.unwrap();
            assert!(started.elapsed() < Duration::from_millis(5), "the resign waited {:?}", started.elapsed());
            assert_eq!(refusal(outcome(in_flight).await), RefusalReason::Cancelled);
        }

        #[tokio::test(start_paused = true)]
        async fn as_a_layer_the_gate_decides_alike_without_the_extra_client() {
            let store = MemoryStore::new();
            let leader = tenure::Elector::builder("a", store.client("a")).timing(timing()).spawn().unwrap();
            drop(leader.acquired().await.unwrap());
            let follower = tenure::Elector::builder("b", store.client("b")).timing(timing()).spawn().unwrap();
            let api = FakeApi::default();
            let layered =
                |gate: &WriteGate| kube::client::ClientBuilder::new(api.clone(), "default").with_layer(gate).build();
            let follower_gate = WriteGate::leader(&follower);
            let client = layered(&follower_gate);
            assert_eq!(refusal(send(&client, Method::PUT, &format!("{CM}/x"), "{}").await), RefusalReason::NotLeader);
            send(&client, Method::GET, &format!("{CM}/x"), "").await.expect("a read passes");
            send(&layered(&WriteGate::leader(&leader)), Method::PUT, &format!("{CM}/x"), "{}")
                .await
                .expect("the leader writes");
            assert_eq!(
                api.seen.lock().unwrap().clone(),
                [(Method::GET, format!("{CM}/x")), (Method::PUT, format!("{CM}/x"))]
            );
            assert_eq!(follower_gate.metrics().rejections_for(RefusalReason::NotLeader), 1);
        }

        const PARTITIONS: u32 = 8;

        fn join(store: &MemoryGroupStore, identity: &str) -> Group {
            Group::builder(identity, store.client(identity))
                .config(GroupConfig { timing: timing(), partition_count: PARTITIONS, weight: 1 })
                .join()
                .unwrap()
        }

        /// Names of ConfigMaps in `default` that `group` owns (or not), by the object key.
        fn names(group: &Group, owned: bool, count: usize) -> Vec<String> {
            (0..1000)
                .map(|i| format!("cm-{i}"))
                .filter(|n| group.belongs_to_self(&object_key(Some("default"), n)).is_some() == owned)
                .take(count)
                .collect()
        }

        async fn settled(a: &Group, b: &Group) {
            let half = PARTITIONS as usize / 2;
            while a.assignment().borrow().owned.len() != half || b.assignment().borrow().owned.len() != half {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }

        #[tokio::test(start_paused = true)]
        async fn a_member_writes_only_the_objects_whose_partition_it_owns() {
            let store = MemoryGroupStore::new();
            let (a, b) = (join(&store, "a"), join(&store, "b"));
            settled(&a, &b).await;
            let api = FakeApi::default();
            let gate = WriteGate::owner(a.ownership());
            let client = gate.client(kube::Client::new(api.clone(), "default"));
            let (mine, theirs) = (names(&a, true, 3), names(&a, false, 3));

            for name in &theirs {
                for method in [Method::PUT, Method::PATCH, Method::DELETE] {
                    assert_eq!(
                        refusal(send(&client, method, &format!("{CM}/{name}"), "{}").await),
                        RefusalReason::NotOwner
                    );
                }
                let status = format!("{CM}/{name}/status");
                assert_eq!(refusal(send(&client, Method::PUT, &status, "{}").await), RefusalReason::NotOwner);
                let create = format!(r#"{{"metadata":{{"name":"{name}"}}}}"#);
                let error = client.send(request(Method::POST, CM, &create)).await.expect_err("refused");
                let refused = WriteRefused::find(&error).unwrap();
                assert_eq!(
                    (refused.reason, refused.key.clone()),
                    (RefusalReason::NotOwner, Some(format!("default/{name}")))
                );
            }
            // A collection delete may touch every partition; a create whose name cannot be read
            // may be anyone's.
            assert_eq!(refusal(send(&client, Method::DELETE, CM, "").await), RefusalReason::NotOwner);
            assert_eq!(refusal(send(&client, Method::POST, CM, "name: cm-0").await), RefusalReason::NotOwner);
            assert_eq!(api.writes(), 0, "nothing left the process");
            assert_eq!(gate.metrics().rejections_for(RefusalReason::NotOwner), 3 * 5 + 2);

            for name in &mine {
                send(&client, Method::PUT, &format!("{CM}/{name}"), "{}").await.expect("owned");
                let create = format!(r#"{{"metadata":{{"name":"{name}"}}}}"#);
                send(&client, Method::POST, CM, &create).await.expect("owned");
            }
            // A create without a name is new: allowed while a member. The body arrives unchanged.
            send(&client, Method::POST, CM, r#"{"metadata":{"generateName":"cm-"}}"#).await.expect("a member");
            assert_eq!(api.writes(), 3 * 2 + 1);
            // Reads of anything pass.
            send(&client, Method::GET, &format!("{CM}/{}", theirs[0]), "").await.unwrap();
        }

        #[tokio::test(start_paused = true)]
        async fn a_key_function_keys_related_objects_by_their_parent() {
            let store = MemoryGroupStore::new();
            let (a, b) = (join(&store, "a"), join(&store, "b"));
            settled(&a, &b).await;
            let api = FakeApi::default();
            let gate = WriteGate::owner_keyed(a.ownership(), |target| {
                let name = target.name()?;
                name.strip_suffix("-config").map(|parent| object_key(target.namespace(), parent))
            });
            let client = gate.client(kube::Client::new(api.clone(), "default"));
            let (mine, theirs) = (&names(&a, true, 1)[0], &names(&a, false, 1)[0]);
            send(&client, Method::PUT, &format!("{CM}/{mine}-config"), "{}").await.expect("the parent is a's");
            let refused = refusal(send(&client, Method::PUT, &format!("{CM}/{theirs}-config"), "{}").await);
            assert_eq!(refused, RefusalReason::NotOwner);
            // Not keyed by the function: allowed while a member, a collection delete included.
            send(&client, Method::DELETE, CM, "").await.expect("unkeyed");
            assert_eq!(api.writes(), 2);
        }

        #[tokio::test(start_paused = true)]
        async fn a_member_cut_off_from_its_store_cancels_its_write_in_flight_and_then_sends_nothing() {
            let store = MemoryGroupStore::new();
            let (a, b) = (join(&store, "a"), join(&store, "b"));
            settled(&a, &b).await;
            let api = FakeApi::default();
            let gate = WriteGate::owner(a.ownership());
            let client = gate.client(kube::Client::new(api.clone(), "default"));
            let mine = names(&a, true, 1).remove(0);
            let in_flight = in_flight(&api, &client, Method::PUT, format!("{CM}/{mine}")).await;
            store.set_unreachable("a", true);
            let cut = Instant::now();
            assert_eq!(refusal(outcome(in_flight).await), RefusalReason::Cancelled);
            assert!(cut.elapsed() <= timing().renew_deadline, "cancelled by the membership deadline");
            assert_eq!(
                refusal(send(&client, Method::PUT, &format!("{CM}/{mine}"), "{}").await),
                RefusalReason::NotOwner
            );
            let generated = r#"{"metadata":{"generateName":"cm-"}}"#;
            assert_eq!(refusal(send(&client, Method::POST, CM, generated).await), RefusalReason::NotMember);
            assert_eq!(api.writes(), 1);
            assert_eq!(gate.metrics().rejections_for(RefusalReason::Cancelled), 1);
        }

        #[test]
        fn the_rejection_counter_is_exported_with_every_reason() {
            let mut registry = Registry::default();
            let metrics = WriteGateMetrics::register(&mut registry);
            metrics.count(RefusalReason::NotLeader);
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            assert!(text.contains(r#"tenure_write_gate_rejections_total{reason="not_leader"} 1"#), "{text}");
            for reason in ["not_owner", "not_member", "cancelled"] {
                assert!(
                    text.contains(&format!(r#"tenure_write_gate_rejections_total{{reason="{reason}"}} 0"#)),
                    "{text}"
                );
            }
        }
    }
}
