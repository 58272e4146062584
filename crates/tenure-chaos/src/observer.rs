//! Asks each `tenure elect` candidate what it believes, every few tens of milliseconds, and keeps
//! every answer with its send and receive times.
//!
//! Why polling `/status` rather than following `/events`: the checker needs the candidate's own
//! self-fenced judgement (`isLeader` is computed at the instant of the request against its
//! monotonic clock), and a frozen or dead candidate must show up as a gap; a push stream would
//! say nothing at the moment a lease lapses without an event.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::now;
use crate::history::{parse_status, Answer, Sample};

/// Time between two requests to one candidate.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);
/// How long one request may take before it counts as unanswered (a frozen candidate's kernel
/// still accepts the connection, so the read must time out).
pub const REQUEST_TIMEOUT: Duration = Duration::from_millis(250);

/// The samples of all candidates, shared with the polling threads.
#[derive(Clone, Default)]
pub struct Recorder {
    samples: Arc<Mutex<Vec<Sample>>>,
    protocol_errors: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    /// Everything recorded so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Answers that were not a valid status (a candidate saying it leads without a term, ...).
    pub fn protocol_errors(&self) -> Vec<String> {
        self.protocol_errors.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The last answer of `candidate` and when it arrived.
    pub fn latest(&self, candidate: &str) -> Option<(f64, Answer)> {
        let samples = self.samples.lock().ok()?;
        samples.iter().rev().find(|s| s.candidate == candidate).map(|s| (s.received, s.answer.clone()))
    }

    fn push(&self, sample: Sample) {
        if let Ok(mut samples) = self.samples.lock() {
            samples.push(sample);
        }
    }
}

/// A polling thread for one candidate; stops when dropped.
pub struct Poller {
    stop: Arc<AtomicBool>,
    address: Arc<Mutex<SocketAddr>>,
}

impl Poller {
    /// Starts polling `candidate` (of `election`) at `address` into `recorder`.
    pub fn start(candidate: &str, election: &str, address: SocketAddr, recorder: Recorder) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let shared_address = Arc::new(Mutex::new(address));
        let current = shared_address.clone();
        let candidate = candidate.to_owned();
        let election = election.to_owned();
        std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                let sent = now();
                let address = current.lock().map(|a| *a).unwrap_or(address);
                let answer = match get_status(address) {
                    Some(body) => match parse_status(&body, &candidate) {
                        Ok(answer) => answer,
                        Err(error) => {
                            if let Ok(mut errors) = recorder.protocol_errors.lock() {
                                errors.push(format!("{candidate}: {error}: {body}"));
                            }
                            Answer::Unreachable
                        }
                    },
                    None => Answer::Unreachable,
                };
                let received = now();
                let (candidate, election) = (candidate.clone(), election.clone());
                recorder.push(Sample { candidate, election, sent, received, answer });
                let spent = Duration::from_secs_f64((received - sent).max(0.0));
                std::thread::sleep(POLL_INTERVAL.saturating_sub(spent));
            }
        });
        Poller { stop, address: shared_address }
    }

    /// Polls another address from now on (the candidate was restarted on a new port).
    pub fn set_address(&self, address: SocketAddr) {
        if let Ok(mut current) = self.address.lock() {
            *current = address;
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// `GET /status`: the body of a 200 answer.
fn get_status(address: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&address, REQUEST_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT)).ok()?;
    write!(stream, "GET /status HTTP/1.1\r\nHost: chaos\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.starts_with("HTTP/1.1 200").then_some(())?;
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
}
