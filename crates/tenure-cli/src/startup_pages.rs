//! Gives back the pages of tenure's own binary that only start-up needed.
//!
//! Why: an idle `tenure elect` is mostly pages of its executable. Start-up runs code that never
//! runs again (argument parsing, reading the kubeconfig, building the Kubernetes client and its
//! TLS configuration, binding the HTTP server), and the kernel maps code 64 KiB at a time around
//! every page touched (fault-around), so after start-up nearly the whole binary is resident in a
//! sidecar that runs in every replica of a service. Once the election is under way, the
//! binary's clean read-only mappings are dropped from the process (`madvise(MADV_DONTNEED)`):
//! the file's pages stay in the page cache, and what the steady state runs (renews, watches, HTTP
//! answers) is mapped back on its next use, at the cost of a minor page fault.
//!
//! Only mappings that hold nothing but the file's own bytes are dropped: read-only ones without
//! a single private page (the relocated `.data.rel.ro`, once made read-only, holds private pages
//! and is kept; dropping it would bring back the unrelocated bytes). Besides the executable, the
//! same is done for the shared libraries that were already mapped when `main` began (the C
//! library and the dynamic loader of a glibc build, 1.6 MB of an idle sidecar), as the loader
//! listed them (`dl_iterate_phdr`) then: it never unloads the objects a program starts with, so
//! their addresses cannot change under the `madvise`. Libraries loaded later (`dlopen`, such as
//! the name service modules glibc loads for a host name lookup) and files mapped by anything else
//! are left alone, as one could be unmapped, and its addresses reused, while this runs. A static
//! binary (the container image's) has the C library inside the executable.
//!
//! What comes back is only what the steady state runs, page by page (issue 31): on a fault the
//! kernel maps not one page but every page of the file already in the page cache within 64 KiB
//! (fault-around), and on a fault of code not in the page cache it reads ahead up to the
//! device's `read_ahead_kb` (8 MB on the machine issue 31 was measured on; since Linux 6.16 a
//! code fault reads ahead even under `MADV_RANDOM`), so the few hundred functions a renew, a
//! watch and an HTTP answer run, scattered over the binary's 14 MB of code, brought back 4-5 MB.
//! Both are bounded by the mapping (VMA) faulted in, so once dropped, the code mappings (the
//! executable's and the libraries') are cut into one-page mappings whose advice alternates
//! (`MADV_RANDOM`, `MADV_NORMAL`) so that the kernel cannot merge them again: a fault then reads
//! and maps that one page. The price is kernel memory, not resident memory: one VMA (some 200
//! bytes of slab) per page of code, about 3,500 for the executable. The executable's read-only
//! data is marked `MADV_RANDOM` (for data that stops read-ahead) and the
//! executable's pages that no process maps any more are evicted from the page cache
//! (`POSIX_FADV_DONTNEED`): fault-around finds only the pages some process uses, and the idle
//! executable holds about the pages it runs. This needs no list of functions, so nothing decays
//! with a new toolchain, lock file or code change (the symbol-ordering list it replaces did). The
//! price: the steady state's first pass reads its pages from the file one at a time (a few
//! hundred reads, once), and code that runs rarely, such as taking over after the leader died,
//! reads its pages then unless another process has them in the page cache. Another process of
//! the same binary keeps the pages it maps: a page mapped anywhere is never evicted.

use std::collections::BTreeSet;
use std::ffi::{c_int, c_void, CStr, OsStr};
use std::io;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The shared objects the dynamic loader had loaded when [`remember_loaded_files`] ran.
static LOADED_AT_START: OnceLock<BTreeSet<String>> = OnceLock::new();

/// Notes which shared libraries (and the dynamic loader) this process started with, so that
/// [`release`] may drop their clean pages later. Call it first thing in `main`, before any code
/// could load a library; later calls change nothing. Without it, only the executable's pages
/// are dropped.
pub fn remember_loaded_files() {
    LOADED_AT_START.get_or_init(loaded_objects);
}

