//! Exit statuses shared by all subcommands. `run` also passes on its command's status.

/// Done as asked.
pub const SUCCESS: u8 = 0;
/// Something failed at run time: the store is unreachable, a port is taken.
pub const FAILURE: u8 = 1;
/// The command line was wrong; nothing was started.
pub const USAGE: u8 = 2;
/// `tenure write` was refused by the lock: the tenure of its term is over.
pub const DEPOSED: u8 = 3;
/// `tenure run` lost leadership and killed its command (BSD `EX_TEMPFAIL`: trying again
/// later may succeed).
pub const LOST_LEADERSHIP: u8 = 75;
/// `tenure run --timeout` passed before this instance led; the command never ran (as
/// `timeout(1)` reports it).
pub const TIMED_OUT: u8 = 124;
/// `tenure run` found its command but could not execute it (as shells report it).
pub const CANNOT_EXECUTE: u8 = 126;
/// `tenure run` could not find its command (as shells report it).
pub const NOT_FOUND: u8 = 127;
