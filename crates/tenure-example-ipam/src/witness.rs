//! The witness: every Active/Active handler writes a line when it starts and one when it ends,
//! with its replica, partition and partition term, so that the checker can prove afterwards that
//! no Pod was handled by two replicas at overlapping times.
//!
//! Why lines in a file per replica, stamped with the host's wall clock: all replicas run on one
//! host, so their stamps come from one clock (no skew between them); a line is written with one
//! unbuffered `write` on a file opened for appending, so it survives a SIGKILL right after it.
//! A handler stamps `start` after it took its partition guard and before its first side effect,
//! and `end` after its last one (while still holding the guard), so its interval contains all of
//! its side effects: a real overlap of two handlers' work always shows as overlapping intervals.
//! The error is only in the other direction (an interval is longer than the work by the time to
//! write a line, microseconds), which can only report an overlap that did not happen, never hide
//! one.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// What a handler does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerKind {
    /// Gives a Pod an address.
    Reconcile,
    /// Releases a deleted Pod's addresses.
    Release,
    /// Releases an orphan (an allocation the Pod does not hold).
    Collect,
}

impl HandlerKind {
    fn as_str(self) -> &'static str {
        match self {
            HandlerKind::Reconcile => "reconcile",
            HandlerKind::Release => "release",
            HandlerKind::Collect => "collect",
        }
    }
}

/// How a handler ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It did what it came for (or found nothing to do).
    Done,
    /// Its partition ownership ended under it: the guard was no longer valid, or etcd refused a
    /// write under its term. It wrote nothing after that.
    Fenced,
    /// The Pod changed or went away (a conditioned Pod write was refused); nothing was left
    /// allocated by it.
    Conflict,
    /// A store call failed; a later resync retries.
    Error,
    /// The injected crash (the process exits right after this line).
    Crashed,
}

/// Every outcome with its word in the witness lines.
const OUTCOMES: [(Outcome, &str); 5] = [
    (Outcome::Done, "done"),
    (Outcome::Fenced, "fenced"),
    (Outcome::Conflict, "conflict"),
    (Outcome::Error, "error"),
    (Outcome::Crashed, "crashed"),
];

impl Outcome {
    fn as_str(self) -> &'static str {
        OUTCOMES.iter().find(|(outcome, _)| *outcome == self).map_or("", |(_, word)| word)
    }

    fn parse(text: &str) -> Option<Outcome> {
        OUTCOMES.iter().find(|(_, word)| *word == text).map(|(outcome, _)| *outcome)
    }
}

/// Nanoseconds since the Unix epoch on the host's wall clock (shared by every replica on the host).
pub fn now_nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default()
}

/// One replica's witness file (or none: the lines are not written).
#[derive(Debug)]
pub struct Witness {
    replica: String,
    file: Option<Mutex<File>>,
}

/// What identifies one handler in the witness.
#[derive(Debug, Clone)]
pub struct HandlerId {
    kind: HandlerKind,
    partition: u32,
    term: u64,
    pod_uid: String,
}

impl Witness {
    /// Appends to `path` (created if missing); `None` writes nothing.
    pub fn open(replica: &str, path: Option<&Path>) -> std::io::Result<Witness> {
        let file =
            path.map(|path| OpenOptions::new().create(true).append(true).open(path).map(Mutex::new)).transpose()?;
        Ok(Witness { replica: replica.to_owned(), file })
    }

    fn write(&self, line: String) {
        let Some(file) = &self.file else { return };
        let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(error) = file.write_all(line.as_bytes()) {
            tracing::warn!(%error, "cannot write the witness line");
        }
    }

    /// Stamps the start of a handler (after the guard was taken, before any side effect).
    pub fn start(&self, kind: HandlerKind, partition: u32, term: u64, pod_uid: &str, pod_key: &str) -> HandlerId {
        self.write(format!(
            "{} start {} {} {partition} {term} {pod_uid} {pod_key}\n",
            now_nanos(),
            self.replica,
            kind.as_str()
        ));
        HandlerId { kind, partition, term, pod_uid: pod_uid.to_owned() }
    }

