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
/// kube-rs logs every failed request at ERROR from its client builder; the lock already reports
/// each failure once, with context, so those lines are left out unless `RUST_LOG` asks for them.
const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";

/// Installs the global subscriber. Call once, before anything logs.
pub fn init(format: LogFormat) {
    let (filter, bad_filter) = match std::env::var("RUST_LOG") {
        Ok(text) if !text.is_empty() => match EnvFilter::try_new(&text) {
            Ok(filter) => (filter, None),
            Err(error) => (EnvFilter::new(DEFAULT_FILTER), Some((text, error))),
        },
        _ => (EnvFilter::new(DEFAULT_FILTER), None),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(LogWriter).log_internal_errors(false);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).init(),
    }
    if let Some((text, error)) = bad_filter {
        tracing::warn!(rust_log = %text, %error, "ignoring RUST_LOG; logging at {DEFAULT_FILTER}");
    }
}
