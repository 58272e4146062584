//! Exponential back-off with a cap, for restarting leader work that keeps failing: the core's
//! [`tenure::Backoff`], the one back-off of the project, re-exported where the HA runtime's users
//! have always found it.

pub use tenure::Backoff;
