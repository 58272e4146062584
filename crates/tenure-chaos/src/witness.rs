//! The command that `tenure run` candidates run: it writes its own start, alive and stop lines,
//! stamped with `CLOCK_MONOTONIC` and `TENURE_TERM`, through a fencing check.
//!
//! Why the command writes them itself: the harness cannot see when a process runs, only what it
//! does; two commands that both write at the same time are what a user would suffer. The fence
//! (a file with the highest term written, updated under `flock`) is the mitigation the
//! documentation recommends: a write with a term below the highest one is refused and marked
//! `fenced`, so the lines show both whether commands overlapped and whether the term stopped the
//! stale one's writes.

use std::path::Path;

use crate::history::{parse_witness_line, WitnessLine};
use crate::ChaosError;

/// Interval between two `alive` lines: the witness's measurement error.
pub const ALIVE_PERIOD_MS: u64 = 20;

/// The witness program (Python 3, standard library only).
pub const SCRIPT: &str = r#"
import fcntl, os, signal, sys, time
out, fence, me = sys.argv[1], sys.argv[2], sys.argv[3]
term = int(os.environ["TENURE_TERM"])
period = int(sys.argv[4]) / 1000.0

def write(kind):
    with open(fence, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        top = int(text) if text else 0
        ok = term >= top
        if term > top:
            f.seek(0)
            f.truncate()
            f.write(str(term))
            f.flush()
        stamp = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        with open(out, "a") as w:
            w.write("%d %s %d %s %s\n" % (stamp, me, term, kind, "ok" if ok else "fenced"))

def stop(signum, frame):
    write("stop")
    sys.exit(0)

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

/// Reads the witness lines written so far (a line cut by a crash mid-write is skipped).
pub fn read(path: &Path) -> Result<Vec<WitnessLine>, ChaosError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ChaosError::Io(format!("{}: {e}", path.display()))),
    };
    Ok(text
        .lines()
        .filter(|l| l.ends_with(" ok") || l.ends_with(" fenced"))
        .filter_map(|l| parse_witness_line(l).ok())
        .collect())
}
