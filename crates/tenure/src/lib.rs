//! # Tenure: leader election for replicated services
//!
//! Run several replicas of a service and let exactly one of them lead, with a clean handover when
//! it dies or steps down. This crate is the core: the client-go algorithm as a sans-IO decision
//! core ([`Candidate`]) under a thin async driver ([`Elector`]), the shared leadership types every
//! backend publishes ([`Leadership`], [`Tenure`], [`Term`]), and the record locks that need no
//! server: [`locks::file`] (the embedded default) and [`locks::memory`] (tests and simulation).
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use tenure::{locks::file::FileLock, Elector};
//! let lock = FileLock::open("/run/user/1000/tenure/my-service")?;
//! let elector = Elector::builder("replica-a", lock).spawn()?;
//! let tenure = elector.acquired().await?;          // waits until this replica leads
//! // ... leader work, calling tenure.check()? before each side effect ...
//! drop(tenure);
//! elector.shutdown().await?;                        // releases the lock: instant handover
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod candidate;
pub mod clock;
pub mod elector;
pub mod leadership;
pub mod lock;
pub mod locks;
pub mod record;
pub mod redact;
pub mod term;
pub mod timing;

pub use candidate::{Action, AfterRelease, Candidate, Event, StopReason};
pub use clock::MonotonicTime;
pub use elector::{Elector, ElectorBuilder, ElectorCommand, ElectorError};
pub use leadership::{ElectorStats, Leadership, NotLeader, Publisher, Role, Subscriber, Tenure};
pub use lock::{ChangeStream, LockError, RecordLock, StoredRecord, Version};
pub use record::{LeaderElectionRecord, RecordError, LEADER_ANNOTATION};
pub use redact::redact_credentials;
pub use term::Term;
pub use timing::{Timing, TimingError};
