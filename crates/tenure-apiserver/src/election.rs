//! The decisions of Coordinated Leader Election (KEP-4355) as a pure function of the Lease, its
//! LeaseCandidates and the time, so that every rule can be unit-tested without a server or a clock.
//! [`crate::coordinator`] feeds it from the store and carries its actions out.
//!
//! The rules, in the spirit of kube-apiserver's leader-election controller (not a port of it):
//!
//! - A candidate's liveness comes from its `renewTime` and `pingTime`. Renewed within
//!   [`Timers::ping_after`]: *fresh*. Older: *stale*, and pinged (the coordinator sets `pingTime`)
//!   when a decision needs it. Pinged and not yet answered (`renewTime < pingTime`): *pending*
//!   until [`Timers::ping_timeout`] has passed, *unanswered* after; an unanswered candidate is not
//!   electable and not pinged again until it renews on its own. Only fresh candidates are elected.
//! - The strategy is the one of the candidate with the newest binary version, as upstream picks it;
//!   candidates disagreeing at that version, or a third-party strategy (`example.com/x`), leave the
//!   Lease alone (a third-party strategy is another coordinator's business).
//! - OldestEmulationVersion: the lowest emulation version wins, then the lowest binary version,
//!   then the oldest candidate (`creationTimestamp`), then the name.
//! - A Lease that is absent, has no holder or has expired gets the best fresh candidate as holder,
//!   in a new term that clears `preferredHolder` (even when the best is the previous holder: upstream
//!   left an expired Lease untouched in that case, and a `preferredHolder` naming a candidate gone
//!   since then stalled the election for good).
//! - A held Lease gets `preferredHolder` = the best fresh candidate when that is not the holder, and
//!   loses it when the holder is the best or nobody fresh is better; a `preferredHolder` naming a
//!   candidate that is gone or unanswered is recomputed at once.
//! - Candidates not renewed for [`Timers::candidate_expiry`] are deleted; candidates quiet for half
//!   of it are pinged, so that a live one renews before it would be deleted.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// The only built-in strategy (`CoordinatedLeaseStrategy`), which this coordinator implements.
pub const OLDEST_EMULATION_VERSION: &str = "OldestEmulationVersion";

/// One dot-separated pre-release identifier; numeric ones sort before alphanumeric ones.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Identifier {
    Numeric(u64),
    Text(String),
}

/// A candidate's binary or emulation version: `MAJOR.MINOR[.PATCH][-PRE][+BUILD]`, without a
/// leading `v`, ordered as semantic versions are (a pre-release sorts before its release; build
/// metadata is ignored). Upstream requires the patch number; it is optional here so that the
/// `1.31` a component reports of itself is accepted too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    numbers: [u64; 3],
    pre_release: Vec<Identifier>,
}

