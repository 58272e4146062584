//! `tenure run -- CMD`: the command runs only on the leader, its status is passed on, signals are
//! forwarded, and losing leadership kills it and exits with 75.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{file_url, run_to_end, wait_until, TempDir, Tenure};
use tenure::locks::file::FileLock;
use tenure::RecordLock;

const EXIT_LOST_LEADERSHIP: i32 = 75;

/// `tenure run` on a memory lock with `--ttl 2s`, then `rest`: more flags, `--` and the command.
fn on_memory<'a>(rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["run", "--election", "e", "--lock", "memory:", "--ttl", "2s"];
    args.extend(rest);
    args
}

#[test]
fn exit_status_of_the_command_is_passed_on() {
    let (code, _, stderr) = run_to_end(&on_memory(&["--", "sh", "-c", "exit 7"]));
    assert_eq!(code, 7, "{stderr}");
    let (code, _, stderr) = run_to_end(&on_memory(&["--", "sh", "-c", "kill -KILL $$"]));
    assert_eq!(code, 128 + libc::SIGKILL, "{stderr}");
}

#[test]
fn command_gets_the_term_election_identity_and_lock_in_its_environment() {
    let dir = TempDir::new("run-env");
    let out = dir.join("env");
    let script = format!("echo \"$TENURE_TERM $TENURE_ELECTION $TENURE_IDENTITY $TENURE_LOCK\" > {}", out.display());
    let mut args = common::words("run --election nightly --lock memory: --id host-a --ttl 2s -- sh -c");
    args.push(&script);
    let (code, _, stderr) = run_to_end(&args);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read_to_string(out).unwrap(), "1 nightly host-a memory:\n");
}

#[test]
fn a_command_that_cannot_be_found_exits_127() {
    let (code, _, stderr) = run_to_end(&on_memory(&["--", "/nonexistent/command"]));
    assert_eq!(code, 127, "{stderr}");
    assert!(stderr.contains("cannot start the command"), "{stderr}");
}

#[test]
fn sigterm_is_forwarded_and_the_commands_status_is_passed_on() {
    let dir = TempDir::new("run-sigterm");
    let ready = dir.join("ready");
    let script = format!("trap 'exit 3' TERM; touch {}; while :; do sleep 0.05; done", ready.display());
    let mut tenure = Tenure::start("runner", &on_memory(&["--", "sh", "-c", &script]));
    common::wait_until(Duration::from_secs(10), || ready.exists().then_some(())).expect("the command started");
    tenure.signal(libc::SIGTERM);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 3, "{}", tenure.log());
    assert!(tenure.log().contains("stopping the command"), "{}", tenure.log());
}

#[test]
fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let dir = TempDir::new("run-grace");
    let ready = dir.join("ready");
    let script = format!("trap '' TERM; touch {}; while :; do sleep 0.05; done", ready.display());
    let mut tenure = Tenure::start("runner", &on_memory(&["--grace", "200ms", "--", "sh", "-c", &script]));
    common::wait_until(Duration::from_secs(10), || ready.exists().then_some(())).expect("the command started");
    tenure.signal(libc::SIGINT);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 128 + libc::SIGKILL, "{}", tenure.log());
    assert!(tenure.log().contains("did not stop within the grace period"), "{}", tenure.log());
}

#[test]
fn nothing_the_command_started_survives_it() {
    let dir = TempDir::new("run-leftovers");
    let pid_file = dir.join("pid");
    // The shell leaves a background sleep behind and exits.
    let script = format!("sleep 30 & echo $! > {}", pid_file.display());
    let (code, _, stderr) = run_to_end(&on_memory(&["--", "sh", "-c", &script]));
    assert_eq!(code, 0, "{stderr}");
    let pid: i32 = std::fs::read_to_string(pid_file).unwrap().trim().parse().unwrap();
    let gone = common::wait_until(Duration::from_secs(5), || (!is_alive(pid)).then_some(()));
    assert!(gone.is_some(), "the background sleep {pid} outlived the command");
}

