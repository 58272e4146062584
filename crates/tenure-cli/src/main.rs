//! `tenure`: leader election for replicated services, from the command line.
//!
//! - `tenure elect`: a drop-in for the retired leader-elector:0.5 sidecar.
//! - `tenure run -- CMD`: run a command on one host at a time (like `consul lock`).
//! - `tenure status`: who holds a lock, read once.
//! - `tenure break-lock`: free a lock that no live holder renews.
//! - `tenure apiserver`: an in-memory Kubernetes API server to develop and test against.
//! - `tenure demo`: three candidates, a crash and a handover, measured, with no setup.
//!
//! This file parses the command line and turns every outcome into an exit status; each
//! subcommand lives in its own module.

mod apiserver;
mod backend;
mod break_lock;
mod child;
mod command_tree;
mod containment;
mod coordinate;
mod demo;
mod elect;
mod error;
mod exit;
mod fencing;
mod http;
mod lock_access;
mod lock_scope;
mod logging;
mod member;
mod options;
mod output;
mod pod_label;
mod probe;
mod run;
mod signals;
mod startup_pages;
mod status;
mod supervisor;
mod write;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};
use error::CliError;

/// Leader election for replicated services.
///
/// Several replicas run the same command with the same --election; exactly one of them leads at
/// a time, a crashed leader is replaced when its lease runs out, and a leader that is stopped
/// hands over at once.
#[derive(Debug, Parser)]
#[command(name = "tenure", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Elect(elect::ElectArgs),
    Run(run::RunArgs),
    Status(status::StatusArgs),
    BreakLock(break_lock::BreakLockArgs),
    Demo(demo::DemoArgs),
    Apiserver(apiserver::ApiServerArgs),
    Member(member::MemberArgs),
    Coordinate(coordinate::CoordinateArgs),
    Write(write::WriteArgs),
    /// Internal: the process between `tenure run` and its command.
    #[command(hide = true)]
    Supervise(supervisor::SuperviseArgs),
}

/// Makes ring the process's TLS crypto provider. The Kubernetes client, tonic (etcd) and
/// zookeeper-client build their rustls configurations with the process default; with the feature
/// `zk-tls` a second provider (aws-lc-rs) is compiled in and rustls would refuse to guess.
fn select_crypto_provider() {
    // Err: one is installed already, which is all that is needed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn main() -> ExitCode {
    startup_pages::remember_loaded_files();
    select_crypto_provider();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return ExitCode::from(report_usage_error(&error)),
    };
    // Runs once the runtime is there.
    let command = async {
        match cli.command {
            Command::Elect(args) => elect::elect(args).await,
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::BreakLock(args) => break_lock::break_lock(args).await,
            Command::Demo(args) => demo::demo(args).await,
            Command::Apiserver(args) => apiserver::apiserver(args).await,
            Command::Member(args) => member::member(args).await,
            Command::Coordinate(args) => coordinate::coordinate(args).await,
            Command::Write(args) => write::write(args).await,
            Command::Supervise(args) => supervisor::supervise(args).await,
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let outcome = runtime.map_err(CliError::io("start the async runtime")).and_then(|rt| rt.block_on(command));
    let status = outcome.unwrap_or_else(|error| {
        output::error_line(&format!("tenure: error: {error}"));
        error.exit_status()
    });
    output::flush_logs(FINAL_FLUSH);
    ExitCode::from(status)
}

/// How long the last log lines may take to reach standard error before tenure exits anyway (a
/// standard error that nobody reads must not keep tenure alive).
const FINAL_FLUSH: std::time::Duration = std::time::Duration::from_millis(500);

/// Prints help and version as clap does, and usage errors on one line; returns the exit status.
fn report_usage_error(error: &clap::Error) -> u8 {
    if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
        || error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    {
        let _ = error.print();
        return if error.use_stderr() { exit::USAGE } else { exit::SUCCESS };
    }
    output::error_line(&format!("tenure: {}", one_line(&error.render().to_string())));
    output::flush_logs(FINAL_FLUSH);
    exit::USAGE
}

/// clap's error message without its usage block and hint, joined into one line, pointing to the
/// help of the subcommand it is about.
fn one_line(rendered: &str) -> String {
    let mut line = String::new();
    let mut help = "tenure --help".to_owned();
    for part in rendered.lines().map(str::trim) {
        if let Some(usage) = part.strip_prefix("Usage: ") {
            let words: Vec<&str> =
                usage.split_whitespace().take_while(|w| w.chars().all(|c| c.is_ascii_lowercase())).collect();
            if !words.is_empty() {
                help = format!("{} --help", words.join(" "));
            }
            continue;
        }
        if part.is_empty() || part.starts_with("For more information") {
            continue;
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(part);
    }
    line.push_str(&format!(" (see '{help}')"));
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_fit_on_one_line() {
        let error = Cli::try_parse_from(["tenure", "elect"]).unwrap_err();
        let line = one_line(&error.render().to_string());
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("--election"), "{line}");
        assert!(line.ends_with("(see 'tenure elect --help')"), "{line}");
    }

    #[test]
    fn command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