/// A dot-separated identifier of a pre-release or build part: alphanumerics and `-`, not empty.
fn identifier(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A number of a version: digits without a leading zero.
fn number(text: &str) -> Option<u64> {
    let valid = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && (text == "0" || !text.starts_with('0'));
    valid.then(|| text.parse().ok()).flatten()
}

impl Version {
    /// Parses a version, or `None` if it is not one.
    pub fn parse(text: &str) -> Option<Version> {
        let text = text
            .split_once('+')
            .map_or(text, |(version, build)| if build.split('.').all(identifier) { version } else { "" });
        let (core, pre_release) = match text.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (text, None),
        };
        let parts: Vec<&str> = core.split('.').collect();
        if !(2..=3).contains(&parts.len()) {
            return None;
        }
        let mut numbers = [0; 3];
        for (slot, part) in numbers.iter_mut().zip(&parts) {
            *slot = number(part)?;
        }
        let pre_release = match pre_release {
            None => Vec::new(),
            Some(pre) => pre
                .split('.')
                .map(|p| {
                    if !identifier(p) {
                        None
                    } else if p.bytes().all(|b| b.is_ascii_digit()) {
                        number(p).map(Identifier::Numeric)
                    } else {
                        Some(Identifier::Text(p.to_string()))
                    }
                })
                .collect::<Option<Vec<_>>>()?,
        };
        Some(Version { numbers, pre_release })
    }

    /// Whether this is `0.0.0`, which upstream treats as no version at all.
    pub fn is_zero(&self) -> bool {
        self.numbers == [0, 0, 0] && self.pre_release.is_empty()
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.numbers.cmp(&other.numbers).then_with(|| {
            match (self.pre_release.is_empty(), other.pre_release.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => self.pre_release.cmp(&other.pre_release),
            }
        })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The durations the coordinator judges candidates and Leases by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// A candidate renewed longer ago than this must answer a ping before it can be elected
    /// (upstream: 5 s, its `electionDuration`).
    pub ping_after: Duration,
    /// How long a pinged candidate has to answer (upstream: 5 s).
    pub ping_timeout: Duration,
    /// A candidate not renewed for this long is deleted (upstream: 30 min).
    pub candidate_expiry: Duration,
}

/// What the decision needs of one LeaseCandidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// `metadata.name`: the identity the Lease is given to.
    pub name: String,
    /// `metadata.creationTimestamp`: older candidates win ties.
    pub created: Option<DateTime<Utc>>,
    /// `spec.strategy`.
    pub strategy: String,
    /// `spec.binaryVersion`, as written.
    pub binary_version: String,
    /// `spec.emulationVersion`, as written.
    pub emulation_version: String,
    /// `spec.renewTime`: the candidate's last sign of life.
    pub renew_time: Option<DateTime<Utc>>,
    /// `spec.pingTime`: when the coordinator last asked it for a sign of life.
    pub ping_time: Option<DateTime<Utc>>,
}

/// What the decision needs of the Lease.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseState {
    /// `spec.holderIdentity` (`None` when absent or empty).
    pub holder: Option<String>,
    /// `spec.renewTime`.
    pub renew_time: Option<DateTime<Utc>>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i64>,
    /// `spec.preferredHolder` (`None` when absent or empty).
    pub preferred_holder: Option<String>,
}

/// Parses an RFC 3339 time field of an object.
fn time_field(value: &Value) -> Option<DateTime<Utc>> {
    value.as_str().and_then(|t| DateTime::parse_from_rfc3339(t).ok()).map(|t| t.with_timezone(&Utc))
}

fn text_field(value: &Value) -> Option<String> {
    value.as_str().filter(|t| !t.is_empty()).map(str::to_string)
}

impl Candidate {
    /// Reads a LeaseCandidate object; missing or malformed fields read as absent, never as errors.
    pub fn from_object(object: &Value) -> Candidate {
        let spec = &object["spec"];
        Candidate {
            name: object["metadata"]["name"].as_str().unwrap_or("").to_string(),
            created: time_field(&object["metadata"]["creationTimestamp"]),
            strategy: spec["strategy"].as_str().unwrap_or("").to_string(),
            binary_version: spec["binaryVersion"].as_str().unwrap_or("").to_string(),
            emulation_version: spec["emulationVersion"].as_str().unwrap_or("").to_string(),
            renew_time: time_field(&spec["renewTime"]),
            ping_time: time_field(&spec["pingTime"]),
        }
    }
}

impl LeaseState {
    /// Reads a Lease object; missing or malformed fields read as absent.
    pub fn from_object(object: &Value) -> LeaseState {
        let spec = &object["spec"];
        LeaseState {
            holder: text_field(&spec["holderIdentity"]),
            renew_time: time_field(&spec["renewTime"]),
            duration_seconds: spec["leaseDurationSeconds"].as_i64(),
            preferred_holder: text_field(&spec["preferredHolder"]),
        }
    }

    /// When the current term ends, if the Lease is held at all.
    fn term_end(&self) -> Option<DateTime<Utc>> {
        self.holder.as_ref()?;
        let duration = chrono::Duration::try_seconds(self.duration_seconds?)?;
        Some(self.renew_time?.checked_add_signed(duration).unwrap_or(DateTime::<Utc>::MAX_UTC))
    }
}