#[test]
fn tenure_exits_only_once_what_the_command_left_behind_is_dead_even_after_setsid() {
    let dir = TempDir::new("run-setsid-leftovers");
    let pid_file = dir.join("pid");
    // A daemon-like leftover: a new session, re-parented when the shell exits.
    let script = format!("setsid sleep 30 & echo $! > {}", pid_file.display());
    let (code, _, stderr) = run_to_end(&on_memory(&["--", "sh", "-c", &script]));
    assert_eq!(code, 0, "{stderr}");
    let pid: i32 = std::fs::read_to_string(pid_file).unwrap().trim().parse().unwrap();
    assert!(!is_alive(pid), "the detached sleep {pid} outlived tenure");
    assert!(stderr.contains("killed processes the command left running"), "{stderr}");
}

/// Starts `tenure run` (with `extra` flags) on a command tree with every way out of a process
/// group (a `setsid` child, a double fork, a plain background child), waits until all of it
/// runs, kills tenure with SIGKILL, and checks that none of the tree survives for long: its
/// lease (4 s) has not even run out when the check ends.
fn assert_sigkill_of_tenure_kills_the_tree(label: &str, extra: &[&str]) -> String {
    let dir = TempDir::new(label);
    let (pids, ready) = (dir.join("pids"), dir.join("ready"));
    let script = format!(
        "setsid sleep 71 & echo $! >> {p}; (setsid sleep 72 & echo $! >> {p}); sleep 73 & echo $! >> {p}; \
         echo $$ >> {p}; touch {r}; wait",
        p = pids.display(),
        r = ready.display()
    );
    let lock_url = file_url(&dir.join("lock"));
    let mut args = vec!["run", "--election", "e", "--lock", &lock_url, "--ttl", "4s"];
    args.extend(extra);
    args.extend(["--", "sh", "-c", &script]);
    let mut runner = Tenure::start("runner", &args);
    wait_until(Duration::from_secs(10), || ready.exists().then_some(())).expect("the command tree started");
    let pids: Vec<i32> = std::fs::read_to_string(&pids).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), 4);
    // The command can be up before tenure has heard from its supervisor and logged how it
    // contains the tree, which the callers check.
    runner.wait_for_log("leading; started the command", Duration::from_secs(10));
    runner.signal(libc::SIGKILL);
    runner.wait_exit(Duration::from_secs(5)).expect("tenure died");
    let gone = wait_until(Duration::from_secs(3), || pids.iter().all(|&pid| !is_alive(pid)).then_some(()));
    let survivors: Vec<i32> = pids.iter().copied().filter(|&pid| is_alive(pid)).collect();
    assert!(gone.is_some(), "{survivors:?} of {pids:?} survived tenure; log:\n{}", runner.log());
    runner.log()
}

#[test]
fn killing_tenure_with_sigkill_kills_the_whole_command_tree_in_its_cgroup() {
    let log = assert_sigkill_of_tenure_kills_the_tree("run-kill9-cgroup", &[]);
    // Where a cgroup could be made, it is removed once empty.
    if let Some(path) = log.split("cgroup=").nth(1).and_then(|rest| rest.split_whitespace().next()) {
        let path = std::path::PathBuf::from(path.trim_matches('"'));
        wait_until(Duration::from_secs(3), || (!path.exists()).then_some(()))
            .unwrap_or_else(|| panic!("{} was left behind", path.display()));
    }
}

#[test]
fn killing_tenure_with_sigkill_kills_the_whole_command_tree_without_a_cgroup() {
    let log = assert_sigkill_of_tenure_kills_the_tree("run-kill9-group", &["--no-cgroup"]);
    assert!(log.contains("disabled by --no-cgroup"), "{log}");
}

/// True while `pid` runs (a zombie or a reused-and-gone pid counts as dead).
fn is_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    (unsafe { libc::kill(pid, 0) } == 0) && !is_zombie(pid)
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

#[test]
fn a_command_killed_by_the_forwarded_sigterm_exits_143() {
    let mut tenure = Tenure::start("runner", &on_memory(&["--", "sleep", "30"]));
    tenure.wait_for_log("leading; started the command", Duration::from_secs(10));
    tenure.signal(libc::SIGTERM);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 128 + libc::SIGTERM, "{}", tenure.log());
}

