//! The checker: judges a recorded run for "never two leaders", terms that only grow, commands of
//! `tenure run` that never run at once, and how fast a new leader took over after each fault.
//!
//! Why it is built this way: a checker that reports a dual leader where there was none is
//! ignored, and one that misses a real one proves nothing. So it separates what the evidence
//! proves from what it merely allows.
//!
//! **Beliefs from samples.** A `/status` answer was computed at some unknown instant between the
//! request's `sent` and `received` times. Consecutive `isLeader: true` answers with the same term
//! are one tenure, and the candidate certainly believed it led for the whole of
//! `[received of the first, sent of the last]` (its *certain span*), and at one instant inside
//! each sample's own window. It possibly believed it led from the previous answer that said
//! otherwise until the next answer that said otherwise, or, when no such answer came (killed,
//! frozen, partitioned from the harness), until `last answer + renew deadline / (1 - drift)`: a
//! renew the harness did not see can extend a belief by at most the renew deadline, on a clock
//! that may run slow by the drift bound. (`validForSeconds` is on the candidate's own clock, so it
//! is not trusted as a real-time bound.)
//!
//! **Dual leader** (a violation): two candidates' certain spans overlap, or one candidate's
//! sample window lies inside another's certain span. **Possible overlap** (reported, not a
//! violation): only the possible spans overlap; the measurement error is the poll interval plus
//! the request latency on either side.
//!
//! **Terms** (a violation): ordered by when they were first seen, the terms of tenures must
//! strictly grow, except that one candidate may be seen again in the term it already held when no
//! other tenure came between (a renew that was in flight when its answer said `false`).
//!
//! **Commands** (a violation, unless the fault is a documented limitation): two `tenure run`
//! commands with different terms whose witness lines interleave in time. Error: a command may live
//! up to one witness period after its last line, so only overlaps proved by lines are counted.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::history::{Answer, FaultSpan, Sample, WitnessKind, WitnessLine};

/// What the checker needs to know about the election's timing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CheckTiming {
    /// The candidates' renew deadline in seconds (a leader's belief outlives its last renew by at
    /// most this, on its own clock).
    pub renew_deadline: f64,
    /// The largest clock-rate error allowed for (`Timing::max_clock_drift`), below 1.
    pub drift: f64,
}

/// One tenure of one candidate as its own answers show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tenure {
    /// Who believed it led.
    pub candidate: String,
    /// In which election.
    pub election: String,
    /// In which term.
    pub term: u64,
    /// The `[sent, received]` window of every answer that said so.
    pub windows: Vec<(f64, f64)>,
    /// The earliest instant the belief may have begun.
    pub possible_start: f64,
    /// The latest instant the belief may have lasted to.
    pub possible_end: f64,
}

impl Tenure {
    /// The span in which the candidate certainly believed it led, if its answers prove one.
    pub fn certain_span(&self) -> Option<(f64, f64)> {
        let start = self.windows.first()?.1;
        let end = self.windows.last()?.0;
        (start < end).then_some((start, end))
    }

    /// The first instant at which the belief is proved (the first answer's arrival).
    pub fn first_seen(&self) -> f64 {
        self.windows.first().map_or(self.possible_start, |w| w.1)
    }

    /// The last instant at which the belief is proved.
    pub fn last_seen(&self) -> f64 {
        self.windows.last().map_or(self.possible_end, |w| w.0)
    }
}

/// Two beliefs (or two commands) that overlapped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overlap {
    /// One side: candidate and term.
    pub first: (String, u64),
    /// The other side.
    pub second: (String, u64),
    /// Where the overlap begins.
    pub at: f64,
    /// How long it lasts at least (0 for an overlap proved at one instant).
    pub seconds: f64,
}

/// A term that did not grow.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TermRegression {
    /// The candidate seen leading in the term.
    pub candidate: String,
    /// The term it led in.
    pub term: u64,
    /// The highest term seen before it.
    pub previous: u64,
    /// When it was first seen.
    pub at: f64,
}