/// Something the coordinator is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set the candidate's `pingTime` to now: it must answer by renewing.
    Ping(String),
    /// Delete the candidate: it has not renewed for [`Timers::candidate_expiry`].
    Collect(String),
    /// Give the Lease to this candidate in a new term.
    Elect(String),
    /// Set (or, with `None`, clear) the Lease's `preferredHolder`.
    SetPreferredHolder(Option<String>),
}

/// The outcome of one decision.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Step {
    /// What to do now, in order.
    pub actions: Vec<Action>,
    /// Candidates left out, and why, for the warnings.
    pub ignored: Vec<(String, String)>,
    /// When to decide again if nothing changes before (a ping's deadline, the Lease's expiry, a
    /// candidate's collection).
    pub recheck_at: Option<DateTime<Utc>>,
}

impl Step {
    fn recheck(&mut self, at: DateTime<Utc>, now: DateTime<Utc>) {
        if at > now {
            self.recheck_at = Some(self.recheck_at.map_or(at, |current| current.min(at)));
        }
    }
}

/// A candidate's liveness at some time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liveness {
    /// Renewed within `ping_after`: electable.
    Fresh,
    /// Renewed longer ago (or never), no ping outstanding: to be pinged when a decision needs it.
    Stale,
    /// Pinged, not answered yet, still within `ping_timeout`.
    Pending,
    /// Pinged and not answered within `ping_timeout`.
    Unanswered,
}

/// `time + duration`, saturating (a huge configured duration means "never", not a panic).
fn after(time: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(duration)
        .ok()
        .and_then(|duration| time.checked_add_signed(duration))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn liveness(candidate: &Candidate, now: DateTime<Utc>, timers: &Timers, step: &mut Step) -> Liveness {
    let answered = match (candidate.renew_time, candidate.ping_time) {
        (Some(renewed), Some(pinged)) => renewed >= pinged,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if answered {
        let stale_at = candidate.renew_time.map(|renewed| after(renewed, timers.ping_after));
        return if stale_at.is_some_and(|stale_at| now < stale_at) { Liveness::Fresh } else { Liveness::Stale };
    }
    let Some(pinged) = candidate.ping_time else { return Liveness::Stale };
    let deadline = after(pinged, timers.ping_timeout);
    step.recheck(deadline, now);
    if now < deadline {
        Liveness::Pending
    } else {
        Liveness::Unanswered
    }
}

/// A candidate this coordinator can rank.
struct Ranked<'a> {
    candidate: &'a Candidate,
    binary: Version,
    /// `None` for a third-party strategy that did not give one.
    emulation: Option<Version>,
    liveness: Liveness,
}

impl Ranked<'_> {
    /// The OldestEmulationVersion order: smaller is better.
    fn key(&self) -> (&Option<Version>, &Version, DateTime<Utc>, &str) {
        (
            &self.emulation,
            &self.binary,
            self.candidate.created.unwrap_or(DateTime::<Utc>::MAX_UTC),
            &self.candidate.name,
        )
    }
}

/// A candidate's binary and emulation versions if this coordinator can rank it, or why it cannot.
fn versions(candidate: &Candidate) -> Result<(Version, Option<Version>), String> {
    let built_in = candidate.strategy == OLDEST_EMULATION_VERSION;
    if !built_in && !candidate.strategy.contains('/') {
        return Err(format!("its strategy {:?} is unknown", candidate.strategy));
    }
    let binary = Version::parse(&candidate.binary_version)
        .ok_or_else(|| format!("its binaryVersion {:?} is not a version", candidate.binary_version))?;
    let emulation = Version::parse(&candidate.emulation_version);
    if built_in && emulation.is_none() {
        return Err(format!("its emulationVersion {:?} is not a version", candidate.emulation_version));
    }
    Ok((binary, emulation))
}

/// The strategy the candidates ask for: the one of the newest binary version, or why there is none.
fn strategy<'a>(ranked: &[Ranked<'a>]) -> Result<&'a str, String> {
    let newest = ranked.iter().map(|r| &r.binary).max().ok_or_else(|| "no candidates".to_string())?;
    let strategies: BTreeSet<&str> =
        ranked.iter().filter(|r| &r.binary == newest).map(|r| r.candidate.strategy.as_str()).collect();
    match strategies.into_iter().collect::<Vec<_>>().as_slice() {
        [one] => Ok(one),
        several => Err(format!("candidates at the newest binary version ask for different strategies {several:?}")),
    }
}