/// `tenure elect` as "holder" on `lock_url`, once it leads.
fn start_holder(lock_url: &str) -> Tenure {
    let holder =
        Tenure::start("holder", &["elect", "--election", "e", "--lock", lock_url, "--id", "holder", "--ttl", "2s"]);
    holder.wait_for_log("started leading", Duration::from_secs(5));
    holder
}

/// Another writer takes the lock over behind the runner's back (as a misconfigured or client-go
/// candidate with a shorter lease could): compare-and-swap through the library, then silence.
fn take_the_lock_behind_the_runners_back(lock_path: &std::path::Path) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let lock = FileLock::open(lock_path).unwrap();
        let stored = lock.get().await.unwrap().expect("the runner's record");
        let mut record = stored.record.unwrap();
        record.holder_identity = "intruder".into();
        record.leader_transitions += 1;
        lock.update(&stored.version, &record).await.unwrap();
    });
}

fn file_lock_args<'a>(lock_url: &'a str, id: &'a str) -> Vec<&'a str> {
    vec!["run", "--election", "e", "--lock", lock_url, "--id", id, "--ttl", "2s", "--"]
}

#[test]
fn only_the_leader_runs_the_command_so_runs_never_overlap() {
    let dir = TempDir::new("run-exclusive");
    let lock_url = file_url(&dir.join("lock"));
    let journal = dir.join("journal");
    let script =
        format!("echo start $TENURE_TERM >> {j}; sleep 0.7; echo end $TENURE_TERM >> {j}", j = journal.display());
    let mut runners: Vec<Tenure> = ["a", "b"]
        .iter()
        .map(|id| {
            let mut args = file_lock_args(&lock_url, id);
            args.extend(["sh", "-c", &script]);
            Tenure::start(id, &args)
        })
        .collect();
    for runner in &mut runners {
        assert_eq!(runner.exit_code(Duration::from_secs(15)), 0, "{}", runner.log());
    }
    let journal = std::fs::read_to_string(journal).unwrap();
    assert_eq!(journal, "start 1\nend 1\nstart 2\nend 2\n", "runs overlapped or did not both happen");
}

#[test]
fn stopped_before_leading_exits_with_the_signal_status_without_running_the_command() {
    let dir = TempDir::new("run-waiting");
    let lock_url = file_url(&dir.join("lock"));
    let marker = dir.join("ran");
    let mut holder = start_holder(&lock_url);
    let mut args = file_lock_args(&lock_url, "waiter");
    let script = format!("touch {}", marker.display());
    args.extend(["sh", "-c", &script]);
    let mut waiter = Tenure::start("waiter", &args);
    waiter.wait_for_log("leader=\"holder\"", Duration::from_secs(5));
    waiter.signal(libc::SIGTERM);
    assert_eq!(waiter.exit_code(Duration::from_secs(5)), 128 + libc::SIGTERM, "{}", waiter.log());
    assert!(!marker.exists(), "the command ran without leadership");
    holder.signal(libc::SIGTERM);
    assert_eq!(holder.exit_code(Duration::from_secs(5)), 0);
}

#[test]
fn losing_the_lock_stops_the_command_and_exits_75() {
    let dir = TempDir::new("run-lost");
    let lock_path = dir.join("lock");
    let lock_url = file_url(&lock_path);
    let ready = dir.join("ready");
    let terminated = dir.join("terminated");
    let script = format!(
        "trap 'touch {t}; exit 0' TERM; touch {r}; while :; do sleep 0.05; done",
        t = terminated.display(),
        r = ready.display()
    );
    let mut args = file_lock_args(&lock_url, "runner");
    args.extend(["sh", "-c", &script]);
    let mut runner = Tenure::start("runner", &args);
    wait_until(Duration::from_secs(10), || ready.exists().then_some(())).expect("the command started");

    take_the_lock_behind_the_runners_back(&lock_path);

    assert_eq!(runner.exit_code(Duration::from_secs(5)), EXIT_LOST_LEADERSHIP, "{}", runner.log());
    assert!(terminated.exists(), "the command was not sent SIGTERM");
    assert!(runner.log().contains("lost leadership"), "{}", runner.log());
}