/// The files of the shared objects the dynamic loader has loaded, as `/proc/self/maps` names them
/// (canonical paths; the loader may name them through symbolic links such as `/lib64`).
fn loaded_objects() -> BTreeSet<String> {
    unsafe extern "C" fn collect(info: *mut libc::dl_phdr_info, _size: usize, names: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid `info` for the duration of the call, and `names` is
        // the `Vec` given to `dl_iterate_phdr` below, borrowed by nothing else meanwhile.
        let (info, names) = unsafe { (&*info, &mut *names.cast::<Vec<PathBuf>>()) };
        if !info.dlpi_name.is_null() {
            // SAFETY: a non-null `dlpi_name` is a NUL-terminated string owned by the loader.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
            // The executable's name is empty and the vDSO's is not a path: only files count.
            if name.starts_with(b"/") {
                names.push(PathBuf::from(OsStr::from_bytes(name)));
            }
        }
        0
    }
    let mut names: Vec<PathBuf> = Vec::new();
    // SAFETY: `collect` matches the callback type, touches only `names`, and never unwinds.
    unsafe { libc::dl_iterate_phdr(Some(collect), (&raw mut names).cast::<c_void>()) };
    names
        .iter()
        .filter_map(|name| std::fs::canonicalize(name).ok())
        .map(|path| path.to_string_lossy().into_owned())
        .collect()
}

/// What [`release`] gave back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// How many mappings were dropped.
    pub mappings: usize,
    /// How much of them was resident just before, in KiB.
    pub resident_kib: u64,
    /// How many the kernel refused to drop (locked memory, for example); they stay as they were.
    pub refused: usize,
}

/// Drops the clean read-only pages of the executable, and of the shared libraries mapped when
/// [`remember_loaded_files`] ran, from this process (see the module comment).
///
/// Safe to call at any time and more than once: the pages come back from the page cache when
/// used. An error (no `/proc`) leaves the process as it was; a mapping the kernel refuses to
/// drop is left as it was and counted in [`Released::refused`].
pub fn release() -> io::Result<Released> {
    let executable = std::fs::read_link("/proc/self/exe")?;
    let mut files = LOADED_AT_START.get().cloned().unwrap_or_default();
    files.insert(executable.to_string_lossy().into_owned());
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut released = Released { mappings: 0, resident_kib: 0, refused: 0 };
    let executable = executable.to_string_lossy();
    let mut executable_dropped = false;
    for mapping in droppable(&smaps, &files) {
        let length = usize::try_from(mapping.addresses.end - mapping.addresses.start)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a mapping larger than the address space"))?;
        // SAFETY: the range is a whole mapping of this process's executable or of a library it
        // was started with, read-only and holding no private page (checked in `droppable`), so
        // MADV_DONTNEED changes no byte of it: the next access reads the same bytes from the
        // file. Nothing unmaps the executable or the libraries it was started with.
        let outcome =
            unsafe { libc::madvise(mapping.addresses.start as *mut libc::c_void, length, libc::MADV_DONTNEED) };
        if outcome != 0 {
            released.refused += 1;
            continue;
        }
        released.mappings += 1;
        released.resident_kib += mapping.rss_kib;
        if mapping.executable {
            split_into_pages(&mapping.addresses);
        } else if mapping.path == executable {
            // SAFETY: as above; MADV_RANDOM only stops read-ahead on later faults of this range.
            // A refusal changes nothing but how many pages a fault brings back.
            unsafe { libc::madvise(mapping.addresses.start as *mut libc::c_void, length, libc::MADV_RANDOM) };
            executable_dropped = true;
        }
    }
    if executable_dropped {
        evict_unmapped_pages_of_executable();
    }
    Ok(released)
}

/// The size of the pieces [`split_into_pages`] cuts code mappings into: the system's page (4 KiB
/// on x86_64, up to 64 KiB on some aarch64 kernels, where a 4 KiB piece would be refused).
fn page_size() -> u64 {
    // SAFETY: sysconf reads a system constant; no memory is involved.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|size| *size > 0).unwrap_or(4096)
}

