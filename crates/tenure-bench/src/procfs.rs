//! Readings of `/proc`: CPU time and resident memory of a process.
//!
//! Why `/proc` and not a crate: the numbers the goals are stated in (CPU % of one core, VmRSS,
//! VmHWM) are exactly what the kernel reports there, for this process or a child alike.

use std::io;
use std::time::Duration;

/// Which process to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The calling process (`/proc/self`).
    This,
    /// Another process (`/proc/<pid>`), typically a child.
    Pid(u32),
}

impl Target {
    pub(crate) fn dir(self) -> String {
        match self {
            Target::This => "/proc/self".to_owned(),
            Target::Pid(pid) => format!("/proc/{pid}"),
        }
    }
}

/// User plus system CPU time the process has used so far (all its threads).
pub fn cpu_time(target: Target) -> io::Result<Duration> {
    let stat = std::fs::read_to_string(format!("{}/stat", target.dir()))?;
    let ticks = parse_stat_cpu_ticks(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("unexpected /proc stat line: {stat}")))?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = if per_second > 0 { per_second as f64 } else { 100.0 };
    Ok(Duration::from_secs_f64(ticks as f64 / per_second))
}

/// CPU time of the threads the process has now, in nanoseconds (the sum of the first field of
/// `/proc/<pid>/task/*/schedstat`).
///
/// Why besides [`cpu_time`]: an idle `tenure elect` uses less than one 10 ms clock tick in
/// seconds, which `utime + stime` cannot show. Threads that exited meanwhile are not counted, so
/// only compare readings taken while the process keeps its threads (an idle one does).
pub fn cpu_time_of_threads(target: Target) -> io::Result<Duration> {
    let mut total = 0u64;
    for entry in std::fs::read_dir(format!("{}/task", target.dir()))? {
        let path = entry?.path().join("schedstat");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            // The thread ended between listing and reading.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error),
        };
        let nanos = text.split_whitespace().next().and_then(|n| n.parse::<u64>().ok());
        total += nanos
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("unexpected {}", path.display())))?;
    }
    Ok(Duration::from_nanos(total))
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line, in clock ticks.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain spaces and parentheses.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11); // field 3 (state) is index 0
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Resident memory of a process, in KiB, as `/proc/<pid>/status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss_kib: u64,
    /// `VmHWM`: the peak of `VmRSS` so far.
    pub hwm_kib: u64,
    /// `RssAnon`: resident memory that is the process's own (heap, stacks), not shared file pages.
    pub anon_kib: u64,
}

impl Memory {
    /// `VmRSS` in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    /// `VmHWM` in MiB.
    pub fn hwm_mib(&self) -> f64 {
        self.hwm_kib as f64 / 1024.0
    }

    /// `RssAnon` in MiB.
    pub fn anon_mib(&self) -> f64 {
        self.anon_kib as f64 / 1024.0
    }
}

/// Reads the resident memory of a process.
pub fn memory(target: Target) -> io::Result<Memory> {
    let status = std::fs::read_to_string(format!("{}/status", target.dir()))?;
    parse_status_memory(&status)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no VmRSS/VmHWM in /proc status (a zombie?)"))
}

fn parse_status_memory(status: &str) -> Option<Memory> {
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()
    };
    Some(Memory { rss_kib: field("VmRSS:")?, hwm_kib: field("VmHWM:")?, anon_kib: field("RssAnon:").unwrap_or(0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_skip_a_name_with_spaces_and_parentheses() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 37 5 0 0 20 0 3 0 100 1000 200";
        assert_eq!(parse_stat_cpu_ticks(line), Some(42));
    }

    #[test]
    fn memory_fields_in_kib() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 512 kB\n";
        assert_eq!(parse_status_memory(status), Some(Memory { rss_kib: 1024, hwm_kib: 2048, anon_kib: 512 }));
        assert_eq!(parse_status_memory("Name:\tx\nState:\tZ (zombie)\n"), None);
    }

    #[test]
    fn this_process_reads() {
        assert!(memory(Target::This).expect("status").rss_kib > 0);
        cpu_time(Target::This).expect("stat");
        let before = cpu_time_of_threads(Target::This).expect("schedstat");
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(cpu_time_of_threads(Target::This).expect("schedstat") > before, "{x}");
    }
}