#[test]
fn timeout_gives_up_waiting_for_leadership_with_124_without_running_the_command() {
    let dir = TempDir::new("run-timeout");
    let lock_url = file_url(&dir.join("lock"));
    let marker = dir.join("ran");
    let mut holder = start_holder(&lock_url);
    let mut args = file_lock_args(&lock_url, "waiter");
    let script = format!("touch {}", marker.display());
    args.splice(1..1, ["--timeout", "300ms"]);
    args.extend(["sh", "-c", &script]);
    let (code, _, stderr) = run_to_end(&args);
    assert_eq!(code, 124, "{stderr}");
    assert!(stderr.contains("not leading within --timeout"), "{stderr}");
    assert!(!marker.exists(), "the command ran without leadership");
    holder.signal(libc::SIGTERM);
    assert_eq!(holder.exit_code(Duration::from_secs(5)), 0);
}

/// A command that appends `start TERM` to `journal` when it starts and `stop TERM` when it gets
/// SIGTERM.
fn journaling_script(journal: &std::path::Path) -> String {
    format!(
        "trap 'echo stop $TENURE_TERM >> {j}; exit 0' TERM; echo start $TENURE_TERM >> {j}; while :; do sleep 0.05; done",
        j = journal.display()
    )
}

fn journal_lines(journal: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(journal).unwrap_or_default().lines().map(str::to_owned).collect()
}

#[test]
fn campaign_again_runs_the_command_anew_with_a_higher_term_after_a_loss() {
    let dir = TempDir::new("run-again");
    let lock_path = dir.join("lock");
    let lock_url = file_url(&lock_path);
    let journal = dir.join("journal");
    let script = journaling_script(&journal);
    let mut args = file_lock_args(&lock_url, "runner");
    args.splice(1..1, ["--campaign-again"]);
    args.extend(["sh", "-c", &script]);
    let mut runner = Tenure::start("runner", &args);
    wait_until(Duration::from_secs(10), || (journal_lines(&journal).len() == 1).then_some(())).expect("started");

    // The intruder never renews: once its lease has run out, the runner leads again.
    take_the_lock_behind_the_runners_back(&lock_path);

    wait_until(Duration::from_secs(10), || (journal_lines(&journal).len() >= 3).then_some(()))
        .unwrap_or_else(|| panic!("not run again; log:\n{}", runner.log()));
    assert_eq!(journal_lines(&journal), ["start 1", "stop 1", "start 3"], "{}", runner.log());
    assert!(runner.is_running());
    runner.signal(libc::SIGTERM);
    assert_eq!(runner.exit_code(Duration::from_secs(5)), 0, "{}", runner.log());
}

#[test]
fn sigusr1_hands_the_command_over_to_the_next_candidate_and_stays_a_candidate() {
    let dir = TempDir::new("run-resign");
    let lock_url = file_url(&dir.join("lock"));
    let journal = dir.join("journal");
    let script = journaling_script(&journal);
    let start = |id: &str| {
        let mut args = file_lock_args(&lock_url, id);
        args.extend(["sh", "-c", &script]);
        Tenure::start(id, &args)
    };
    let mut a = start("a");
    wait_until(Duration::from_secs(10), || (journal_lines(&journal).len() == 1).then_some(())).expect("a runs");
    let mut b = start("b");
    b.wait_for_log("leader=\"a\"", Duration::from_secs(5));
    a.signal(libc::SIGUSR1);
    wait_until(Duration::from_secs(5), || (journal_lines(&journal).len() >= 3).then_some(()))
        .unwrap_or_else(|| panic!("no handover; a:\n{}\nb:\n{}", a.log(), b.log()));
    assert_eq!(journal_lines(&journal), ["start 1", "stop 1", "start 2"]);
    b.wait_for_log("leading; started the command", Duration::from_secs(1));
    assert!(a.is_running(), "a exited instead of staying a candidate:\n{}", a.log());
    // b's command handles SIGTERM with exit 0; a, waiting, exits as stopped before leading.
    for (runner, expected) in [(&mut b, 0), (&mut a, 128 + libc::SIGTERM)] {
        runner.signal(libc::SIGTERM);
        assert_eq!(runner.exit_code(Duration::from_secs(5)), expected, "{}", runner.log());
    }
}