/// What happened after one fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundOutcome {
    /// The fault.
    pub fault: FaultSpan,
    /// Seconds from the fault to the first proof of a newer tenure, if one came.
    pub failover: Option<f64>,
}

/// The checker's findings about one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Verdict {
    /// Proved dual leaders.
    pub dual_leaders: Vec<Overlap>,
    /// Overlaps that only the measurement error allows.
    pub possible_overlaps: Vec<Overlap>,
    /// Terms that repeated or went back.
    pub term_regressions: Vec<TermRegression>,
    /// `tenure run` commands alive at once.
    pub command_overlaps: Vec<Overlap>,
    /// Witness writes the fencing check refused.
    pub fenced_writes: usize,
    /// The outcome of each fault.
    pub rounds: Vec<RoundOutcome>,
}

impl Verdict {
    /// Rounds whose fault required a takeover that did not come.
    pub fn rounds_without_takeover(&self) -> usize {
        self.rounds.iter().filter(|r| r.fault.takeover_expected && r.failover.is_none()).count()
    }

    /// Failover times in seconds of the rounds that had one.
    pub fn failovers(&self) -> Vec<f64> {
        self.rounds.iter().filter_map(|r| r.failover).collect()
    }
}

/// Splits the samples into tenures (see the module documentation for the spans).
pub fn tenures(samples: &[Sample], timing: CheckTiming) -> Vec<Tenure> {
    let slack = timing.renew_deadline / (1.0 - timing.drift.clamp(0.0, 0.9));
    let by_candidate: BTreeSet<&str> = samples.iter().map(|s| s.candidate.as_str()).collect();
    let mut found = Vec::new();
    for candidate in by_candidate {
        let mut own: Vec<&Sample> = samples.iter().filter(|s| s.candidate == candidate).collect();
        own.sort_by(|a, b| a.sent.total_cmp(&b.sent));
        let mut current: Option<Tenure> = None;
        let mut last_denial = own.first().map_or(0.0, |s| s.sent);
        for sample in &own {
            match sample.answer {
                Answer::Leader { term, .. } => {
                    if let Some(tenure) = current.as_mut().filter(|t| t.term == term) {
                        tenure.windows.push((sample.sent, sample.received));
                        continue;
                    }
                    if let Some(mut ended) = current.take() {
                        ended.possible_end = sample.received;
                        last_denial = ended.last_seen();
                        found.push(ended);
                    }
                    current = Some(Tenure {
                        candidate: candidate.to_owned(),
                        election: sample.election.clone(),
                        term,
                        windows: vec![(sample.sent, sample.received)],
                        possible_start: last_denial,
                        possible_end: f64::INFINITY,
                    });
                }
                Answer::Follower => {
                    if let Some(mut ended) = current.take() {
                        ended.possible_end = sample.received;
                        found.push(ended);
                    }
                    last_denial = sample.received;
                }
                Answer::Unreachable => {
                    if let Some(tenure) = current.as_mut().filter(|t| t.possible_end.is_infinite()) {
                        // The first answer missed: a renew may have happened until now.
                        tenure.possible_end = sample.received + slack;
                    }
                }
            }
        }
        if let Some(mut ended) = current.take() {
            if ended.possible_end.is_infinite() {
                ended.possible_end = ended.windows.last().map_or(0.0, |w| w.1) + slack;
            }
            found.push(ended);
        }
    }
    found.sort_by(|a, b| a.first_seen().total_cmp(&b.first_seen()));
    found
}

/// The proved overlap of two tenures of different candidates, if any.
fn proved_overlap(a: &Tenure, b: &Tenure) -> Option<(f64, f64)> {
    if let (Some(sa), Some(sb)) = (a.certain_span(), b.certain_span()) {
        let (start, end) = (sa.0.max(sb.0), sa.1.min(sb.1));
        if start < end {
            return Some((start, end - start));
        }
    }
    for (inner, outer) in [(a, b), (b, a)] {
        let Some((from, to)) = outer.certain_span() else { continue };
        if let Some(window) = inner.windows.iter().find(|w| from <= w.0 && w.1 <= to) {
            return Some((window.0, 0.0));
        }
    }
    None
}

