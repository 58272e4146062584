//! Record locks that need no server.

/// The embedded default for processes on one host: a JSON file updated by atomic rename under
/// an `flock`, watched with inotify.
pub mod file;
pub mod memory;