/// The processes whose parent is `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse::<i32>().ok())
                == Some(pid)
        })
        .collect()
}

#[test]
fn sigterm_to_every_process_at_once_as_systemd_sends_it_still_gives_the_command_its_grace() {
    let dir = TempDir::new("run-systemd-stop");
    let ready = dir.join("ready");
    let script = format!("trap 'exit 3' TERM; touch {}; while :; do sleep 0.05; done", ready.display());
    let mut runner = Tenure::start("runner", &on_memory(&["--", "sh", "-c", &script]));
    wait_until(Duration::from_secs(10), || ready.exists().then_some(())).expect("the command started");
    let supervisor = children_of(runner.pid());
    assert_eq!(supervisor.len(), 1, "one supervisor under tenure");
    let command = children_of(supervisor[0]);
    signal_each(&[&[runner.pid(), supervisor[0]], &command[..]].concat(), libc::SIGTERM);
    assert_eq!(runner.exit_code(Duration::from_secs(5)), 3, "{}", runner.log());
}

#[test]
fn if_the_supervisor_is_killed_tenure_kills_the_tree_itself_and_exits_1() {
    let dir = TempDir::new("run-supervisor-killed");
    let (pids, ready) = (dir.join("pids"), dir.join("ready"));
    let script = format!(
        "setsid sleep 74 & echo $! >> {p}; echo $$ >> {p}; touch {r}; wait",
        p = pids.display(),
        r = ready.display()
    );
    let mut runner = Tenure::start("runner", &on_memory(&["--", "sh", "-c", &script]));
    wait_until(Duration::from_secs(10), || ready.exists().then_some(())).expect("the command tree started");
    // Killed once tenure knows the command started (before that, a dead supervisor is a failed
    // start, another path).
    runner.wait_for_log("started the command", Duration::from_secs(10));
    let pids: Vec<i32> = std::fs::read_to_string(&pids).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let supervisor = children_of(runner.pid());
    assert_eq!(supervisor.len(), 1, "one supervisor under tenure");
    signal_each(&supervisor, libc::SIGKILL);
    assert_eq!(runner.exit_code(Duration::from_secs(5)), 1, "{}", runner.log());
    assert!(runner.log().contains("the supervisor process died"), "{}", runner.log());
    let log = runner.log();
    let cgroup = log.split("cgroup=").nth(1).and_then(|rest| rest.split_whitespace().next());
    if let Some(cgroup) = cgroup {
        // In a cgroup even the process that left the session is found; without one, only the
        // command's process group is within tenure's reach.
        let gone = wait_until(Duration::from_secs(3), || pids.iter().all(|&pid| !is_alive(pid)).then_some(()));
        assert!(gone.is_some(), "the tree survived its supervisor; log:\n{log}");
        assert!(!std::path::Path::new(cgroup).exists(), "the cgroup was left behind");
    }
}

/// Sends `signal` to each of `pids`, in order.
fn signal_each(pids: &[i32], signal: i32) {
    for &pid in pids {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, signal) };
    }
}