/// Checks the tenures for dual leaders, possible overlaps and terms.
fn check_tenures(tenures: &[Tenure], verdict: &mut Verdict) {
    for (i, a) in tenures.iter().enumerate() {
        for b in &tenures[i + 1..] {
            if a.candidate == b.candidate || (b.possible_start >= a.possible_end && b.first_seen() >= a.possible_end) {
                continue;
            }
            let sides = ((a.candidate.clone(), a.term), (b.candidate.clone(), b.term));
            if let Some((at, seconds)) = proved_overlap(a, b) {
                verdict.dual_leaders.push(Overlap { first: sides.0, second: sides.1, at, seconds });
            } else {
                let start = a.possible_start.max(b.possible_start);
                let end = a.possible_end.min(b.possible_end);
                if start < end {
                    let (first, second, seconds) = (sides.0, sides.1, end - start);
                    verdict.possible_overlaps.push(Overlap { first, second, at: start, seconds });
                }
            }
        }
    }
    let elections: BTreeSet<&str> = tenures.iter().map(|t| t.election.as_str()).collect();
    for election in elections {
        check_terms(tenures.iter().filter(|t| t.election == election), verdict);
    }
}

/// Checks that the terms of one election's tenures, in the order they were seen, grow.
fn check_terms<'a>(tenures: impl Iterator<Item = &'a Tenure>, verdict: &mut Verdict) {
    let mut highest: Option<&Tenure> = None;
    for tenure in tenures {
        if let Some(previous) = highest {
            let same_tenure_seen_again = previous.candidate == tenure.candidate && previous.term == tenure.term;
            if tenure.term <= previous.term && !same_tenure_seen_again {
                verdict.term_regressions.push(TermRegression {
                    candidate: tenure.candidate.clone(),
                    term: tenure.term,
                    previous: previous.term,
                    at: tenure.first_seen(),
                });
            }
        }
        if highest.is_none_or(|h| tenure.term > h.term || (tenure.term == h.term && tenure.candidate == h.candidate)) {
            highest = Some(tenure);
        }
    }
}

/// One run of a `tenure run` command: the times of its witness lines, in order.
#[derive(Debug, Clone, PartialEq)]
struct CommandRun {
    candidate: String,
    term: u64,
    times: Vec<f64>,
}

impl CommandRun {
    fn first(&self) -> f64 {
        self.times.first().copied().unwrap_or(f64::INFINITY)
    }

    fn last(&self) -> f64 {
        self.times.last().copied().unwrap_or(f64::NEG_INFINITY)
    }
}

/// Checks the witness lines for commands alive at once; counts fenced writes.
///
/// An older run overlaps a newer one when it wrote lines between the newer run's first and last
/// line. The overlap lasts from the first to the last such line: what the older command did while
/// the newer one ran. (A frozen command writes nothing, so its frozen time does not count.)
fn check_witness(lines: &[WitnessLine], verdict: &mut Verdict) {
    let mut runs: Vec<CommandRun> = Vec::new();
    for line in lines {
        if !line.accepted {
            verdict.fenced_writes += 1;
        }
        match runs.iter_mut().find(|r| r.candidate == line.candidate && r.term == line.term) {
            Some(run) => run.times.push(line.at),
            None => runs.push(CommandRun { candidate: line.candidate.clone(), term: line.term, times: vec![line.at] }),
        }
    }
    for run in &mut runs {
        run.times.sort_by(f64::total_cmp);
    }
    runs.sort_by(|a, b| a.term.cmp(&b.term).then(a.first().total_cmp(&b.first())));
    for (i, older) in runs.iter().enumerate() {
        for newer in &runs[i + 1..] {
            let mut inside = older.times.iter().filter(|t| newer.first() <= **t && **t <= newer.last());
            let Some(&from) = inside.next() else { continue };
            let to = inside.next_back().copied().unwrap_or(from);
            verdict.command_overlaps.push(Overlap {
                first: (older.candidate.clone(), older.term),
                second: (newer.candidate.clone(), newer.term),
                at: from,
                seconds: to - from,
            });
        }
    }
}

