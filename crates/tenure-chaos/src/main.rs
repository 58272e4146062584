//! `tenure-chaos`: injects faults on the leader of real `tenure` candidates on real stores,
//! round after round, and prints the checker's table (text and JSON) and SVG timelines.
//!
//! Exit status: 0 when every row is as it must be (no violation, every required takeover came;
//! controls found their violations), 1 when a row failed, 2 when the run could not be made
//! (missing software or privilege, bad arguments, interrupted).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use tenure_chaos::report::{json_table, text_table, Row};
use tenure_chaos::scenario::{self, Fault, Mode, Settings};
use tenure_chaos::stores::{Backend, Store};
use tenure_chaos::{install_interrupt_handler, timeline, ChaosError};

/// How much to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Preset {
    /// A few rounds per backend and fault: minutes, for CI.
    Ci,
    /// At least 200 fault injections per backend: the benchmark of the README.
    Bench,
}

/// Fault injection against real tenure candidates and stores; prints a table of violations and
/// failover times.
#[derive(Debug, Parser)]
#[command(name = "tenure-chaos")]
struct Args {
    /// How much to run (sets --rounds unless it is given).
    #[arg(long, value_enum, default_value_t = Preset::Ci)]
    preset: Preset,
    /// Faults per scenario (backend x fault x mode). [default: 2 for ci, 30 for bench]
    #[arg(long)]
    rounds: Option<usize>,
    /// Backends to test.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Backend::File, Backend::Apiserver, Backend::Etcd, Backend::Zookeeper])]
    backends: Vec<Backend>,
    /// Faults to inject (those that do not apply to a backend or mode are skipped).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Fault::Sigkill, Fault::Sigstop, Fault::Sigterm, Fault::StoreRestart, Fault::Partition, Fault::ClockInside, Fault::ClockOutside, Fault::SplitLock])]
    faults: Vec<Fault>,
    /// Modes to run the candidates in.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Elect, Mode::Run])]
    modes: Vec<Mode>,
    /// Candidates per election.
    #[arg(long, default_value_t = 3)]
    candidates: usize,
    /// The `tenure` binary. [default: TENURE_BIN, else `tenure` next to this program]
    #[arg(long, env = "TENURE_BIN")]
    tenure: Option<PathBuf>,
    /// Where the results (results.txt, results.json, timelines/) and the logs go.
    #[arg(long, default_value = "target/chaos")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("tenure-chaos: {error}");
            ExitCode::from(2)
        }
    }
}

fn tenure_binary(args: &Args) -> Result<PathBuf, ChaosError> {
    let path = match &args.tenure {
        Some(path) => path.clone(),
        None => std::env::current_exe().map_err(|e| ChaosError::Io(e.to_string()))?.with_file_name("tenure"),
    };
    if !path.is_file() {
        return Err(ChaosError::Missing(format!(
            "the tenure binary {} (build it with `cargo build -p tenure-cli`, or pass --tenure / TENURE_BIN)",
            path.display()
        )));
    }
    Ok(path)
}

fn write(path: &Path, text: &str) -> Result<(), ChaosError> {
    std::fs::write(path, text).map_err(|e| ChaosError::Io(format!("{}: {e}", path.display())))
}

fn run(args: &Args) -> Result<bool, ChaosError> {
    install_interrupt_handler()?;
    if args.candidates < 2 || args.candidates > 9 {
        return Err(ChaosError::Io("--candidates must be between 2 and 9".into()));
    }
    let rounds = args.rounds.unwrap_or(match args.preset {
        Preset::Ci => 2,
        Preset::Bench => 30,
    });
    if rounds == 0 || rounds > 10_000 {
        return Err(ChaosError::Io("--rounds must be between 1 and 10000".into()));
    }
    let tenure = tenure_binary(args)?;
    std::fs::create_dir_all(args.out.join("timelines"))
        .map_err(|e| ChaosError::Io(format!("{}: {e}", args.out.display())))?;
    // Absolute, so that the lock URLs built from it (file:///...) are valid whatever --out was.
    let out = std::fs::canonicalize(&args.out).map_err(|e| ChaosError::Io(format!("{}: {e}", args.out.display())))?;
    let logs = out.join("logs");
    let _ = std::fs::remove_dir_all(&logs);
    let mut rows: Vec<Row> = Vec::new();
    for &backend in &args.backends {
        let mut store = Store::start(backend, &logs.join(backend.name()).join("store"), &tenure)?;
        for &mode in &args.modes {
            for &fault in &args.faults {
                if !fault.applies(backend, mode) {
                    continue;
                }
                // Controls prove a point in a couple of rounds; they need not repeat as often.
                let rounds = if fault.is_control() { rounds.min(3) } else { rounds };
                let settings = Settings {
                    tenure: tenure.clone(),
                    dir: logs.join(backend.name()),
                    rounds,
                    candidates: args.candidates,
                };
                let started = std::time::Instant::now();
                let outcome = scenario::run(&settings, &mut store, fault, mode)?;
                for error in &outcome.protocol_errors {
                    eprintln!("protocol error: {error}");
                }
                let row = outcome.row.clone();
                eprintln!(
                    "{} {} {}: {} rounds, {} violations, {} without takeover, {:.0}s{}",
                    row.backend,
                    row.fault,
                    row.mode,
                    row.rounds,
                    row.violations(),
                    row.without_takeover,
                    started.elapsed().as_secs_f64(),
                    if row.passed() { "" } else { "  FAILED" }
                );
                if mode == Mode::Elect {
                    let title = format!("{} / {} / {}", row.backend, row.fault, row.mode);
                    let name = format!("{}-{}.svg", row.backend, fault.slug());
                    let svg =
                        timeline::svg(&title, &outcome.candidates, &outcome.tenures, &outcome.faults, &outcome.verdict);
                    write(&out.join("timelines").join(name), &svg)?;
                }
                rows.push(row);
            }
        }
    }
    let table = text_table(&rows);
    print!("{table}");
    let settings = serde_json::json!({
        "rounds": rounds,
        "candidates": args.candidates,
        "ttl_ms": args.backends.iter().map(|b| (b.name(), scenario::ttl(*b).as_millis() as u64)).collect::<std::collections::BTreeMap<_, _>>(),
        "poll_interval_ms": tenure_chaos::observer::POLL_INTERVAL.as_millis() as u64,
        "witness_period_ms": tenure_chaos::witness::ALIVE_PERIOD_MS,
        "clock_rate_inside": scenario::RATE_INSIDE,
        "clock_rate_outside": scenario::RATE_OUTSIDE,
    });
    write(&out.join("results.txt"), &table)?;
    write(&out.join("results.json"), &json_table(&rows, &settings))?;
    Ok(rows.iter().all(Row::passed))
}