/// Decides what to do for one Lease (`None` if absent) given its candidates at `now`.
pub fn decide(lease: Option<&LeaseState>, candidates: &[Candidate], now: DateTime<Utc>, timers: &Timers) -> Step {
    let mut step = Step::default();
    let mut pinged = BTreeSet::new();
    let mut ranked = Vec::new();
    for candidate in candidates {
        let last_seen = candidate.renew_time.or(candidate.created).unwrap_or(now);
        let collect_at = after(last_seen, timers.candidate_expiry);
        if now >= collect_at {
            step.actions.push(Action::Collect(candidate.name.clone()));
            continue;
        }
        step.recheck(collect_at, now);
        let (binary, emulation) = match versions(candidate) {
            Ok(versions) => versions,
            Err(why) => {
                step.ignored.push((candidate.name.clone(), why));
                continue;
            }
        };
        let liveness = liveness(candidate, now, timers, &mut step);
        // A quiet candidate is asked for a sign of life well before it would be collected (one
        // that has not answered its last ping is not asked again).
        let answered = matches!(liveness, Liveness::Fresh | Liveness::Stale);
        let refresh_at = after(last_seen, timers.candidate_expiry / 2);
        if answered && now >= refresh_at {
            pinged.insert(candidate.name.clone());
        } else if answered {
            step.recheck(refresh_at, now);
        }
        ranked.push(Ranked { candidate, binary, emulation, liveness });
    }
    let finish = |mut step: Step, pinged: BTreeSet<String>| {
        step.actions.extend(pinged.into_iter().map(Action::Ping));
        step
    };
    let holder = lease.and_then(|l| l.holder.as_deref());
    let preferred = lease.and_then(|l| l.preferred_holder.as_deref());
    let term_end = lease.and_then(LeaseState::term_end);
    let vacant = term_end.is_none_or(|end| now >= end);
    if let Some(end) = term_end {
        step.recheck(end, now);
    }
    if !ranked.is_empty() {
        match strategy(&ranked) {
            Ok(OLDEST_EMULATION_VERSION) => {}
            Ok(other) => {
                // Another coordinator's strategy: this one stays out of the Lease.
                step.ignored.push((String::new(), format!("the candidates ask for strategy {other:?}")));
                return finish(step, pinged);
            }
            Err(why) => {
                step.ignored.push((String::new(), why));
                return finish(step, pinged);
            }
        }
    }
    // Candidates that asked for another strategy are not elected by this one.
    let electable: Vec<&Ranked> = ranked.iter().filter(|r| r.candidate.strategy == OLDEST_EMULATION_VERSION).collect();
    let best = |accept: &dyn Fn(Liveness) -> bool| {
        electable
            .iter()
            .filter(|r| accept(r.liveness))
            .min_by(|a, b| a.key().cmp(&b.key()))
            .map(|r| r.candidate.name.as_str())
    };
    // Whether the holder or the preferred holder may be wrong: then liveness must be known.
    let round_needed = vacant || {
        let likely_best = best(&|l| l != Liveness::Unanswered);
        preferred != likely_best.filter(|best| Some(*best) != holder)
    };
    if !round_needed {
        return finish(step, pinged);
    }
    let stale: Vec<&str> =
        electable.iter().filter(|r| r.liveness == Liveness::Stale).map(|r| r.candidate.name.as_str()).collect();
    if !stale.is_empty() {
        pinged.extend(stale.into_iter().map(str::to_string));
        step.recheck(after(now, timers.ping_timeout), now);
        return finish(step, pinged);
    }
    if electable.iter().any(|r| r.liveness == Liveness::Pending) {
        return finish(step, pinged);
    }
    let best_fresh = best(&|l| l == Liveness::Fresh);
    if vacant {
        if let Some(best) = best_fresh {
            step.actions.push(Action::Elect(best.to_string()));
        }
    } else {
        let wanted = best_fresh.filter(|best| Some(*best) != holder);
        if wanted != preferred {
            step.actions.push(Action::SetPreferredHolder(wanted.map(str::to_string)));
        }
    }
    finish(step, pinged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + seconds, 0).unwrap()
    }

    const TIMERS: Timers = Timers {
        ping_after: Duration::from_secs(5),
        ping_timeout: Duration::from_secs(5),
        candidate_expiry: Duration::from_secs(1800),
    };

    /// A candidate created at 0 that renewed at `renewed`.
    fn candidate(name: &str, emulation: &str, binary: &str, renewed: i64) -> Candidate {
        Candidate {
            name: name.into(),
            created: Some(at(0)),
            strategy: OLDEST_EMULATION_VERSION.into(),
            binary_version: binary.into(),
            emulation_version: emulation.into(),
            renew_time: Some(at(renewed)),
            ping_time: None,
        }
    }

    fn held(holder: &str, renewed: i64, preferred: Option<&str>) -> LeaseState {
        LeaseState {
            holder: Some(holder.into()),
            renew_time: Some(at(renewed)),
            duration_seconds: Some(15),
            preferred_holder: preferred.map(str::to_string),
        }
    }

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap_or_else(|| panic!("{text} parses"))
    }

    #[test]
    fn versions_parse_and_order_as_semantic_versions() {
        assert!(v("1.30") == v("1.30.0"));
        assert!(v("1.9.0") < v("1.10.0"));
        assert!(v("1.31.0-alpha.1") < v("1.31.0-alpha.2"));
        assert!(v("1.31.0-alpha.9") < v("1.31.0-beta"));
        assert!(v("1.31.0-rc.1") < v("1.31.0"));
        assert!(v("1.31.0-alpha") < v("1.31.0-alpha.1"));
        assert!(v("1.31.0+build.5") == v("1.31.0"));
        for bad in ["", "1", "v1.30.0", "1.x", "1.30.0.1", "01.2.3", "1.2.3-", "1.2.3-a..b", "1.2.3+", "1.2.3-01"] {
            assert!(Version::parse(bad).is_none(), "{bad:?}");
        }
        assert!(v("0.0.0").is_zero() && !v("0.0.1").is_zero());
    }

    #[test]
    fn a_vacant_lease_goes_to_the_oldest_emulation_version_among_fresh_candidates() {
        let candidates = [candidate("new", "1.1.0", "1.1.0", 99), candidate("old", "1.0.0", "1.1.0", 99)];
        let step = decide(None, &candidates, at(100), &TIMERS);
        assert_eq!(step.actions, [Action::Elect("old".into())]);
        // An expired Lease and a Lease without holder are vacant too.
        let expired = held("new", 80, None);
        assert_eq!(decide(Some(&expired), &candidates, at(100), &TIMERS).actions, [Action::Elect("old".into())]);
        let released = LeaseState { holder: None, ..held("x", 99, None) };
        assert_eq!(decide(Some(&released), &candidates, at(100), &TIMERS).actions, [Action::Elect("old".into())]);
    }

    #[test]
    fn ties_go_to_the_lower_binary_version_then_the_older_candidate_then_the_name() {
        let mut b = candidate("b", "1.0.0", "1.1.0", 99);
        let a = candidate("a", "1.0.0", "1.2.0", 99);
        assert_eq!(decide(None, &[a.clone(), b.clone()], at(100), &TIMERS).actions, [Action::Elect("b".into())]);
        let mut c = candidate("c", "1.0.0", "1.1.0", 99);
        c.created = Some(at(-10));
        assert_eq!(decide(None, &[b.clone(), c], at(100), &TIMERS).actions, [Action::Elect("c".into())]);
        b.name = "d".into();
        let e = candidate("c", "1.0.0", "1.1.0", 99);
        assert_eq!(decide(None, &[b, e], at(100), &TIMERS).actions, [Action::Elect("c".into())]);
    }

    #[test]
    fn stale_candidates_are_pinged_and_the_election_waits_for_their_answers() {
        let fresh = candidate("fresh", "1.1.0", "1.1.0", 99);
        let mut stale = candidate("stale", "1.0.0", "1.0.0", 50);
        let step = decide(None, &[fresh.clone(), stale.clone()], at(100), &TIMERS);
        assert_eq!(step.actions, [Action::Ping("stale".into())]);
        assert_eq!(step.recheck_at, Some(at(105)));
        // Pinged, not answered yet: wait until the deadline.
        stale.ping_time = Some(at(100));
        let step = decide(None, &[fresh.clone(), stale.clone()], at(102), &TIMERS);
        assert_eq!((step.actions.as_slice(), step.recheck_at), (&[][..], Some(at(105))));
        // Answered: it is the oldest, it wins.
        let mut answered = stale.clone();
        answered.renew_time = Some(at(103));
        let step = decide(None, &[fresh.clone(), answered], at(103), &TIMERS);
        assert_eq!(step.actions, [Action::Elect("stale".into())]);
        // Not answered by the deadline: not electable, and not pinged again.
        let fresh = candidate("fresh", "1.1.0", "1.1.0", 104);
        let step = decide(None, &[fresh.clone(), stale.clone()], at(105), &TIMERS);
        assert_eq!(step.actions, [Action::Elect("fresh".into())]);
        let step = decide(Some(&held("fresh", 105, None)), &[fresh.clone(), stale.clone()], at(106), &TIMERS);
        assert_eq!(step.actions, []);
        // A candidate gone stale while the Lease is vacant is asked again, as it answered before.
        let step = decide(None, &[fresh, stale], at(110), &TIMERS);
        assert_eq!(step.actions, [Action::Ping("fresh".into())]);
    }

    #[test]
    fn a_holder_with_a_newer_version_than_a_fresh_candidate_gets_a_preferred_holder() {
        let candidates = [candidate("new", "1.1.0", "1.1.0", 99), candidate("old", "1.0.0", "1.0.0", 99)];
        let lease = held("new", 99, None);
        let step = decide(Some(&lease), &candidates, at(100), &TIMERS);
        assert_eq!(step.actions, [Action::SetPreferredHolder(Some("old".into()))]);
        assert_eq!(step.recheck_at, Some(at(114)), "the Lease's expiry");
        // Once set, nothing more to do: the holder is expected to hand over.
        let marked = held("new", 99, Some("old"));
        assert_eq!(decide(Some(&marked), &candidates, at(100), &TIMERS).actions, []);
        // The best holder needs no preferred holder, and loses a stray one.
        let best = held("old", 99, Some("new"));
        let step = decide(Some(&best), &candidates, at(100), &TIMERS);
        assert_eq!(step.actions, [Action::SetPreferredHolder(None)]);
        assert_eq!(decide(Some(&held("old", 99, None)), &candidates, at(100), &TIMERS).actions, []);
    }

    #[test]
    fn a_preferred_holder_that_is_gone_or_unanswered_is_recomputed_and_never_stalls_the_election() {
        let new = candidate("new", "1.1.0", "1.1.0", 99);
        let mid = candidate("mid", "1.0.5", "1.1.0", 99);
        // The preferred holder's candidate is gone: the next best takes its place.
        let lease = held("new", 99, Some("gone"));
        let step = decide(Some(&lease), &[new.clone(), mid.clone()], at(100), &TIMERS);
        assert_eq!(step.actions, [Action::SetPreferredHolder(Some("mid".into()))]);
        // No better candidate than the holder: cleared.
        assert_eq!(
            decide(Some(&lease), std::slice::from_ref(&new), at(100), &TIMERS).actions,
            [Action::SetPreferredHolder(None)]
        );
        assert_eq!(decide(Some(&lease), &[], at(100), &TIMERS).actions, [Action::SetPreferredHolder(None)]);
        // It did not answer its ping.
        let mut silent = candidate("old", "1.0.0", "1.0.0", 50);
        silent.ping_time = Some(at(90));
        let lease = held("new", 99, Some("old"));
        let step = decide(Some(&lease), &[new.clone(), mid.clone(), silent.clone()], at(100), &TIMERS);
        assert_eq!(step.actions, [Action::SetPreferredHolder(Some("mid".into()))]);
        // The holder stopped renewing for it and the Lease expired: a new term for the best fresh
        // candidate, even the old holder, without the preferred holder.
        let expired = held("new", 80, Some("gone"));
        let step = decide(Some(&expired), &[new.clone(), silent], at(100), &TIMERS);
        assert_eq!(step.actions, [Action::Elect("new".into())]);
    }

    #[test]
    fn candidates_that_cannot_be_ranked_are_ignored_without_stopping_the_others() {
        let good = candidate("good", "1.1.0", "1.1.0", 99);
        let mut unknown = candidate("unknown", "1.0.0", "1.0.0", 99);
        unknown.strategy = "Youngest".into();
        let garbled = candidate("garbled", "one", "1.0.0", 99);
        let step = decide(None, &[good.clone(), unknown, garbled], at(100), &TIMERS);
        assert_eq!(step.actions, [Action::Elect("good".into())]);
        let ignored: Vec<&str> = step.ignored.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(ignored, ["unknown", "garbled"]);
        // A third-party strategy at the newest binary version: the Lease is left to its coordinator.
        let mut third = candidate("third", "1.2.0", "1.2.0", 99);
        third.strategy = "example.com/Custom".into();
        let step = decide(None, &[good.clone(), third.clone()], at(100), &TIMERS);
        assert_eq!(step.actions, []);
        // Two strategies at the newest binary version: a conflict, left alone too.
        third.binary_version = "1.1.0".into();
        assert_eq!(decide(None, &[good, third], at(100), &TIMERS).actions, []);
    }

    #[test]
    fn quiet_candidates_are_pinged_before_expiry_and_collected_after_it() {
        let lease = held("a", 99, None);
        let quiet = candidate("a", "1.0.0", "1.0.0", 100 - 901);
        let step = decide(Some(&lease), &[quiet], at(100), &TIMERS);
        assert_eq!(step.actions, [Action::Ping("a".into())]);
        let mut gone = candidate("b", "1.0.0", "1.0.0", 100 - 1800);
        gone.ping_time = Some(at(100 - 1700));
        let step = decide(Some(&lease), &[candidate("a", "1.0.0", "1.0.0", 99), gone], at(100), &TIMERS);
        assert_eq!(step.actions, [Action::Collect("b".into())]);
        // Never renewed: it must answer a ping to be elected, and is collected as of its creation.
        let never_renewed = Candidate { renew_time: None, ..candidate("c", "1.0.0", "1.0.0", 0) };
        let step = decide(None, std::slice::from_ref(&never_renewed), at(100), &TIMERS);
        assert_eq!((step.actions.as_slice(), step.recheck_at), (&[Action::Ping("c".into())][..], Some(at(105))));
        let step = decide(None, &[never_renewed], at(1800), &TIMERS);
        assert_eq!(step.actions, [Action::Collect("c".into())]);
        // With an expiry shorter than twice the freshness, a fresh candidate is still asked in time.
        let short = Timers { candidate_expiry: Duration::from_secs(6), ..TIMERS };
        let step = decide(Some(&held("a", 99, None)), &[candidate("a", "1.0.0", "1.0.0", 97)], at(100), &short);
        assert_eq!(step.actions, [Action::Ping("a".into())]);
    }

    #[test]
    fn extreme_durations_and_times_never_panic() {
        let forever =
            Timers { ping_after: Duration::MAX, ping_timeout: Duration::MAX, candidate_expiry: Duration::MAX };
        let mut far = candidate("far", "1.0.0", "1.0.0", 0);
        far.renew_time = Some(DateTime::<Utc>::MAX_UTC);
        far.ping_time = Some(DateTime::<Utc>::MAX_UTC);
        let lease = LeaseState { duration_seconds: Some(i64::MAX), ..held("far", 0, None) };
        decide(Some(&lease), &[far.clone()], at(100), &forever);
        decide(None, &[far], DateTime::<Utc>::MAX_UTC, &TIMERS);
    }
}
