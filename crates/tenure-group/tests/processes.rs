//! Real processes on one host sharing a group through the file store, with a witness.
//!
//! Each member is this test binary re-run in member mode (`member_process_entry`, selected by an
//! environment variable). Every 3 ms it takes a guard for each partition it owns, reads the
//! monotonic clock, and if the guard still checks (so it was valid at that instant), appends
//! `partition term monotonic-ns pid` to a shared witness file (one `write` per line, `O_APPEND`). The parent makes 100 membership changes (SIGKILL, SIGTERM for a graceful
//! leave, start of a stopped identity, a new identity) at random moments, then lets the group
//! settle and reads the witness: per partition, in time order, the term never goes back (no member
//! worked on a partition after a newer ownership of it had started) and no term is used by two
//! processes. That is "no partition handled by two members at once", as an outside observer sees
//! it.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tenure::Timing;
use tenure_group::store::GroupStore;
use tenure_group::stores::file::FileGroupStore;
use tenure_group::{Group, GroupConfig};

const PARTITIONS: u32 = 16;
const CHANGES: usize = 100;

fn config() -> GroupConfig {
    let timing = Timing::new(Duration::from_secs(1), Duration::from_millis(500), Duration::from_millis(100));
    GroupConfig { timing: timing.expect("valid timing"), partition_count: PARTITIONS, weight: 1 }
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the host.
fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we pass and has no other effect.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// Member mode: does nothing unless started by `spawn_member`.
#[test]
fn member_process_entry() {
    let (Ok(dir), Ok(identity), Ok(witness)) = (
        std::env::var("TENURE_GROUP_MEMBER_DIR"),
        std::env::var("TENURE_GROUP_MEMBER_ID"),
        std::env::var("TENURE_GROUP_MEMBER_WITNESS"),
    ) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let store = FileGroupStore::open(&dir).unwrap();
        let group = Group::builder(identity, store).config(config()).join().unwrap();
        let mut witness = std::fs::OpenOptions::new().append(true).create(true).open(&witness).unwrap();
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        let mut tick = tokio::time::interval(Duration::from_millis(3));
        let pid = std::process::id();
        println!("ready");
        loop {
            tokio::select! {
                _ = terminate.recv() => break,
                _ = tick.tick() => {
                    for partition in 0..PARTITIONS {
                        let Some(guard) = group.guard(partition) else { continue };
                        // Valid when taken and when checked, so valid at `at` in between.
                        let at = monotonic_ns();
                        if let Ok(term) = guard.check() {
                            let line = format!("{partition} {term} {at} {pid}\n");
                            witness.write_all(line.as_bytes()).unwrap();
                        }
                    }
                }
            }
        }
        group.leave().await.unwrap();
    });
}

fn spawn_member(dir: &Path, identity: &str, witness: &Path) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["member_process_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env("TENURE_GROUP_MEMBER_DIR", dir)
        .env("TENURE_GROUP_MEMBER_ID", identity)
        .env("TENURE_GROUP_MEMBER_WITNESS", witness)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for its readiness line.
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    assert!(lines.any(|l| l.is_ok_and(|l| l.contains("ready"))), "{identity} did not start");
    // Keep reading, so that the member never writes into a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    child
}

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill only sends a signal to our own child, which has not been reaped yet.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
}

/// True when every partition is owned, in the store, by a live member at its current epoch.
fn settled(dir: &Path) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let Ok(snapshot) = runtime.block_on(FileGroupStore::open(dir).unwrap().read()) else { return false };
    let Some(table) = snapshot.table else { return false };
    table.value.slots.iter().all(|slot| {
        slot.owner.as_ref().is_some_and(|owner| {
            snapshot.members.get(&owner.member).is_some_and(|m| {
                m.value.epoch == owner.epoch && m.value.state == tenure_group::record::MemberState::Alive
            })
        })
    })
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn a_hundred_membership_changes_of_real_processes_never_let_two_work_on_one_partition() {
    let base = std::env::temp_dir().join(format!("tenure-group-processes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir: PathBuf = base.join("group");
    std::fs::create_dir_all(&dir).unwrap();
    let witness = base.join("witness");
    let mut rng = SmallRng::seed_from_u64(11);
    let mut running: BTreeMap<String, Child> = BTreeMap::new();
    let mut stopped: Vec<String> = Vec::new();
    let mut next_identity = 0;
    for _ in 0..3 {
        next_identity += 1;
        let id = format!("m{next_identity}");
        running.insert(id.clone(), spawn_member(&dir, &id, &witness));
    }
    assert!(wait_until(Duration::from_secs(30), || settled(&dir)), "the first members never settled");

    let mut kills = 0;
    let mut leaves = 0;
    for _ in 0..CHANGES {
        // The moment of the next change is random; nothing waits for it to be safe.
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        let choice = rng.random_range(0..4);
        if (choice == 0 && running.len() > 1) || running.len() >= 5 {
            let id = running.keys().nth(rng.random_range(0..running.len())).unwrap().clone();
            let mut child = running.remove(&id).unwrap();
            signal(&child, libc::SIGKILL);
            child.wait().unwrap();
            kills += 1;
            stopped.push(id);
        } else if choice == 1 && running.len() > 1 {
            let id = running.keys().nth(rng.random_range(0..running.len())).unwrap().clone();
            let mut child = running.remove(&id).unwrap();
            signal(&child, libc::SIGTERM);
            child.wait().unwrap();
            leaves += 1;
            stopped.push(id);
        } else if choice == 2 && !stopped.is_empty() {
            let id = stopped.swap_remove(rng.random_range(0..stopped.len()));
            running.insert(id.clone(), spawn_member(&dir, &id, &witness));
        } else {
            next_identity += 1;
            let id = format!("m{next_identity}");
            running.insert(id.clone(), spawn_member(&dir, &id, &witness));
        }
    }
    assert!(wait_until(Duration::from_secs(30), || settled(&dir)), "the group never settled after the changes");
    for (_, mut child) in running {
        signal(&child, libc::SIGTERM);
        child.wait().unwrap();
    }

    // The witness: per partition, in time order, terms never go back, and one term is one process.
    let mut ticks: Vec<(u32, u64, u128, u32)> = std::io::BufReader::new(std::fs::File::open(&witness).unwrap())
        .lines()
        .map(|line| {
            let line = line.unwrap();
            let f: Vec<&str> = line.split_whitespace().collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap(), f[3].parse().unwrap())
        })
        .collect();
    ticks.sort_by_key(|t| t.2);
    let mut newest: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    let mut worker_of_term: BTreeMap<(u32, u64), u32> = BTreeMap::new();
    for (partition, term, at, pid) in &ticks {
        if let Some((newest_term, newest_pid)) = newest.get(partition) {
            assert!(
                term >= newest_term,
                "partition {partition}: pid {pid} worked under term {term} at {at} ns after pid {newest_pid} started \
                 term {newest_term}"
            );
        }
        let owner = worker_of_term.entry((*partition, *term)).or_insert(*pid);
        assert_eq!(owner, pid, "partition {partition}: term {term} used by two processes");
        newest.insert(*partition, (*term, *pid));
    }
    let handovers = worker_of_term.len() as u32 - PARTITIONS;
    println!(
        "{CHANGES} changes ({kills} kills, {leaves} leaves), {} ticks, {handovers} ownership changes",
        ticks.len()
    );
    assert!(handovers >= 50, "too few ownership changes to mean anything: {handovers}");
    std::fs::remove_dir_all(&base).unwrap();
}
