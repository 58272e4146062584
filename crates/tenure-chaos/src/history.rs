//! What the harness records during a run: each candidate's own answers about its leadership, the
//! lines the `tenure run` commands write themselves, and the faults injected.
//!
//! Why a module of its own: the checker must judge a run only from evidence whose origin and error
//! are known, so the evidence has explicit types; and the checker's tests build histories of these
//! types by hand. All times are seconds on the host's `CLOCK_MONOTONIC`, which the harness and the
//! witness commands read alike.

use serde::Serialize;

/// One answer of a candidate's `GET /status`, stamped with when the request was sent and when the
/// answer came back. The candidate computed the answer at some instant between the two, which is
/// the measurement error of a single sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The candidate's identity.
    pub candidate: String,
    /// The election it campaigns in: terms are compared within one election only.
    pub election: String,
    /// When the request was sent.
    pub sent: f64,
    /// When the answer was read (or the request gave up).
    pub received: f64,
    /// What the candidate said.
    pub answer: Answer,
}

/// What a candidate says about itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Answer {
    /// `isLeader: true`: it leads in `term` and keeps leading at most `valid_for` seconds (on its
    /// own clock) unless a renew succeeds.
    Leader {
        /// The fencing term of its tenure.
        term: u64,
        /// `validForSeconds`.
        valid_for: f64,
    },
    /// `isLeader: false`.
    Follower,
    /// No answer (the process is dead, frozen or not yet listening). Proves nothing either way.
    Unreachable,
}

/// Parses the JSON body of `GET /status` of the candidate `identity` into an [`Answer`].
///
/// A leader without a term or a validity is refused: the checker could not judge it, and a
/// candidate that says it leads without them is itself a defect worth reporting. So is an answer
/// from another identity: some other process took the port (a restarted candidate's port can be
/// taken by anyone on the machine), and its beliefs are not this candidate's.
pub fn parse_status(body: &str, identity: &str) -> Result<Answer, String> {
    let value: serde_json::Value = serde_json::from_str(body).map_err(|e| format!("status is not JSON: {e}"))?;
    let answered = value.get("identity").and_then(serde_json::Value::as_str);
    if answered != Some(identity) {
        return Err(format!("the answer is from identity {answered:?}, not {identity:?}"));
    }
    match value.get("isLeader").and_then(serde_json::Value::as_bool) {
        Some(true) => {
            let term = value.get("term").and_then(serde_json::Value::as_u64).ok_or("a leader's status has no term")?;
            let valid_for = value
                .get("validForSeconds")
                .and_then(serde_json::Value::as_f64)
                .ok_or("a leader's status has no validForSeconds")?;
            Ok(Answer::Leader { term, valid_for })
        }
        Some(false) => Ok(Answer::Follower),
        None => Err("status has no boolean isLeader".to_owned()),
    }
}

/// One line a `tenure run` command wrote about itself (see [`crate::witness`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WitnessLine {
    /// When the command wrote it.
    pub at: f64,
    /// The identity of the `tenure run` that started the command.
    pub candidate: String,
    /// `TENURE_TERM` of the command.
    pub term: u64,
    /// `start`, `alive` or `stop`.
    pub kind: WitnessKind,
    /// Whether the fence let the write through: its term was not below a term appended before
    /// it (decided by [`crate::witness::read`] from the log's order; true as parsed).
    pub accepted: bool,
}

/// The kinds of witness lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WitnessKind {
    /// The command started.
    Start,
    /// The command is still running.
    Alive,
    /// The command got SIGTERM and exits.
    Stop,
}

/// Parses one witness line: `NANOSECONDS CANDIDATE TERM start|alive|stop`.
pub fn parse_witness_line(line: &str) -> Result<WitnessLine, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [at, candidate, term, kind] = fields[..] else {
        return Err(format!("witness line {line:?} does not have 4 fields"));
    };
    let at: u64 = at.parse().map_err(|_| format!("witness line {line:?}: bad time"))?;
    let term = term.parse().map_err(|_| format!("witness line {line:?}: bad term"))?;
    let kind = match kind {
        "start" => WitnessKind::Start,
        "alive" => WitnessKind::Alive,
        "stop" => WitnessKind::Stop,
        other => return Err(format!("witness line {line:?}: unknown kind {other}")),
    };
    Ok(WitnessLine { at: at as f64 / 1e9, candidate: candidate.to_owned(), term, kind, accepted: true })
}

/// A fault as injected, for failover times and for the shading of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultSpan {
    /// What was done (`sigkill`, `sigstop`, ...).
    pub kind: String,
    /// The candidate it was done to (empty for the store).
    pub target: String,
    /// When it was injected.
    pub start: f64,
    /// When it was undone (the process thawed, the partition healed) or, for one-shot faults,
    /// the same as `start`.
    pub end: f64,
    /// Whether another tenure must follow: false where the leader may rightly keep leading (a
    /// store restart shorter than the lease, a clock-rate change that breaks nothing).
    pub takeover_expected: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_of_a_leader_gives_term_and_validity() {
        let body = r#"{"leader":"a","identity":"a","isLeader":true,"term":7,"validForSeconds":0.42,"role":"leader"}"#;
        assert_eq!(parse_status(body, "a"), Ok(Answer::Leader { term: 7, valid_for: 0.42 }));
        assert_eq!(parse_status(r#"{"identity":"b","isLeader":false,"term":7}"#, "b"), Ok(Answer::Follower));
    }

    #[test]
    fn a_leader_that_cannot_be_judged_is_refused() {
        assert!(parse_status(r#"{"identity":"a","isLeader":true,"validForSeconds":1.0}"#, "a").is_err());
        assert!(parse_status(r#"{"identity":"a","isLeader":true,"term":3}"#, "a").is_err());
        assert!(parse_status("not json", "a").is_err());
        assert!(parse_status(r#"{"identity":"a"}"#, "a").is_err());
    }

    #[test]
    fn an_answer_from_another_process_on_the_port_is_not_taken_as_the_candidates() {
        let body = r#"{"identity":"someone-else","isLeader":true,"term":7,"validForSeconds":0.42}"#;
        assert!(parse_status(body, "c1").is_err());
        assert!(parse_status(r#"{"isLeader":true,"term":7,"validForSeconds":0.42}"#, "c1").is_err());
    }

    #[test]
    fn witness_lines_parse_and_bad_ones_are_refused() {
        let line = parse_witness_line("1500000000 c1 4 alive").unwrap();
        assert_eq!(line.at, 1.5);
        assert_eq!((line.candidate.as_str(), line.term, line.kind), ("c1", 4, WitnessKind::Alive));
        for bad in ["", "1 c1 4", "x c1 4 alive", "1 c1 4 running", "1 c1 4 alive ok"] {
            assert!(parse_witness_line(bad).is_err(), "{bad:?}");
        }
    }
}
