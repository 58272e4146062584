//! Record locks that need no server.

/// The embedded default for processes on one host: a JSON file updated by atomic rename after an
/// exclusive claim per generation (no lock a stopped process could hold), watched with inotify.
pub mod file;
pub mod memory;
