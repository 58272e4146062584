//! Command-line options shared by several subcommands, and the parsers that turn their text into
//! checked values. Why here: a bad value must be refused the same way (one line, exit status 2)
//! whichever subcommand it was given to, before anything is started.

use std::time::Duration;

use clap::{Args, ValueEnum};
use tenure::Timing;

use crate::lock_url::LockUrl;

/// The options that name an election and its lock.
#[derive(Debug, Clone, Args)]
pub struct ElectionOptions {
    /// Name of the election; candidates with the same name on the same lock elect one leader.
    #[arg(long, value_name = "NAME", value_parser = parse_election_name)]
    pub election: String,

    /// Where the lock lives: file:///absolute/path, or memory: (this process only).
    /// [default: a file named after the election in the per-user runtime directory]
    #[arg(long, value_name = "URL")]
    pub lock: Option<LockUrl>,
}

/// The options of a candidate: who it is and how fast the election moves.
#[derive(Debug, Clone, Args)]
pub struct CandidateOptions {
    /// Identity of this candidate, as written into the lock and answered over HTTP.
    /// [default: the host name]
    #[arg(long, value_name = "ID", value_parser = parse_identity)]
    pub id: Option<String>,

    /// Lease time, as in leader-elector: the lease lasts TTL, the leader gives up if it cannot
    /// renew within TTL/2, and renews every TTL/4. Examples: 10s, 1500ms, 1m.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_ttl)]
    pub ttl: Ttl,

    /// Format of the log lines on standard error. The level filter is read from RUST_LOG
    /// (default: info).
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl CandidateOptions {
    /// The identity to campaign with: `--id`, or else the host name (what leader-elector did,
    /// which makes it the pod name in Kubernetes).
    pub fn identity(&self) -> Result<String, String> {
        if let Some(id) = &self.id {
            return Ok(id.clone());
        }
        let hostname = nix::unistd::gethostname().map_err(|e| format!("cannot read the host name for --id: {e}"))?;
        let hostname = hostname.into_string().map_err(|_| "the host name is not UTF-8; pass --id".to_owned())?;
        if hostname.is_empty() {
            return Err("the host name is empty; pass --id".to_owned());
        }
        Ok(hostname)
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// A `--ttl` together with the election timing it maps to, checked at parse time so that an
/// impossible timing is a usage error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ttl {
    /// The duration as given.
    pub ttl: Duration,
    /// lease = ttl, renew deadline = ttl/2, retry = ttl/4.
    pub timing: Timing,
}

/// Parses a human duration ("5s", "1500ms", "1m 30s").
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 5s, 1500ms, 1m)"))
}

/// Parses `--ttl` and checks the timing it maps to.
pub fn parse_ttl(text: &str) -> Result<Ttl, String> {
    let ttl = parse_duration(text)?;
    let timing = Timing::from_ttl(ttl).map_err(|e| format!("ttl {text} gives an invalid timing: {e}"))?;
    Ok(Ttl { ttl, timing })
}

/// An election name becomes part of a file name and of Kubernetes object names: refuse what
/// could never work in either.
pub fn parse_election_name(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("the election name must not be empty".to_owned());
    }
    if text == "." || text == ".." || text.contains('/') {
        return Err("the election name must not contain '/' or be '.' or '..'".to_owned());
    }
    if text.chars().any(char::is_control) {
        return Err("the election name must not contain control characters".to_owned());
    }
    Ok(text.to_owned())
}

/// An identity must be non-empty: the lock tells holders apart by it, and an empty holder means
/// "free".
pub fn parse_identity(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("the identity must not be empty".to_owned());
    }
    Ok(text.to_owned())
}

/// An `--http` address: `host:port`, or `:port` for all interfaces (as leader-elector accepted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAddress(pub String);

/// Parses `--http`.
pub fn parse_http_address(text: &str) -> Result<HttpAddress, String> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("expected host:port or :port, e.g. 127.0.0.1:4040".to_owned());
    };
    port.parse::<u16>().map_err(|_| format!("'{port}' is not a port number"))?;
    let host = if host.is_empty() { "0.0.0.0" } else { host };
    Ok(HttpAddress(format!("{host}:{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_maps_like_leader_elector_and_rejects_impossible_timings() {
        let ttl = parse_ttl("2s").unwrap();
        assert_eq!(ttl.timing.renew_deadline, Duration::from_secs(1));
        assert_eq!(ttl.timing.retry_period, Duration::from_millis(500));
        assert_eq!(parse_ttl("1500ms").unwrap().ttl, Duration::from_millis(1500));
        assert!(parse_ttl("500ms").is_err());
        assert!(parse_ttl("five").is_err());
        assert!(parse_ttl("0s").is_err());
    }

    #[test]
    fn http_address_accepts_go_style_port_only() {
        assert_eq!(parse_http_address(":4040"), Ok(HttpAddress("0.0.0.0:4040".into())));
        assert_eq!(parse_http_address("127.0.0.1:0"), Ok(HttpAddress("127.0.0.1:0".into())));
        assert_eq!(parse_http_address("[::1]:80"), Ok(HttpAddress("[::1]:80".into())));
        assert!(parse_http_address("4040").is_err());
        assert!(parse_http_address("host:http").is_err());
    }

    #[test]
    fn election_names_that_cannot_be_files_are_refused() {
        assert!(parse_election_name("kuryr-controller").is_ok());
        for bad in ["", ".", "..", "a/b", "a\nb"] {
            assert!(parse_election_name(bad).is_err(), "{bad:?}");
        }
    }
}
