//! `tenure-example-ipam controller ...` runs one replica of the allocator; `tenure-example-ipam
//! check ...` runs the whole scenario (etcd, API server, three replicas, churn and faults) and
//! prints the checker's numbers.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tenure_example_ipam::bench::{self, BenchConfig};
use tenure_example_ipam::checker::{self, Scenario};
use tenure_example_ipam::active_active;
use tenure_example_ipam::controller::{self, ControllerConfig, Mode};

#[derive(Parser)]
#[command(about = "A Kuryr-like Pod IP allocator on the Tenure HA runtime, and its checker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one replica until SIGTERM.
    Controller(ControllerConfig),
    /// Run the checker's scenario and print its numbers; exits 1 if it found a violation.
    Check {
        /// Controllers watch from now (Kuryr) instead of resuming from the checkpoint.
        #[arg(long)]
        no_resume: bool,
        /// Faults to inject (one leader change each).
        #[arg(long, default_value_t = 60)]
        faults: usize,
        /// The churn's random seed.
        #[arg(long, default_value_t = 10)]
        seed: u64,
        /// The API server's event window (default 75 s); shorter than a leader change makes every
        /// resume fail, so the relist and the collector must recover the deletions.
        #[arg(long, value_parser = humantime::parse_duration)]
        event_window: Option<Duration>,
        /// active-passive (faults hit the leader) or active-active (faults hit the members in
        /// turn, each followed by a join; handlers are checked for overlaps in the witness).
        #[arg(long, value_enum, default_value_t = Mode::ActivePassive)]
        mode: Mode,
        /// Active/Active: the group's partition count.
        #[arg(long, default_value_t = 64)]
        partitions: u32,
        /// Active/Active control: run replicas that ignore revocations; the checker must report
        /// overlapping handlers (exit 1).
        #[arg(long)]
        unsafe_ignore_revocation: bool,
    },
    /// Active/Active throughput: Pods handled per second by 1 and by 3 replicas with a slow pool.
    Bench {
        /// Replica counts to compare; the ratio is of the last to the first.
        #[arg(long, value_delimiter = ',', default_value = "1,3")]
        replicas: Vec<usize>,
        /// Pods per round (enough that the hash spreads them over the replicas about evenly).
        #[arg(long, default_value_t = 600)]
        pods: usize,
        /// Rounds per replica count (the median is printed).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// The delay before every pool call.
        #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
        pool_delay: Duration,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => return fail(format_args!("cannot start the runtime: {error}")),
    };
    match Cli::parse().command {
        Command::Controller(config) => {
            if config.exit_with_parent {
                if let Err(error) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
                    return fail(format_args!("cannot follow the parent's exit: {error}"));
                }
            }
            let replica = async {
                match config.mode {
                    Mode::ActiveActive => active_active::run(config).await,
                    _ => controller::run(config).await,
                }
            };
            match runtime.block_on(replica) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => fail(format_args!("controller failed: {error}")),
            }
        }
        Command::Bench { replicas, pods, rounds, pool_delay } => {
            let Ok(controller) = std::env::current_exe() else { return fail("cannot find this program") };
            if replicas.is_empty() || pods == 0 || rounds == 0 {
                return fail("--replicas, --pods and --rounds must not be empty or zero");
            }
            let config = BenchConfig { controller, replicas: replicas.clone(), pods, rounds, pool_delay };
            match runtime.block_on(bench::run(&config)) {
                Ok(results) => {
                    println!("pool delay {pool_delay:?} per call, {pods} Pods per round, median of {rounds} rounds:");
                    for &count in &replicas {
                        if let Some((allocations, releases)) = bench::medians(&results, count) {
                            println!("replicas {count}: {allocations:.1} allocations/s, {releases:.1} releases/s");
                        }
                    }
                    let (first, last) = (replicas[0], replicas[replicas.len() - 1]);
                    if let (Some(a), Some(b)) = (bench::medians(&results, first), bench::medians(&results, last)) {
                        println!(
                            "ratio {last} vs {first} replicas: {:.2}x allocations, {:.2}x releases",
                            b.0 / a.0,
                            b.1 / a.1
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(error) => fail(format_args!("the benchmark failed: {error}")),
            }
        }
        Command::Check { no_resume, faults, seed, event_window, mode, partitions, unsafe_ignore_revocation } => {
            let exe = match std::env::current_exe() {
                Ok(exe) => exe,
                Err(error) => return fail(format_args!("cannot find this program: {error}")),
            };
            let scenario = Scenario {
                seed,
                event_window,
                mode,
                partitions,
                ignore_revocation: unsafe_ignore_revocation,
                ..Scenario::short(exe, !no_resume, faults)
            };
            match runtime.block_on(checker::run(&scenario)) {
                Ok(report) => {
                    println!("mode: {:?}, resume: {}\n{}", scenario.mode, scenario.resume, report.summary());
                    if report.is_clean() {
                        ExitCode::SUCCESS
                    } else {
                        println!(
                            "violations: {:?} {:?} {:?} {:?}\nmissed: {:?}",
                            report.handler_overlaps.iter().take(5).collect::<Vec<_>>(),
                            report.double_allocations,
                            report.pods_with_two_ips,
                            report.in_use_collected,
                            report.missed_deletions
                        );
                        ExitCode::FAILURE
                    }
                }
                Err(error) => fail(format_args!("the run failed: {error}")),
            }
        }
    }
}

/// Says on standard error why the program failed; the exit status of a failure.
fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("{message}");
    ExitCode::FAILURE
}
