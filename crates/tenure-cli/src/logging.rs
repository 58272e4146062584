//! Log lines on standard error, where a sidecar's logs are collected.
//!
//! Why it matters: the library reports every leadership change as a tracing event ("started
//! leading", "stopped leading", "leader observed"); this turns them into text for people or JSON
//! for log collectors, filtered by `RUST_LOG` like any tracing-based program.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::options::LogFormat;
use crate::output::LogWriter;

/// The filter used when `RUST_LOG` is unset or unusable: leadership changes, warnings, errors.
/// kube-rs logs every failed request at ERROR from its client builder, and the ZooKeeper client
/// logs each connection attempt at INFO and WARN (several per start, one every second or so in an
/// outage); the electors already report what matters once, with context and in the same words on
/// every backend, so those lines are left out unless `RUST_LOG` asks for them
/// (`RUST_LOG=info,zookeeper_client=info`).
const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off,zookeeper_client=error";

/// The filter for a `RUST_LOG` value (`None`: unset), and the value with its error when it is
/// unusable (then the default applies).
fn filter_for(rust_log: Option<String>) -> (EnvFilter, Option<(String, tracing_subscriber::filter::ParseError)>) {
    match rust_log {
        Some(text) if !text.is_empty() => match EnvFilter::try_new(&text) {
            Ok(filter) => (filter, None),
            Err(error) => (EnvFilter::new(DEFAULT_FILTER), Some((text, error))),
        },
        _ => (EnvFilter::new(DEFAULT_FILTER), None),
    }
}

/// Installs the global subscriber. Call once, before anything logs.
pub fn init(format: LogFormat) {
    let (filter, bad_filter) = filter_for(std::env::var("RUST_LOG").ok());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(LogWriter).log_internal_errors(false);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).init(),
    }
    if let Some((text, error)) = bad_filter {
        tracing::warn!(rust_log = %text, %error, "ignoring RUST_LOG; logging at {DEFAULT_FILTER}");
    }
}

#[cfg(test)]
mod tests {
    use tracing::Level;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Whether an event at `level` with `target` passes the filter for `rust_log`.
    fn passes(rust_log: Option<&str>, target: &'static str, level: Level) -> bool {
        let (filter, _) = filter_for(rust_log.map(str::to_owned));
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let layer = Recorder(seen.clone());
        let subscriber = tracing_subscriber::registry().with(filter).with(layer);
        tracing::subscriber::with_default(subscriber, || match (target, level) {
            ("zookeeper_client::session", Level::INFO) => {
                tracing::info!(target: "zookeeper_client::session", "enter state Connecting")
            }
            ("zookeeper_client::session", Level::WARN) => {
                tracing::warn!(target: "zookeeper_client::session", "fail to connect to cluster")
            }
            ("zookeeper_client::session", Level::ERROR) => {
                tracing::error!(target: "zookeeper_client::session", "session failed")
            }
            ("tenure_zk::driver", Level::INFO) => tracing::info!(target: "tenure_zk::driver", "leader observed"),
            _ => unreachable!("no such case in these tests"),
        });
        seen.load(std::sync::atomic::Ordering::SeqCst)
    }

    struct Recorder(std::sync::Arc<std::sync::atomic::AtomicBool>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
        fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn the_zookeeper_clients_chatter_stays_out_of_the_default_log_but_its_errors_do_not() {
        assert!(!passes(None, "zookeeper_client::session", Level::INFO));
        assert!(!passes(None, "zookeeper_client::session", Level::WARN));
        assert!(passes(None, "zookeeper_client::session", Level::ERROR));
        assert!(passes(None, "tenure_zk::driver", Level::INFO), "the elector's own lines stay");
    }

    #[test]
    fn rust_log_can_turn_the_zookeeper_clients_lines_on() {
        assert!(passes(Some("info"), "zookeeper_client::session", Level::INFO));
        assert!(passes(Some("warn,zookeeper_client=warn"), "zookeeper_client::session", Level::WARN));
        let unusable = "info,zookeeper_client=loud";
        assert!(filter_for(Some(unusable.to_owned())).1.is_some(), "{unusable} is rejected");
        assert!(!passes(Some(unusable), "zookeeper_client::session", Level::INFO), "bad RUST_LOG: the default");
        assert!(passes(Some(unusable), "zookeeper_client::session", Level::ERROR), "bad RUST_LOG: the default");
    }
}
