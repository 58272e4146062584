//! The command that `tenure run` candidates run: it writes its own start, alive and stop lines,
//! stamped with `CLOCK_MONOTONIC` and `TENURE_TERM`, to one log; the log's order is a term
//! fence.
//!
//! Why the command writes them itself: the harness cannot see when a process runs, only what it
//! does; two commands that both write at the same time are what a user would suffer. The fence is
//! the mitigation the documentation recommends, as a store that checks the term would apply it:
//! a line whose term is below a term already in the log is `fenced` (refused), so the lines show
//! both whether commands overlapped and whether the term stopped the stale one's writes.
//!
//! Why the log's order and not a check under a lock: each line is one append (`O_APPEND`, one
//! `write`), so the command holds nothing between two writes. A fence file updated under `flock`
//! would be held for a moment at every write, and a command frozen in that moment (the `sigstop`
//! fault) would block every other command's writes, the new leader's `start` included, until it
//! thawed.

use std::path::Path;

use crate::history::{parse_witness_line, WitnessLine};
use crate::ChaosError;

/// Interval between two `alive` lines: the witness's measurement error.
pub const ALIVE_PERIOD_MS: u64 = 20;

/// `tenure run --grace`, as a share of the TTL: just under TTL/4, the longest every backend
/// accepts (3/4 of lease - renew deadline, which is TTL/3 on etcd and ZooKeeper, rounded down).
pub const GRACE_SHARE_OF_TTL: f64 = 0.24;

/// How much of its grace period the witness uses after SIGTERM: it goes on writing `alive`
/// lines for this share of the grace ([`GRACE_SHARE_OF_TTL`]) (432 ms of 480 ms at TTL 2 s), then writes `stop` and exits,
/// as a command that finishes its work before it stops. A lock released before the command is
/// over shows as two commands alive at once.
pub const GRACE_USED: f64 = 0.9;

/// The witness program (Python 3, standard library only). Arguments: the log, the candidate's
/// identity, the period in milliseconds, how long it goes on after SIGTERM in milliseconds.
pub const SCRIPT: &str = r#"
import os, signal, sys, time
out, me, period = sys.argv[1], sys.argv[2], int(sys.argv[3]) / 1000.0
linger = int(sys.argv[4]) / 1000.0
term = int(os.environ["TENURE_TERM"])
log = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

def write(kind):
    stamp = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    os.write(log, ("%d %s %d %s\n" % (stamp, me, term, kind)).encode())

def stop(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    until = time.monotonic() + linger
    while time.monotonic() < until:
        time.sleep(min(period, max(0.0, until - time.monotonic())))
        write("alive")
    write("stop")
    os._exit(0)

signal.signal(signal.SIGTERM, stop)
write("start")
while True:
    time.sleep(period)
    write("alive")
"#;

/// Writes the witness program into `dir`; returns its path.
pub fn install(dir: &Path) -> Result<std::path::PathBuf, ChaosError> {
    let path = dir.join("witness.py");
    std::fs::write(&path, SCRIPT).map_err(|e| ChaosError::Io(format!("{}: {e}", path.display())))?;
    Ok(path)
}

/// Reads the witness lines written so far, in the order they were appended, each marked
/// accepted or fenced (its term below one appended before it). A line cut by a crash mid-write
/// is skipped.
pub fn read(path: &Path) -> Result<Vec<WitnessLine>, ChaosError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ChaosError::Io(format!("{}: {e}", path.display()))),
    };
    let mut highest = 0;
    let mut lines = Vec::new();
    for line in text.split_inclusive('\n').filter_map(|l| l.strip_suffix('\n')) {
        let Ok(mut line) = parse_witness_line(line) else { continue };
        line.accepted = line.term >= highest;
        highest = highest.max(line.term);
        lines.push(line);
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_appended_after_a_higher_term_is_fenced_whatever_its_stamp() {
        let path = std::env::temp_dir().join(format!("tenure-chaos-witness-{}.log", std::process::id()));
        // The last line was stamped before c2 started but appended after it (frozen in between).
        std::fs::write(&path, "100 c1 1 start\n300 c2 2 start\n200 c1 1 alive\n400 c2 2 alive\n500 c1 1 al").unwrap();
        let lines = read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let seen: Vec<(&str, u64, bool)> = lines.iter().map(|l| (l.candidate.as_str(), l.term, l.accepted)).collect();
        assert_eq!(seen, [("c1", 1, true), ("c2", 2, true), ("c1", 1, false), ("c2", 2, true)]);
    }
}
