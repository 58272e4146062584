//! Fault injection against real `tenure` processes and real stores, and a checker that judges
//! what the candidates said about themselves: the evidence that "never two leaders" holds outside
//! the simulation, with real processes, sockets, signals and clocks.

pub mod checker;
pub mod history;