    /// Stamps the end of a handler (after its last side effect, before the guard is dropped).
    pub fn end(&self, id: &HandlerId, outcome: Outcome) {
        self.write(format!(
            "{} end {} {} {} {} {} {}\n",
            now_nanos(),
            self.replica,
            id.kind.as_str(),
            id.partition,
            id.term,
            id.pod_uid,
            outcome.as_str()
        ));
    }
}

/// One handler as read back from the witness files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The replica that ran it.
    pub replica: String,
    /// What it did (`reconcile`, `release`, `collect`).
    pub kind: String,
    /// The partition and the partition term it held.
    pub partition: u32,
    /// The partition term.
    pub term: u64,
    /// The Pod.
    pub pod_uid: String,
    /// Start and end stamps (ns since the epoch); `None`: no end line (the process was killed).
    pub start: u128,
    /// See `start`.
    pub end: Option<u128>,
    /// How it ended, if it did.
    pub outcome: Option<Outcome>,
}

/// Reads every `*.witness` file in `dir`. Lines that do not parse are skipped (a SIGKILL can cut
/// the last line).
pub fn read_dir(dir: &Path) -> Vec<Handled> {
    let text: String = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().extension().is_some_and(|e| e == "witness"))
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .collect();
    parse(&text)
}

/// Pairs start and end lines (per replica, partition, term, Pod and kind, in order).
pub fn parse(text: &str) -> Vec<Handled> {
    let mut handled: Vec<Handled> = Vec::new();
    let mut open: HashMap<(String, String, u32, u64, String), Vec<usize>> = HashMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 7 {
            continue;
        }
        let (Ok(at), Ok(partition), Ok(term)) =
            (fields[0].parse::<u128>(), fields[4].parse::<u32>(), fields[5].parse::<u64>())
        else {
            continue;
        };
        let key = (fields[2].to_owned(), fields[3].to_owned(), partition, term, fields[6].to_owned());
        match fields[1] {
            "start" => {
                open.entry(key.clone()).or_default().push(handled.len());
                handled.push(Handled {
                    replica: key.0,
                    kind: key.1,
                    partition,
                    term,
                    pod_uid: key.4,
                    start: at,
                    end: None,
                    outcome: None,
                });
            }
            "end" => {
                let Some(index) = open.get_mut(&key).and_then(|starts| starts.pop()) else { continue };
                handled[index].end = Some(at);
                handled[index].outcome = fields.get(7).and_then(|o| Outcome::parse(o));
            }
            _ => {}
        }
    }
    handled
}

/// Periods (ns since the epoch) during which the checker had a replica stopped (SIGSTOP until
/// SIGCONT) or dead (from SIGKILL on): it did nothing then.
pub type Frozen = BTreeMap<String, Vec<(u128, u128)>>;