/// Cuts a dropped code mapping into one-page mappings (VMAs) of alternating advice, pages at even
/// addresses `MADV_RANDOM` and odd ones `MADV_NORMAL`, so that no two neighbours merge (see the
/// module comment): the kernel bounds both its read-ahead on an executable fault and its
/// fault-around by the mapping, so a fault then reads and maps that one page. The advice itself
/// changes nothing else for code: since Linux 6.16 read-ahead on a `VM_EXEC` fault ignores
/// `MADV_RANDOM`. Best effort: a refused `madvise` (the `vm.max_map_count` limit) leaves that
/// part as one larger mapping, which costs memory, not correctness.
fn split_into_pages(range: &Range<u64>) {
    let page = page_size();
    let mut at = range.start / page * page;
    while at < range.end {
        let advice = if (at / page).is_multiple_of(2) { libc::MADV_RANDOM } else { libc::MADV_NORMAL };
        // SAFETY: advice on a page of a read-only code mapping of this process (see `release`):
        // it changes how later faults read the file, never a byte of memory.
        unsafe { libc::madvise(at as *mut libc::c_void, page as usize, advice) };
        at += page;
    }
}

/// Evicts the pages of this process's executable that no process maps from the page cache, so
/// that fault-around maps back only the pages some process uses (see the module comment). Best
/// effort: a file system without the advice keeps its pages, which costs memory, not correctness.
fn evict_unmapped_pages_of_executable() {
    use std::os::fd::AsRawFd;
    // /proc/self/exe opens the very file that is mapped, even if it was replaced or deleted since.
    let Ok(file) = std::fs::File::open("/proc/self/exe") else { return };
    // SAFETY: a plain system call on a file descriptor this function owns; it changes no memory.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// One mapping of `/proc/self/smaps`, with what decides whether it may be dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    addresses: Range<u64>,
    writable: bool,
    executable: bool,
    path: String,
    rss_kib: u64,
    /// Pages that are this process's own (copied on write) or were, and are now in swap.
    private_kib: u64,
    /// Whether both counts were read (a mapping without them is never dropped).
    counted: bool,
}

/// The mappings of `files` (paths as `/proc/self/maps` names them) that may be dropped:
/// read-only, with no anonymous or swapped page, and both counts present in `smaps`.
fn droppable(smaps: &str, files: &BTreeSet<String>) -> Vec<Mapping> {
    parse(smaps)
        .into_iter()
        .filter(|m| files.contains(&m.path) && !m.writable && m.counted && m.private_kib == 0 && m.rss_kib > 0)
        .collect()
}

fn parse(smaps: &str) -> Vec<Mapping> {
    let mut mappings: Vec<Mapping> = Vec::new();
    let mut seen = (false, false);
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some(addresses) = address_range(first) {
            if let Some(last) = mappings.last_mut() {
                last.counted = seen == (true, true);
            }
            seen = (false, false);
            let permissions = fields.next();
            let writable = permissions.is_none_or(|permissions| permissions.contains('w'));
            let executable = permissions.is_some_and(|permissions| permissions.contains('x'));
            // start-end perms offset device inode name; the name may contain spaces.
            let path = line.splitn(6, char::is_whitespace).nth(5).unwrap_or("").trim().to_owned();
            mappings.push(Mapping { addresses, writable, executable, path, rss_kib: 0, private_kib: 0, counted: false });
            continue;
        }
        let (Some(mapping), Some(value)) = (mappings.last_mut(), fields.next().and_then(|v| v.parse::<u64>().ok()))
        else {
            continue;
        };
        match first {
            "Rss:" => mapping.rss_kib = value,
            "Anonymous:" => {
                mapping.private_kib += value;
                seen.0 = true;
            }
            "Swap:" => {
                mapping.private_kib += value;
                seen.1 = true;
            }
            _ => {}
        }
    }
    if let Some(last) = mappings.last_mut() {
        last.counted = seen == (true, true);
    }
    mappings
}

