//! Record locks that need no server.

pub mod memory;
