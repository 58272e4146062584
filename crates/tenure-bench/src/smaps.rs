//! Where the resident memory of a process is: its mappings (`/proc/<pid>/smaps`) sorted into the
//! executable's pages, shared libraries, the heap, allocator arenas, thread stacks and the rest.
//!
//! Why: `VmRSS` alone does not say what to shrink. An idle `tenure elect` holds mostly pages of
//! its own binary (code touched once at start-up, mapped 64 KiB at a time by the kernel's
//! fault-around), a little heap, and a few thread stacks; each needs a different remedy, so the
//! idle_rss benchmark prints this breakdown for every process it measures.

use std::io;
use std::ops::Range;

use crate::procfs::Target;

/// Resident memory of a process by kind, in KiB; the kinds add up to the `Rss` of all its
/// mappings (which `VmRSS` reports, give or take pages mapped between the two readings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Breakdown {
    /// Clean pages of the executable file (code, read-only data, relocation tables): shared with
    /// every process running the same binary and dropped first under memory pressure.
    pub binary_file_kib: u64,
    /// Pages of the executable's mappings that became the process's own: data relocated at
    /// start-up (`.data.rel.ro`, made read-only afterwards) and written statics (`.data`).
    pub binary_private_kib: u64,
    /// Shared libraries (libc, the dynamic loader, libgcc_s): none in a static binary.
    pub libraries_kib: u64,
    /// `[heap]`: what `brk` gave the allocator (glibc's main arena).
    pub heap_kib: u64,
    /// glibc's other malloc arenas: 64 MiB reservations, one per thread that allocated while the
    /// others were busy (at most 8 per core).
    pub arenas_kib: u64,
    /// How many such arenas the process has.
    pub arenas: u32,
    /// The stacks of all threads, main thread included (pages touched, not the reservation).
    pub stacks_kib: u64,
    /// How many threads the process has.
    pub threads: u32,
    /// Other anonymous memory: large allocations mapped on their own, thread-local storage,
    /// `.bss`, stacks of threads that were running when read (their stack pointer is unknown).
    pub other_anon_kib: u64,
    /// Pages the kernel maps into every process (`[vdso]`, `[vvar]`).
    pub kernel_kib: u64,
}

impl Breakdown {
    /// The sum of all kinds.
    pub fn total_kib(&self) -> u64 {
        self.binary_file_kib + self.binary_private_kib + self.libraries_kib + self.heap_kib + self.arenas_kib
            + self.stacks_kib + self.other_anon_kib + self.kernel_kib
    }
}

/// One mapping of `/proc/<pid>/smaps`, with the fields the breakdown needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    addresses: Range<u64>,
    permissions: String,
    /// The file or pseudo-file name (`[heap]`), empty for anonymous memory.
    path: String,
    rss_kib: u64,
    anonymous_kib: u64,
}

/// The size of a glibc arena's reservation (`HEAP_MAX_SIZE` on 64-bit systems): each one starts
/// at a multiple of it, which is how its mappings are told apart from other anonymous memory.
const ARENA_RESERVATION: u64 = 64 << 20;

/// Reads the breakdown of a process.
pub fn breakdown(target: Target) -> io::Result<Breakdown> {
    let dir = target.dir();
    let smaps = std::fs::read_to_string(format!("{dir}/smaps"))?;
    let executable = std::fs::read_link(format!("{dir}/exe"))?;
    let mut stack_pointers = Vec::new();
    let mut threads = 0;
    for entry in std::fs::read_dir(format!("{dir}/task"))? {
        threads += 1;
        // A thread's stack pointer, if it is blocked (an idle one is); unreadable or running:
        // its stack counts as other anonymous memory.
        let syscall = std::fs::read_to_string(entry?.path().join("syscall")).unwrap_or_default();
        stack_pointers.extend(stack_pointer(&syscall));
    }
    let mappings = parse(&smaps).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unexpected smaps"))?;
    let mut breakdown = classify(&mappings, &executable.to_string_lossy(), &stack_pointers);
    breakdown.threads = threads;
    Ok(breakdown)
}

/// The stack pointer in a `/proc/<pid>/task/<tid>/syscall` line (`nr args... sp pc` for a thread
/// blocked in a system call, `-1 sp pc` for one blocked otherwise, `running` for one running).
fn stack_pointer(syscall: &str) -> Option<u64> {
    let fields: Vec<&str> = syscall.split_whitespace().collect();
    if fields.len() < 3 {
        return None;
    }
    u64::from_str_radix(fields[fields.len() - 2].trim_start_matches("0x"), 16).ok()
}

fn parse(smaps: &str) -> Option<Vec<Mapping>> {
    let mut mappings: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next()?;
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16)) {
                let permissions = fields.next()?.to_owned();
                // offset, device, inode, then the name (which may contain spaces: " (deleted)").
                let path = line.splitn(6, char::is_whitespace).nth(5).unwrap_or("").trim().to_owned();
                mappings.push(Mapping { addresses: start..end, permissions, path, rss_kib: 0, anonymous_kib: 0 });
                continue;
            }
        }
        let value = || fields.clone().next().and_then(|v| v.parse::<u64>().ok());
        match (first, mappings.last_mut()) {
            ("Rss:", Some(mapping)) => mapping.rss_kib = value()?,
            ("Anonymous:", Some(mapping)) => mapping.anonymous_kib = value()?,
            _ => {}
        }
    }
    Some(mappings)
}

