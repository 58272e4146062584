//! Fault injection against real `tenure` processes and real stores, and a checker that judges
//! what the candidates said about themselves: the evidence that "never two leaders" holds outside
//! the simulation, with real processes, sockets, signals and clocks.

use std::sync::atomic::{AtomicBool, Ordering};

pub mod checker;
pub mod clock;
pub mod history;
pub mod observer;
pub mod process;
pub mod proxy;
pub mod report;
pub mod scenario;
pub mod stores;
pub mod timeline;
pub mod witness;

/// Why a run could not be carried out (as opposed to what it found, which is the report).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// A file or socket operation failed.
    #[error("{0}")]
    Io(String),
    /// A process (store or candidate) could not be started or did not come up.
    #[error("cannot start {0}")]
    Start(String),
    /// Software or a privilege the run needs is missing.
    #[error("missing: {0}")]
    Missing(String),
    /// The run was interrupted (SIGINT or SIGTERM); everything it started has been stopped.
    #[error("interrupted")]
    Interrupted,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether SIGINT or SIGTERM arrived: every loop of the harness checks it and unwinds, so the
/// guards stop every process it started.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set the flag [`interrupted`] reads instead of killing the harness
/// (which would still take its children along, through their parent-death signal).
pub fn install_interrupt_handler() -> Result<(), ChaosError> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let previous = unsafe { libc::signal(signal, on_interrupt as *const () as libc::sighandler_t) };
        if previous == libc::SIG_ERR {
            return Err(ChaosError::Io(format!("cannot install a handler for signal {signal}")));
        }
    }
    Ok(())
}