/// `start-end` in hexadecimal, the first field of a mapping's header line.
fn address_range(field: &str) -> Option<Range<u64>> {
    let (start, end) = field.split_once('-')?;
    Some(u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mappings of a dynamically linked tenure, abridged: read-only data, code, the RELRO
    /// segment (relocated, then made read-only), writable data, the heap, libc's code.
    const SMAPS: &str = "\
55e0c0000000-55e0c0279000 r--p 00000000 fe:00 123 /opt/tenure (deleted)
Rss:                1280 kB
Anonymous:             0 kB
Swap:                  0 kB
55e0c027a000-55e0c089f000 r-xp 00279000 fe:00 123 /opt/tenure (deleted)
Rss:                5592 kB
Anonymous:             0 kB
Swap:                  0 kB
55e0c08a0000-55e0c08fb000 r--p 0089e000 fe:00 123 /opt/tenure (deleted)
Rss:                 360 kB
Anonymous:           360 kB
Swap:                  0 kB
55e0c08fb000-55e0c0900000 rw-p 008f8000 fe:00 123 /opt/tenure (deleted)
Rss:                  20 kB
Anonymous:            20 kB
Swap:                  0 kB
55e0c0a00000-55e0c0b00000 r--p 00900000 fe:00 123 /opt/tenure (deleted)
Rss:                   8 kB
Anonymous:             0 kB
Swap:                  4 kB
55e0c1000000-55e0c109c000 rw-p 00000000 00:00 0                          [heap]
Rss:                 548 kB
Anonymous:           548 kB
Swap:                  0 kB
7f034f2fd000-7f034f453000 r-xp 00026000 fe:00 77 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1036 kB
Anonymous:             0 kB
Swap:                  0 kB
";

    fn files(paths: &[&str]) -> BTreeSet<String> {
        paths.iter().map(|p| p.to_string()).collect()
    }

    fn starts(mappings: &[Mapping]) -> Vec<u64> {
        mappings.iter().map(|m| m.addresses.start).collect()
    }

    #[test]
    fn only_the_executables_clean_read_only_mappings_are_dropped() {
        let dropped = droppable(SMAPS, &files(&["/opt/tenure (deleted)"]));
        assert_eq!(starts(&dropped), [0x55e0_c000_0000, 0x55e0_c027_a000], "read-only data and code only");
        assert_eq!(dropped.iter().map(|m| m.rss_kib).sum::<u64>(), 1280 + 5592);
    }

    #[test]
    fn a_library_mapped_at_start_is_dropped_with_the_executable_and_one_loaded_later_is_not() {
        let at_start = files(&["/opt/tenure (deleted)", "/usr/lib/x86_64-linux-gnu/libc.so.6"]);
        let dropped = droppable(SMAPS, &at_start);
        assert_eq!(starts(&dropped), [0x55e0_c000_0000, 0x55e0_c027_a000, 0x7f03_4f2f_d000]);
        let dropped = droppable(SMAPS, &files(&["/opt/tenure (deleted)"]));
        assert!(!starts(&dropped).contains(&0x7f03_4f2f_d000), "libc was not mapped at start: it is left alone");
    }

    #[test]
    fn the_libraries_remembered_are_the_loaders_files_by_the_names_maps_gives_them() {
        let objects = loaded_objects();
        let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
        for object in &objects {
            assert!(maps.contains(object.as_str()), "{object} is not named so in maps:\n{maps}");
        }
        if maps.contains("/libc.so") {
            assert!(objects.iter().any(|o| o.contains("/libc.so")), "a dynamic build starts with libc: {objects:?}");
        }
        assert!(!objects.iter().any(|o| o.contains("vdso")), "{objects:?}");
    }

    #[test]
    fn relocated_written_or_swapped_pages_are_never_dropped() {
        let mappings = parse(SMAPS);
        let kept: Vec<_> = mappings.iter().filter(|m| m.path.starts_with("/opt/tenure")).skip(2).collect();
        assert_eq!(kept.len(), 3);
        let dropped = starts(&droppable(SMAPS, &files(&["/opt/tenure (deleted)"])));
        for mapping in kept {
            assert!(!dropped.contains(&mapping.addresses.start), "{mapping:?} holds private pages");
        }
    }

    #[test]
    fn a_mapping_without_both_counts_is_kept() {
        let smaps = "55e0c027a000-55e0c089f000 r-xp 00279000 fe:00 123 /opt/tenure\nRss: 5592 kB\nAnonymous: 0 kB\n";
        assert!(droppable(smaps, &files(&["/opt/tenure"])).is_empty(), "no Swap line: not known to be clean");
    }

    #[test]
    fn other_files_are_left_alone() {
        assert!(droppable(SMAPS, &files(&["/usr/bin/something-else"])).is_empty());
        assert!(droppable(SMAPS, &files(&["/opt/tenure"])).is_empty(), "a different name is a different file");
    }

    /// In a real process: the binary's resident pages shrink, and code that ran before runs again.
    #[test]
    fn releasing_lowers_the_executables_resident_pages_and_everything_still_runs() {
        let resident = || {
            let executable = std::fs::read_link("/proc/self/exe").expect("/proc/self/exe");
            let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
            droppable(&smaps, &files(&[&executable.to_string_lossy()])).iter().map(|m| m.rss_kib).sum::<u64>()
        };
        let before = resident();
        let released = release().expect("release");
        assert!(released.mappings >= 1 && released.resident_kib > 0, "{released:?}");
        let after = resident();
        assert!(after < before, "resident before {before} KiB, after {after} KiB");
        let parsed: serde_json::Value = serde_json::from_str(r#"{"name":"leader"}"#).expect("JSON still parses");
        assert_eq!(parsed["name"], "leader");
    }

    /// In a real process: the executable's dropped mappings come back a page per fault, not 64 KiB
    /// or the kernel's read-ahead (issue 31): its code is cut into one-page mappings (the kernel
    /// bounds read-ahead and fault-around by the mapping) and its read-only data is `MADV_RANDOM`
    /// (`rr` in smaps' VmFlags). Without it the idle sidecar's code came back around every page
    /// it runs; the footprint gate (`cargo bench -p tenure-bench --bench idle_rss`) measures what
    /// that costs on a release build, this checks on every test run that the mechanism applies.
    #[test]
    fn after_releasing_the_executables_mappings_are_read_a_page_at_a_time() {
        release().expect("release");
        let executable = std::fs::read_link("/proc/self/exe").expect("/proc/self/exe");
        let executable = executable.to_string_lossy();
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
        let (mut code_pages, mut data_mappings) = (0, 0);
        let mut current: Option<(bool, String)> = None;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some(addresses) = address_range(first) {
                let permissions = line.split_whitespace().nth(1).unwrap_or("");
                let path = line.splitn(6, char::is_whitespace).nth(5).unwrap_or("").trim();
                current = None;
                if path == executable && permissions.contains('x') {
                    assert_eq!(addresses.end - addresses.start, page_size(), "code not cut into pages: {line}");
                    code_pages += 1;
                } else if path == executable && permissions == "r--p" && line.split_whitespace().nth(2) == Some("00000000") {
                    // The first read-only mapping (ELF header, read-only data): never relocated.
                    current = Some((true, line.to_owned()));
                }
            } else if let (Some((true, header)), Some(flags)) = (&current, line.strip_prefix("VmFlags:")) {
                assert!(flags.split_whitespace().any(|f| f == "rr"), "not MADV_RANDOM: {header}: {flags}");
                data_mappings += 1;
            }
        }
        assert!(code_pages > 1, "no one-page code mapping of {executable} in smaps");
        assert!(data_mappings >= 1, "no MADV_RANDOM read-only data mapping of {executable} in smaps");
    }

    /// In a real process: the C library's resident pages shrink too, and it keeps working.
    #[test]
    fn releasing_lowers_the_resident_pages_of_the_libraries_loaded_at_start_and_they_still_work() {
        remember_loaded_files();
        let libraries: BTreeSet<String> = LOADED_AT_START
            .get()
            .expect("remembered")
            .iter()
            .filter(|path| path.contains("/libc.so") || path.contains("/libc-"))
            .cloned()
            .collect();
        if libraries.is_empty() {
            return; // A static build: the C library is part of the executable.
        }
        let resident = || {
            let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
            droppable(&smaps, &libraries).iter().map(|m| m.rss_kib).sum::<u64>()
        };
        let before = resident();
        assert!(before > 0, "the C library has resident pages before: {libraries:?}");
        release().expect("release");
        let after = resident();
        assert!(after < before, "C library resident before {before} KiB, after {after} KiB");
        let path = std::env::temp_dir().join(format!("startup-pages-{}", std::process::id()));
        std::fs::write(&path, format!("{:?}", std::time::SystemTime::now())).expect("the C library still writes files");
        std::fs::remove_file(&path).expect("and removes them");
    }
}
