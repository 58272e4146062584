//! `tenure apiserver`: the in-memory Kubernetes API server, for local development and for trying
//! `tenure elect` with the Kubernetes locks and kubectl without a cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tenure_apiserver::{ApiServer, ApiServerConfig};

use crate::logging;
use crate::options::{parse_duration, parse_positive_duration, LogFormat};
use crate::signals::TerminationSignals;
use crate::{error::CliError, exit, output};

/// Serve an in-memory Kubernetes API server (no cluster needed) and write a kubeconfig for it.
#[derive(Debug, Args)]
#[command(long_about = "Serve an in-memory Kubernetes API server and write a kubeconfig for it.\n\n\
        It speaks the real REST protocol for Leases, Endpoints, ConfigMaps, Pods, Services, Events and \
        Namespaces (plus ServiceAccounts, Deployments and RBAC roles, stored but not enforced), so \
        kubectl and `tenure elect` work against it unchanged:\n\n  \
        tenure apiserver --kubeconfig /tmp/tenure.kubeconfig &\n  \
        KUBECONFIG=/tmp/tenure.kubeconfig kubectl get leases -A\n\n\
        Objects live in memory and are gone when it stops. There is no authentication: it listens \
        on loopback unless told otherwise.")]
pub struct ApiServerArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6443")]
    listen: SocketAddr,

    /// Write a kubeconfig pointing at this server to this file.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,

    /// The default namespace of the written kubeconfig's context.
    #[arg(long, value_name = "NAMESPACE", default_value = "default")]
    namespace: String,

    /// How long watches can resume from a past resourceVersion: changes older than this are
    /// forgotten and a watch that needs them gets 410 Expired (a real API server's watch cache
    /// keeps about 75 s), so controllers must list again.
    #[arg(long, value_name = "DURATION", default_value = "75s", value_parser = parse_duration)]
    event_window: Duration,

    /// End every watch after at most this long, whatever timeoutSeconds it asked for (by default,
    /// as asked). In a cluster watches also end early when an API server restarts or a load
    /// balancer cuts long connections; a short value makes clients re-watch within a test.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    max_watch_duration: Option<Duration>,

    /// Log format.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// Runs `tenure apiserver` until SIGTERM or SIGINT; returns the exit status.
pub async fn apiserver(args: ApiServerArgs) -> Result<u8, CliError> {
    logging::init(args.log_format);
    let mut signals = TerminationSignals::install().map_err(CliError::io("install signal handlers"))?;
    let config = ApiServerConfig {
        listen: args.listen,
        event_window: args.event_window,
        max_watch_duration: args.max_watch_duration,
        ..ApiServerConfig::default()
    };
    let mut server = ApiServer::start(config).await.map_err(CliError::io(format!("listen on {}", args.listen)))?;
    if let Some(path) = &args.kubeconfig {
        std::fs::write(path, server.kubeconfig(&args.namespace))
            .map_err(CliError::io(format!("write the kubeconfig {}", path.display())))?;
    }
    // The first line of standard output is the URL, for scripts that start the server on port 0.
    // A closed standard output must not stop the server.
    let _ = output::print_line(&server.url().to_string());
    let stop = server.stop_handle();
    tokio::select! {
        termination = signals.recv() => {
            tracing::info!(signal = termination.name, "stopping");
            server.shutdown().await;
            Ok(exit::SUCCESS)
        }
        _ = server.stopped() => {
            if stop.is_cancelled() { Ok(exit::SUCCESS) } else { Err(CliError::Ended("the API server stopped")) }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        args: ApiServerArgs,
    }

    #[test]
    fn the_event_window_defaults_to_the_watch_cache_s_75_seconds_and_takes_human_durations() {
        let default = Command::try_parse_from(["apiserver"]).unwrap().args;
        assert_eq!(default.event_window, Duration::from_secs(75));
        let short = Command::try_parse_from(["apiserver", "--event-window", "1500ms"]).unwrap().args;
        assert_eq!(short.event_window, Duration::from_millis(1500));
        let error = Command::try_parse_from(["apiserver", "--event-window", "soon"]).unwrap_err();
        assert!(error.to_string().contains("--event-window"), "{error}");
        assert_eq!(default.max_watch_duration, None, "watches last as long as they ask by default");
        let capped = Command::try_parse_from(["apiserver", "--max-watch-duration", "5s"]).unwrap().args;
        assert_eq!(capped.max_watch_duration, Some(Duration::from_secs(5)));
        let error = Command::try_parse_from(["apiserver", "--max-watch-duration", "0s"]).unwrap_err();
        assert!(error.to_string().contains("longer than zero"), "zero would make clients re-watch in a loop: {error}");
    }
}