/// The first proof of a tenure newer than every tenure of the same election proved before
/// `at`: seconds after `at`. Starts are (when, term, election); `election` `None` compares all.
fn next_takeover(starts: &[(f64, u64, &str)], at: f64, election: Option<&str>) -> Option<f64> {
    let same = |e: &str| election.is_none_or(|wanted| wanted == e);
    let before =
        starts.iter().filter(|(seen, _, e)| *seen <= at && same(e)).map(|(_, term, _)| *term).max().unwrap_or(0);
    starts
        .iter()
        .filter(|(seen, term, e)| *seen > at && *term > before && same(e))
        .map(|(seen, _, _)| seen - at)
        .reduce(f64::min)
}

/// Judges a whole run. `witness` may be empty (no `tenure run` candidates); tenure starts come
/// from the samples and from the commands' start lines.
pub fn check(samples: &[Sample], witness: &[WitnessLine], faults: &[FaultSpan], timing: CheckTiming) -> Verdict {
    let mut verdict = Verdict::default();
    let tenures = tenures(samples, timing);
    check_tenures(&tenures, &mut verdict);
    check_witness(witness, &mut verdict);
    let mut starts: Vec<(f64, u64, &str)> =
        tenures.iter().map(|t| (t.first_seen(), t.term, t.election.as_str())).collect();
    starts.extend(witness.iter().filter(|l| l.kind == WitnessKind::Start).map(|l| (l.at, l.term, "")));
    verdict.rounds = faults
        .iter()
        .map(|fault| {
            let election = tenures.iter().find(|t| t.candidate == fault.target).map(|t| t.election.as_str());
            RoundOutcome { fault: fault.clone(), failover: next_takeover(&starts, fault.start, election) }
        })
        .collect();
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: CheckTiming = CheckTiming { renew_deadline: 0.5, drift: 1.0 / 3.0 };

    /// Samples of `candidate` every 50 ms from `from` to `to` (exclusive), 5 ms round trips.
    fn answers(candidate: &str, from: f64, to: f64, answer: Answer) -> Vec<Sample> {
        let mut samples = Vec::new();
        let mut t = from;
        while t < to - 1e-9 {
            samples.push(Sample {
                candidate: candidate.to_owned(),
                election: "e".to_owned(),
                sent: t,
                received: t + 0.005,
                answer: answer.clone(),
            });
            t += 0.05;
        }
        samples
    }

    fn leader(term: u64) -> Answer {
        Answer::Leader { term, valid_for: 0.4 }
    }

    fn fault(start: f64, takeover_expected: bool) -> FaultSpan {
        FaultSpan { kind: "sigkill".into(), target: "a".into(), start, end: start, takeover_expected }
    }

    fn witness(at: f64, candidate: &str, term: u64, kind: WitnessKind, accepted: bool) -> WitnessLine {
        WitnessLine { at, candidate: candidate.into(), term, kind, accepted }
    }

    #[test]
    fn clean_failover_after_a_kill_passes_and_is_timed() {
        let mut samples = answers("a", 0.0, 2.0, leader(1));
        samples.extend(answers("a", 2.0, 2.2, Answer::Unreachable));
        samples.extend(answers("b", 0.0, 3.0, Answer::Follower));
        samples.extend(answers("b", 3.0, 4.0, leader(2)));
        let verdict = check(&samples, &[], &[fault(2.0, true)], TIMING);
        assert!(verdict.dual_leaders.is_empty(), "{verdict:?}");
        assert!(verdict.term_regressions.is_empty());
        assert_eq!(verdict.rounds_without_takeover(), 0);
        let failover = verdict.failovers()[0];
        assert!((failover - 1.005).abs() < 1e-9, "{failover}");
    }

    #[test]
    fn two_candidates_answering_leader_at_once_are_a_dual_leader() {
        let mut samples = answers("a", 0.0, 2.0, leader(1));
        samples.extend(answers("b", 0.0, 1.5, Answer::Follower));
        samples.extend(answers("b", 1.5, 3.0, leader(2)));
        let verdict = check(&samples, &[], &[], TIMING);
        assert_eq!(verdict.dual_leaders.len(), 1, "{verdict:?}");
        let overlap = &verdict.dual_leaders[0];
        assert_eq!((overlap.first.0.as_str(), overlap.second.0.as_str()), ("a", "b"));
        assert!((overlap.seconds - 0.445).abs() < 1e-6, "{overlap:?}");
    }

    #[test]
    fn a_single_leader_answer_inside_another_tenure_is_a_dual_leader() {
        let mut samples = answers("a", 0.0, 2.0, leader(1));
        samples.push(Sample {
            candidate: "b".into(),
            election: "e".into(),
            sent: 1.0,
            received: 1.01,
            answer: leader(1),
        });
        let verdict = check(&samples, &[], &[], TIMING);
        assert_eq!(verdict.dual_leaders.len(), 1, "{verdict:?}");
        assert_eq!(verdict.dual_leaders[0].seconds, 0.0);
    }

    #[test]
    fn beliefs_that_touch_only_within_the_measurement_error_are_not_violations() {
        // a's last answer was sent at 0.95 and b's first arrived at 1.005: a may still have
        // believed at b's first answer, but nothing proves it.
        let mut samples = answers("a", 0.0, 1.0, leader(1));
        samples.extend(answers("a", 1.0, 1.2, Answer::Unreachable));
        samples.extend(answers("b", 1.0, 2.0, leader(2)));
        let verdict = check(&samples, &[], &[], TIMING);
        assert!(verdict.dual_leaders.is_empty(), "{verdict:?}");
        assert_eq!(verdict.possible_overlaps.len(), 1);
    }

    #[test]
    fn terms_that_go_back_or_repeat_on_another_candidate_are_violations() {
        let mut samples = answers("a", 0.0, 1.0, leader(5));
        samples.extend(answers("a", 1.0, 3.0, Answer::Follower));
        samples.extend(answers("b", 1.5, 2.0, leader(5)));
        samples.extend(answers("b", 2.0, 2.5, Answer::Follower));
        samples.extend(answers("c", 2.5, 3.0, leader(4)));
        let verdict = check(&samples, &[], &[], TIMING);
        assert!(verdict.dual_leaders.is_empty(), "{verdict:?}");
        let found: Vec<(String, u64, u64)> =
            verdict.term_regressions.iter().map(|r| (r.candidate.clone(), r.term, r.previous)).collect();
        assert_eq!(found, vec![("b".into(), 5, 5), ("c".into(), 4, 5)]);
    }

    #[test]
    fn terms_of_different_elections_are_not_compared() {
        let mut samples = answers("a", 0.0, 1.0, leader(5));
        samples.extend(answers("a", 1.0, 1.5, Answer::Follower));
        let mut other = answers("b", 1.5, 2.0, leader(1));
        for sample in &mut other {
            sample.election = "f".into();
        }
        samples.extend(other);
        let verdict = check(&samples, &[], &[], TIMING);
        assert!(verdict.term_regressions.is_empty(), "{verdict:?}");
    }

    #[test]
    fn a_takeover_is_a_newer_term_of_the_faulted_leaders_election() {
        // Round 1 in election e ends with term 5; round 2's fresh election f starts at term 1.
        let mut samples = answers("a", 0.0, 1.0, leader(5));
        let mut second = answers("b", 1.0, 1.5, leader(1));
        second.extend(answers("c", 2.0, 2.5, leader(2)));
        for sample in &mut second {
            sample.election = "f".into();
        }
        samples.extend(second);
        let fault =
            FaultSpan { kind: "partition".into(), target: "b".into(), start: 1.6, end: 1.6, takeover_expected: true };
        let verdict = check(&samples, &[], &[fault], TIMING);
        assert!((verdict.failovers()[0] - 0.405).abs() < 1e-9, "{verdict:?}");
    }

    #[test]
    fn the_same_leader_seen_again_in_its_term_after_a_late_renew_is_no_regression() {
        let mut samples = answers("a", 0.0, 1.0, leader(3));
        samples.extend(answers("a", 1.0, 1.05, Answer::Follower));
        samples.extend(answers("a", 1.05, 2.0, leader(3)));
        let verdict = check(&samples, &[], &[], TIMING);
        assert!(verdict.term_regressions.is_empty(), "{verdict:?}");
    }

    #[test]
    fn a_fault_nobody_took_over_after_is_counted_unless_none_was_expected() {
        let samples = answers("a", 0.0, 3.0, leader(1));
        let verdict = check(&samples, &[], &[fault(1.0, true), fault(2.0, false)], TIMING);
        assert_eq!(verdict.rounds_without_takeover(), 1);
        assert!(verdict.failovers().is_empty());
    }

    #[test]
    fn two_commands_alive_at_once_are_found_and_fenced_writes_counted() {
        let lines = vec![
            witness(0.0, "a", 1, WitnessKind::Start, true),
            witness(1.0, "a", 1, WitnessKind::Alive, true),
            witness(1.5, "b", 2, WitnessKind::Start, true),
            witness(1.6, "a", 1, WitnessKind::Alive, false),
            witness(1.7, "a", 1, WitnessKind::Stop, false),
            witness(2.0, "b", 2, WitnessKind::Alive, true),
        ];
        let verdict = check(&[], &lines, &[fault(1.2, true)], TIMING);
        assert_eq!(verdict.command_overlaps.len(), 1, "{verdict:?}");
        assert!((verdict.command_overlaps[0].seconds - 0.1).abs() < 1e-9);
        assert_eq!(verdict.fenced_writes, 2);
        assert!((verdict.failovers()[0] - 0.3).abs() < 1e-9);
    }

    #[test]
    fn a_frozen_command_overlaps_only_by_what_it_did_after_it_thawed() {
        let mut lines =
            vec![witness(0.0, "a", 1, WitnessKind::Start, true), witness(1.0, "a", 1, WitnessKind::Alive, true)];
        lines.push(witness(2.0, "b", 2, WitnessKind::Start, true));
        lines.push(witness(3.0, "a", 1, WitnessKind::Alive, false));
        lines.push(witness(3.02, "a", 1, WitnessKind::Stop, false));
        lines.push(witness(4.0, "b", 2, WitnessKind::Alive, true));
        let verdict = check(&[], &lines, &[], TIMING);
        assert_eq!(verdict.command_overlaps.len(), 1, "{verdict:?}");
        let overlap = &verdict.command_overlaps[0];
        assert_eq!(overlap.at, 3.0);
        assert!((overlap.seconds - 0.02).abs() < 1e-9, "{overlap:?}");
    }

    #[test]
    fn commands_one_after_another_pass() {
        let lines = vec![
            witness(0.0, "a", 1, WitnessKind::Start, true),
            witness(1.0, "a", 1, WitnessKind::Stop, true),
            witness(1.1, "b", 2, WitnessKind::Start, true),
            witness(2.0, "b", 2, WitnessKind::Alive, true),
        ];
        let verdict = check(&[], &lines, &[], TIMING);
        assert!(verdict.command_overlaps.is_empty(), "{verdict:?}");
        assert_eq!(verdict.fenced_writes, 0);
    }
}
