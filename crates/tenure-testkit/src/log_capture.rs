//! Captures the tracing events of this test process, to check what an operator reads in the log;
//! the etcd and ZooKeeper tests check the same lines.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tenure::Elector;
use tokio::time::timeout;
use tracing::field::{Field, Visit};
use tracing::Level;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// One event as a log line would show it.
#[derive(Debug, Clone)]
pub struct Line {
    /// Its level.
    pub level: Level,
    /// Its target (the module that logged it).
    pub target: String,
    /// Its message.
    pub message: String,
    /// Its other fields, as text.
    pub fields: BTreeMap<String, String>,
}

/// Every line captured, in order.
pub type Lines = Arc<Mutex<Vec<Line>>>;

/// Starts capturing every event of this process (once; later calls share the capture) and
/// returns the lines captured so far and from now on.
pub fn capture() -> Lines {
    static LINES: OnceLock<Lines> = OnceLock::new();
    LINES
        .get_or_init(|| {
            let lines = Lines::default();
            let subscriber = tracing_subscriber::registry().with(Recorder(lines.clone()));
            tracing::subscriber::set_global_default(subscriber).expect("no other subscriber in this test");
            lines
        })
        .clone()
}

/// The captured lines with `message` whose field `identity` is `identity`.
pub fn lines_of(lines: &Lines, identity: &str, message: &str) -> Vec<Line> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.message == message && l.fields.get("identity").map(String::as_str) == Some(identity))
        .cloned()
        .collect()
}

/// `b` follows `a`, which leads: `b` logs "leader observed" for `a` at INFO with `a`'s term; once
/// `a` shut down and `b` leads, `b` logs itself with its own term before its snapshot names it.
pub async fn assert_each_observed_leader_is_logged(lines: &Lines, a: Elector, b: impl FnOnce() -> Elector) {
    let bound = Duration::from_secs(10);
    let first = timeout(bound, a.acquired()).await.expect("a leads").expect("tenure");
    let b = b();
    let mut b_view = b.subscribe();
    let names = |leader: &'static str| move |l: &tenure::Leadership| l.leader.as_deref() == Some(leader);
    timeout(bound, b_view.wait_for(names("a"))).await.expect("b sees a lead").expect("b running");
    let seen = lines_of(lines, "b", "leader observed");
    let line = seen.iter().find(|l| l.fields.get("leader").map(String::as_str) == Some("a")).expect("b logged a");
    assert_eq!(line.level, Level::INFO);
    assert_eq!(line.fields.get("term"), Some(&first.term().0.to_string()));

    drop(first);
    a.shutdown().await.expect("shutdown");
    let second = timeout(bound, b.acquired()).await.expect("b leads").expect("tenure");
    timeout(bound, b_view.wait_for(names("b"))).await.expect("b names itself").expect("b running");
    let (seen, term) = (lines_of(lines, "b", "leader observed"), second.term().0.to_string());
    let field = |l: &Line, name: &str| l.fields.get(name).cloned().unwrap_or_default();
    assert!(seen.iter().any(|l| field(l, "leader") == "b" && field(l, "term") == term), "{seen:?}");
    drop(second);
    b.shutdown().await.expect("shutdown");
}

struct Recorder(Lines);

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut line = Line {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            message: String::new(),
            fields: BTreeMap::new(),
        };
        event.record(&mut line);
        self.0.lock().unwrap().push(line);
    }
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record(field, value.to_owned());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record(field, value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record(field, format!("{value:?}"));
    }
}

impl Line {
    fn record(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = value;
        } else {
            self.fields.insert(field.name().to_owned(), value);
        }
    }
}