/// Pairs of handlers of one Pod, on two replicas, whose intervals overlap while both replicas
/// ran. One exception, which is the fencing at work and not a violation: a handler whose replica
/// was frozen during it and that ended `fenced` (it woke up, found its ownership gone, and wrote
/// nothing more). A handler without an end line runs until its replica was killed.
pub fn overlaps(handled: &[Handled], frozen: &Frozen) -> Vec<String> {
    let mut by_pod: BTreeMap<&str, Vec<&Handled>> = BTreeMap::new();
    for h in handled {
        by_pod.entry(h.pod_uid.as_str()).or_default().push(h);
    }
    let no_freeze = Vec::new();
    let frozen_of = |replica: &str| frozen.get(replica).unwrap_or(&no_freeze);
    let was_frozen_during = |h: &Handled| {
        let end = h.end.unwrap_or(u128::MAX);
        frozen_of(&h.replica).iter().any(|(from, to)| *from < end && *to > h.start)
    };
    let excused = |h: &Handled| h.outcome == Some(Outcome::Fenced) && was_frozen_during(h);
    let mut found = Vec::new();
    for (pod, list) in by_pod {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.replica == b.replica || excused(a) || excused(b) {
                    continue;
                }
                let from = a.start.max(b.start);
                let to = a.end.unwrap_or(u128::MAX).min(b.end.unwrap_or(u128::MAX));
                if from >= to {
                    continue;
                }
                // What is left of the overlap once either replica's frozen periods are cut out.
                let mut pieces = vec![(from, to)];
                for (cut_from, cut_to) in frozen_of(&a.replica).iter().chain(frozen_of(&b.replica)) {
                    pieces = pieces
                        .into_iter()
                        .flat_map(|(f, t)| {
                            let mut rest = Vec::new();
                            if f < *cut_from {
                                rest.push((f, t.min(*cut_from)));
                            }
                            if t > *cut_to {
                                rest.push((f.max(*cut_to), t));
                            }
                            rest
                        })
                        .collect();
                }
                let live: u128 = pieces.iter().map(|(f, t)| t - f).sum();
                if live > 0 {
                    found.push(format!(
                        "pod {pod}: {} {} (partition {} term {}) and {} {} (partition {} term {}) overlap for {} us",
                        a.replica,
                        a.kind,
                        a.partition,
                        a.term,
                        b.replica,
                        b.kind,
                        b.partition,
                        b.term,
                        live / 1000
                    ));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(at: u128, what: &str, replica: &str, term: u64, uid: &str, outcome: &str) -> String {
        format!("{at} {what} {replica} reconcile 7 {term} {uid} {outcome}\n")
    }

    #[test]
    fn two_replicas_handling_one_pod_at_the_same_time_is_an_overlap() {
        let text = [
            line(100, "start", "a", 1, "u", "default/p"),
            line(150, "start", "b", 2, "u", "default/p"),
            line(200, "end", "a", 1, "u", "done"),
            line(250, "end", "b", 2, "u", "done"),
        ]
        .concat();
        let handled = parse(&text);
        assert_eq!(handled.len(), 2);
        assert_eq!(overlaps(&handled, &Frozen::new()).len(), 1);
    }

    #[test]
    fn handlers_one_after_the_other_or_on_one_replica_do_not_overlap() {
        let text = [
            line(100, "start", "a", 1, "u", "default/p"),
            line(200, "end", "a", 1, "u", "done"),
            line(200, "start", "b", 2, "u", "default/p"),
            line(300, "end", "b", 2, "u", "done"),
            line(300, "start", "b", 2, "u", "default/p"),
            line(400, "end", "b", 2, "u", "done"),
        ]
        .concat();
        assert!(overlaps(&parse(&text), &Frozen::new()).is_empty());
    }

    #[test]
    fn a_killed_replicas_unfinished_handler_ends_when_it_was_killed() {
        let text =
            [line(100, "start", "a", 1, "u", "default/p"), line(300, "start", "b", 2, "u", "default/p")].concat();
        let handled = parse(&text);
        assert_eq!(overlaps(&handled, &Frozen::new()).len(), 1, "never ended, never frozen: overlaps");
        let killed = Frozen::from([("a".to_owned(), vec![(250, u128::MAX)])]);
        assert!(overlaps(&handled, &killed).is_empty());
    }

    #[test]
    fn a_paused_handler_that_wakes_up_fenced_is_excused_but_not_one_that_finishes_its_work() {
        let paused = Frozen::from([("a".to_owned(), vec![(120, 400)])]);
        let fenced = [
            line(100, "start", "a", 1, "u", "default/p"),
            line(300, "start", "b", 2, "u", "default/p"),
            line(350, "end", "b", 2, "u", "done"),
            line(401, "start", "b", 2, "u", "default/p"),
            line(410, "end", "a", 1, "u", "fenced"),
            line(420, "end", "b", 2, "u", "done"),
        ]
        .concat();
        assert!(overlaps(&parse(&fenced), &paused).is_empty());
        let done = fenced.replace("410 end a reconcile 7 1 u fenced", "410 end a reconcile 7 1 u done");
        assert_eq!(overlaps(&parse(&done), &paused).len(), 1, "a's work after waking overlaps b's");
    }
}