#[test]
fn a_frozen_run_kills_its_command_as_soon_as_it_is_thawed_past_its_deadline_even_while_the_store_hangs() {
    // A frozen container (tenure, its supervisor and the command all stopped) thawed long after
    // its fencing deadline, with a store that does not answer (the API server frozen too: the
    // kernel still accepts connections, nobody answers them). The fencing deadline and the kill
    // deadline after it have passed on the local clock, so the command must die at once, before
    // anything is heard from the store, and without waiting for its grace period.
    let dir = TempDir::new("run-frozen");
    let kubeconfig = dir.join("kubeconfig");
    let server = common::start_apiserver(&kubeconfig);
    let (ttl, lease, renew_deadline) = ("4s", Duration::from_secs(4), Duration::from_secs(2));
    let lock_args = ["--lock", "kube://default/leases/frozen", "--kubeconfig", kubeconfig.to_str().unwrap()];
    let runner = Tenure::start_with(
        "runner",
        common::without_cluster(&mut Command::new(common::TENURE))
            .args(["run", "--election", "frozen", "--ttl", ttl])
            .args(lock_args)
            // It ignores SIGTERM: only the SIGKILL, due long ago, ends it.
            .args(["--", "sh", "-c", "trap '' TERM; while :; do sleep 0.02; done"]),
    );
    runner.wait_for_log("leading; started the command", Duration::from_secs(10));
    let supervisor = children_of(runner.pid());
    assert_eq!(supervisor.len(), 1, "one supervisor under tenure");
    let command = children_of(supervisor[0]);
    assert_eq!(command.len(), 1, "the command under the supervisor");
    let tree = [runner.pid(), supervisor[0], command[0]];

    signal_each(&[server.pid()], libc::SIGSTOP);
    signal_each(&tree, libc::SIGSTOP);
    // The fault itself, not a wait for an event: the tree stays frozen past the lease.
    std::thread::sleep(lease + Duration::from_millis(500));
    let thawed = Instant::now();
    signal_each(&tree, libc::SIGCONT);
    let dead = wait_until(Duration::from_secs(10), || (!is_alive(command[0])).then(|| thawed.elapsed()));
    // The part of the margin (lease - renew deadline) that the guarantee leaves for the kill.
    let kill_allowance = (lease - renew_deadline) / 4;
    let log = runner.log();
    match dead {
        Some(after) => assert!(after < kill_allowance, "the command died {after:?} after the thaw; log:\n{log}"),
        None => panic!("the command outlived its thawed tenure; log:\n{log}"),
    }
    assert!(log.contains("lost leadership; stopping the command"), "{log}");
    signal_each(&[server.pid()], libc::SIGCONT);
}

/// `--probe` with `--progress-timeout`: a leader whose command's probe never succeeds (here it
/// hangs, and is killed each interval) gives way, and a replica whose probe succeeds leads and
/// keeps leading.
#[test]
fn a_leader_whose_probe_fails_gives_way_to_one_whose_probe_succeeds() {
    let dir = TempDir::new("run-probe");
    let lock = file_url(&dir.join("lock"));
    let starts = dir.join("starts");
    let script = format!("echo \"$TENURE_IDENTITY\" >> {}; exec sleep 60", starts.display());
    let candidate = |id: &str, probe: &str| {
        let args = [
            "run", "--election", "probed", "--lock", &lock, "--id", id, "--ttl", "2s", "--campaign-again",
            "--probe", probe, "--progress-timeout", "1s", "--probe-every", "200ms", "--", "sh", "-c", &script,
        ];
        Tenure::start(id, &args)
    };
    let hung = candidate("hung", "sleep 30");
    wait_until(Duration::from_secs(10), || std::fs::read_to_string(&starts).ok().filter(|s| s.contains("hung")))
        .expect("the first candidate runs its command");
    let healthy = candidate("healthy", "true");
    wait_until(Duration::from_secs(15), || std::fs::read_to_string(&starts).ok().filter(|s| s.contains("healthy")))
        .expect("the replica whose probe succeeds runs its command");
    hung.wait_for_log("giving way: the command's --probe has not succeeded", Duration::from_secs(5));
    assert!(hung.log().contains("did not finish within its interval"), "{}", hung.log());
    // Two silences' worth later, the healthy one still leads and has not given way.
    healthy.wait_for_log("leading; started the command", Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(2)); // let two --progress-timeout periods pass: the behaviour under test is what does not happen
    assert!(!healthy.log().contains("giving way"), "{}", healthy.log());
    assert_eq!(std::fs::read_to_string(&starts).unwrap().lines().filter(|l| *l == "healthy").count(), 1);
}

#[test]
fn probe_flags_are_checked_before_anything_starts() {
    for (extra, expected) in [
        (vec!["--probe", "true"], "--progress-timeout"),
        (vec!["--progress-timeout", "5s"], "--probe"),
        (vec!["--probe", "true", "--progress-timeout", "10ms"], "shorter than one renew interval"),
        (vec!["--probe", "true", "--progress-timeout", "1s", "--probe-every", "2s"], "at most --progress-timeout"),
    ] {
        let mut args = on_memory(&extra);
        args.extend(["--", "true"]);
        let (code, _, stderr) = run_to_end(&args);
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
    }
}
