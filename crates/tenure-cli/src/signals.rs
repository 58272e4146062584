//! The signals that ask tenure to stop: SIGTERM (Kubernetes, systemd), SIGINT (Ctrl-C) and SIGHUP
//! (a closed terminal).
//!
//! Why they are caught: dying on them by default would leave the lock held until the lease runs
//! out, and under `tenure run` could leave the command running without leadership. Caught, they
//! start a graceful stop that releases the lock, so another candidate takes over at once.

use std::io;

use tokio::signal::unix::{signal, Signal, SignalKind};

/// A termination request that arrived, by signal number (for `128 + n` exit statuses and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    /// The signal number.
    pub signal: i32,
    /// Its name, for log lines.
    pub name: &'static str,
}

impl Termination {
    /// The exit status of a process ended by this signal, by shell convention.
    pub fn exit_status(self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(u8::MAX)
    }
}

/// The handlers of the termination signals, installed once at start so that no request is lost
/// while tenure is still starting up.
pub struct TerminationSignals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl TerminationSignals {
    /// Installs the handlers; from now on these signals no longer kill the process.
    pub fn install() -> io::Result<Self> {
        Ok(TerminationSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Waits for the next termination request.
    pub async fn recv(&mut self) -> Termination {
        tokio::select! {
            _ = self.term.recv() => Termination { signal: libc::SIGTERM, name: "SIGTERM" },
            _ = self.int.recv() => Termination { signal: libc::SIGINT, name: "SIGINT" },
            _ = self.hup.recv() => Termination { signal: libc::SIGHUP, name: "SIGHUP" },
        }
    }
}

/// SIGUSR1, the operator's request that a leader step down without stopping (maintenance, a
/// rebalance): the instance resigns and stays a candidate.
///
/// Why a signal: it works the same for `elect` and `run`, needs no port or credentials, and
/// `kill -USR1` is what an operator has at hand on any host or in `kubectl exec`.
pub struct ResignRequests {
    usr1: Signal,
}

impl ResignRequests {
    /// Installs the handler; from now on SIGUSR1 no longer kills the process.
    pub fn install() -> io::Result<Self> {
        Ok(ResignRequests { usr1: signal(SignalKind::user_defined1())? })
    }

    /// Waits for the next request.
    pub async fn recv(&mut self) {
        self.usr1.recv().await;
    }
}

/// Cancels `stop` when standard input reaches its end (the application's pipe closed).
///
/// On a thread of its own, not tokio's stdin: a read in flight would hold up the runtime's
/// shutdown (and so the exit after a `POST /stop`) until the pipe closed.
pub fn stop_when_stdin_closes(stop: tokio_util::sync::CancellationToken) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 256];
        let mut stdin = std::io::stdin().lock();
        while matches!(std::io::Read::read(&mut stdin, &mut buffer), Ok(n) if n > 0) {}
        tracing::info!("standard input closed: the application is gone");
        stop.cancel();
    });
}
