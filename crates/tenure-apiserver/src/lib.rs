//! An in-memory Kubernetes API server for tests, benchmarks and local development.
//!
//! Why it exists: there is no kube-apiserver (nor Docker to run one) where Tenure is built and
//! tested, and leader election on Kubernetes cannot be tested honestly without one. This server
//! speaks the real REST protocol for the resources leader election and controllers use (Leases,
//! Endpoints, ConfigMaps, Pods, Services, Events, Namespaces, plus what the deploy manifests need),
//! with the semantics that matter for correctness: one `resourceVersion` sequence, `409` on stale
//! writes and duplicate creates, watches that resume from a version and answer `410 Expired` once it
//! is too old, `Status` errors worded as the real server words them, and discovery good enough for
//! kubectl. On top, [`Faults`] counts requests per client and verb and injects latency, errors and
//! partitions. The coordinator of Coordinated Leader Election runs inside it (see [`coordinator`]),
//! so that clients of LeaseCandidates can be tested too.
//!
//! What it is not: there is no authentication, authorization, admission, protobuf, server-side
//! apply field management, pagination (`limit` is ignored) or garbage collection. It listens on
//! loopback by default.

#![warn(missing_docs)]

pub mod coordinator;
pub mod discovery;
pub mod election;
pub mod errors;
pub mod faults;
pub mod kubeconfig;
pub mod metadata_only;
pub mod patch;
pub mod resources;
pub mod routes;
pub mod selectors;
pub mod server;
pub mod store;
pub mod table;
pub mod validation;
pub mod watch;

pub use coordinator::{CoordinatorConfig, CoordinatorMetrics};
pub use errors::ApiError;
pub use faults::{FaultScope, Faults, InjectedFault, Verb, CLIENT_HEADER};
pub use server::{ApiServer, ApiServerConfig};
pub use store::Store;