fn classify(mappings: &[Mapping], executable: &str, stack_pointers: &[u64]) -> Breakdown {
    let mut breakdown = Breakdown::default();
    for (index, mapping) in mappings.iter().enumerate() {
        let path = mapping.path.as_str();
        if path == executable {
            breakdown.binary_private_kib += mapping.anonymous_kib;
            breakdown.binary_file_kib += mapping.rss_kib - mapping.anonymous_kib.min(mapping.rss_kib);
        } else if path == "[heap]" {
            breakdown.heap_kib += mapping.rss_kib;
        } else if path == "[stack]" || stack_pointers.iter().any(|sp| mapping.addresses.contains(sp)) {
            breakdown.stacks_kib += mapping.rss_kib;
        } else if path.starts_with('/') {
            breakdown.libraries_kib += mapping.rss_kib;
        } else if path.starts_with('[') {
            breakdown.kernel_kib += mapping.rss_kib;
        } else if is_arena(mapping, mappings.get(index + 1)) {
            breakdown.arenas += 1;
            breakdown.arenas_kib += mapping.rss_kib;
        } else {
            breakdown.other_anon_kib += mapping.rss_kib;
        }
    }
    breakdown
}

/// A glibc arena: anonymous, read-write, aligned to its reservation, and either the whole
/// reservation or followed by the inaccessible rest of it.
fn is_arena(mapping: &Mapping, next: Option<&Mapping>) -> bool {
    let Range { start, end } = mapping.addresses;
    if !mapping.path.is_empty() || !mapping.permissions.starts_with("rw") || start % ARENA_RESERVATION != 0 {
        return false;
    }
    end - start == ARENA_RESERVATION
        || next.is_some_and(|rest| {
            rest.addresses.start == end
                && rest.addresses.end == start + ARENA_RESERVATION
                && rest.permissions.starts_with("---")
                && rest.path.is_empty()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An abridged smaps of an idle `tenure elect` (glibc): the executable's text, its RELRO
    /// segment, the heap, a glibc arena, a thread stack, libc, the main stack and the vdso.
    const SMAPS: &str = "\
5599a8a05000-5599a902b000 r-xp 0027a000 fe:00 123 /opt/bin/tenure (deleted)
Size:               6296 kB
Rss:                5592 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
5599a902b000-5599a9086000 r--p 008a0000 fe:00 123 /opt/bin/tenure (deleted)
Rss:                 364 kB
Anonymous:           364 kB
5599bb0e5000-5599bb181000 rw-p 00000000 00:00 0                          [heap]
Rss:                 548 kB
Anonymous:           548 kB
7f0348000000-7f0348021000 rw-p 00000000 00:00 0
Rss:                   4 kB
Anonymous:             4 kB
7f0348021000-7f034c000000 ---p 00000000 00:00 0
Rss:                   0 kB
Anonymous:             0 kB
7f034f0b2000-7f034f0b3000 ---p 00000000 00:00 0
Rss:                   0 kB
Anonymous:             0 kB
7f034f0b3000-7f034f2b3000 rw-p 00000000 00:00 0
Rss:                   8 kB
Anonymous:             8 kB
7f034f2b3000-7f034f2d7000 rw-p 00000000 00:00 0
Rss:                 136 kB
Anonymous:           136 kB
7f034f2fd000-7f034f453000 r-xp 00026000 fe:00 77 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1036 kB
Anonymous:             0 kB
7f034f4ea000-7f034f4ec000 r-xp 00000000 00:00 0                          [vdso]
Rss:                   4 kB
Anonymous:             0 kB
7ffd65d83000-7ffd65da4000 rw-p 00000000 00:00 0                          [stack]
Rss:                 116 kB
Anonymous:           116 kB
";

    #[test]
    fn every_kind_of_mapping_lands_in_its_own_sum() {
        let mappings = parse(SMAPS).expect("parses");
        let thread_sp = 0x7f03_4f2b_1948;
        let breakdown = classify(&mappings, "/opt/bin/tenure (deleted)", &[0x7ffd_65d9_9490, thread_sp]);
        assert_eq!(
            breakdown,
            Breakdown {
                binary_file_kib: 5592,
                binary_private_kib: 364,
                libraries_kib: 1036,
                heap_kib: 548,
                arenas_kib: 4,
                arenas: 1,
                stacks_kib: 116 + 8,
                threads: 0,
                other_anon_kib: 136,
                kernel_kib: 4,
            }
        );
        assert_eq!(breakdown.total_kib(), mappings.iter().map(|m| m.rss_kib).sum::<u64>());
    }

    #[test]
    fn stack_pointers_come_from_blocked_threads_only() {
        let blocked = "202 0x7f0 0x80 0x0 0x0 0x0 0x0 0x7f034f2b1948 0x7f034f3d8829\n";
        assert_eq!(stack_pointer(blocked), Some(0x7f03_4f2b_1948));
        assert_eq!(stack_pointer("-1 0x7ffd65d99490 0x7f034f3dff36\n"), Some(0x7ffd_65d9_9490));
        assert_eq!(stack_pointer("running\n"), None);
        assert_eq!(stack_pointer(""), None);
    }

    #[test]
    fn this_process_adds_up() {
        let breakdown = breakdown(Target::This).expect("smaps of this process");
        assert!(breakdown.binary_file_kib > 0, "{breakdown:?}");
        assert!(breakdown.threads >= 1, "{breakdown:?}");
        assert!(breakdown.stacks_kib > 0, "{breakdown:?}");
    }
}
