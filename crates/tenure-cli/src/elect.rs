//! `tenure elect`: stay a candidate, log every change of leader, and tell others who leads over
//! HTTP. A drop-in for the leader-elector:0.5 sidecar (same flags, same `{"name": ...}` answer),
//! with its known defects fixed: followers report the current leader, and SIGTERM releases the
//! lock so that another replica takes over at once instead of after the lease.

use clap::Args;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tenure::{Elector, ElectorError, Leadership};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backend::{Campaign, CampaignRequest};
use crate::options::{
    parse_duration, parse_http_address, CandidateOptions, CoordinationOptions, ElectionOptions, HttpAddress,
};
use crate::signals::{ResignRequests, TerminationSignals};
use crate::startup_pages::{self, Released};
use crate::{error::CliError, exit, http, logging, pod_label};

/// Arguments of `tenure elect`.
#[derive(Debug, Args)]
#[command(
    about = "Campaign for leadership and report who leads (a leader-elector:0.5 replacement)",
    long_about = "Campaign for leadership and report who leads (a leader-elector:0.5 replacement).\n\n\
        Stays a candidate until stopped: leads when it can, follows otherwise, and takes over when \
        the leader's lease runs out or the leader lets go. Every change of leader is logged on \
        standard error. With --http, GET on any path answers {\"name\":\"<leader>\"} (\"\" while \
        nobody is known to lead), on followers too, except for these paths:\n  \
        /isLeader  {\"isLeader\":true|false}, 200 (with ?strict: 503 when false)\n  \
        /status    leader, isLeader, term, role, timing and counters as JSON; \
        ?since=<version>&wait=<duration> waits (up to 60s) for a change\n  \
        /healthz   500 when leading without a renew for lease + --healthz-timeout, else 200\n  \
        /readyz    200; with --ready-only-when-leader 503 unless leading\n  \
        /events    Server-Sent Events, one per leadership change, the current state first\n  \
        /progress  POST ?term=T: the leader's application made progress (see --progress-timeout)\n  \
        /metrics   Prometheus metrics (leader_election_master_status{name} and tenure_*)\n  \
        (a near miss of these paths, such as /isleader or /statuz, answers 404)\n\n\
        Signals: SIGTERM, SIGINT and SIGHUP release the lock (another candidate takes over at \
        once) and exit with status 0, or 1 if the release could not be written in time (the lease \
        then runs out by itself). SIGKILL leaves the lock held until the lease runs out.\n\n\
        SIGUSR1 makes a leader step down and stay a candidate (for maintenance): it releases the \
        lock, so the next candidate in line leads at once with a higher term. On file and \
        Kubernetes locks this instance does not take the lock back for one lease unless nobody \
        else has; on etcd and ZooKeeper it queues up again behind the other candidates. A \
        follower ignores it.",
    after_help = "Example (sidecar):  tenure elect --election=my-controller --http=0.0.0.0:4040 --ttl=5s"
)]
pub struct ElectArgs {
    #[command(flatten)]
    election: ElectionOptions,

    #[command(flatten)]
    candidate: CandidateOptions,

    /// Serve the HTTP API (the leader's name, /isLeader, /status, probes, /events, /metrics) on
    /// this address (host:port, or :port for all interfaces).
    #[arg(long, value_name = "ADDR", value_parser = parse_http_address)]
    http: Option<HttpAddress>,

    /// How long past the lease a leader that has not renewed still passes /healthz (client-go's
    /// healthz adaptor timeout).
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = parse_duration)]
    healthz_timeout: Duration,

    /// Also fail /healthz (500) once every call to the lock has failed for longer than this,
    /// leader or follower, so that an instance that cannot reach its lock is restarted or at
    /// least shows as failing. Off by default: restarting does not fix an unreachable store.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    healthz_lock_unreachable: Option<Duration>,

    /// Answer /readyz with 503 unless this instance leads, so that a Service routes only to the
    /// leader.
    #[arg(long)]
    ready_only_when_leader: bool,

    /// Give way when the application makes no progress for this long: while this instance
    /// leads, its application must POST /progress?term=<term> at least this often (from the
    /// start of its tenure); after such a silence the sidecar logs why, counts it
    /// (tenure_gave_way_total), resigns (the lock is released, a healthy replica leads) and stays
    /// a candidate. Needs --http; at least one renew interval (--ttl / 8). Off by default: an
    /// application that does not know /progress keeps its leadership as with leader-elector.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "http")]
    progress_timeout: Option<Duration>,

    /// On Kubernetes, label this candidate's Pod with KEY=VALUE (VALUE defaults to true) while it
    /// leads, so that `kubectl get pods -l KEY=VALUE` or a Service selector finds the leader. The
    /// Pod is POD_NAMESPACE/POD_NAME (downward API), else the service account's namespace (or the
    /// lock's) and the --id. Advisory: for a moment after a change two pods, or none, may carry it.
    #[arg(long, value_name = "KEY[=VALUE]", value_parser = pod_label::parse_leader_label)]
    leader_label: Option<pod_label::LeaderLabel>,

    #[command(flatten)]
    coordination: CoordinationOptions,
}

impl ElectArgs {
    /// The progress watch when --progress-timeout is given, checked before anything starts: a
    /// silence shorter than one renew interval would make a healthy application give way.
    fn progress(&self) -> Result<Option<Arc<http::progress::Progress>>, CliError> {
        let Some(silence) = self.progress_timeout else { return Ok(None) };
        let renew_interval = self.candidate.ttl.timing.retry_period;
        if silence < renew_interval {
            return Err(CliError::SilenceTooShort { silence, renew_interval });
        }
        Ok(Some(Arc::new(http::progress::Progress::new(silence))))
    }
}

/// Runs `tenure elect` until a termination signal; returns the exit status.
pub async fn elect(args: ElectArgs) -> Result<u8, CliError> {
    logging::init(args.candidate.log_format);
    let mut signals = TerminationSignals::install().map_err(CliError::io("install signal handlers"))?;
    let mut resigns = ResignRequests::install().map_err(CliError::io("install signal handlers"))?;
    let identity = args.candidate.identity()?;
    let election = &args.election.election;
    let url = args.election.lock_url()?;
    url.announce_scope(args.election.lock.is_none());
    let cluster = args.election.cluster.options()?;
    if args.leader_label.is_some() {
        url.check_leader_label()?;
    }
    let coordinated = args.coordination.versions()?;
    let progress = args.progress()?;
    let listener = match &args.http {
        Some(address) => Some(bind(address).await?),
        None => None,
    };
    let (timing, leader_label) = (args.candidate.ttl.timing, args.leader_label.clone());
    let request = CampaignRequest { identity: &identity, timing, cluster: &cluster, coordinated, leader_label };
    let Campaign { elector, ending } = url.campaign(request).await?;
    let elector = Arc::new(elector);
    tracing::info!(
        identity,
        election,
        lock = %url,
        ttl = %humantime::format_duration(args.candidate.ttl.ttl),
        "campaigning"
    );

    let stop_serving = CancellationToken::new();
    let mut server = listener.map(|listener| {
        let view: Weak<Elector> = Arc::downgrade(&elector);
        let settings = http::ApiSettings {
            election: election.clone(),
            healthz_timeout: args.healthz_timeout,
            healthz_lock_unreachable: args.healthz_lock_unreachable,
            ready_only_when_leader: args.ready_only_when_leader,
            progress: progress.clone(),
        };
        let router = http::router(view, settings);
        tokio::spawn(http::serve(listener, router, stop_serving.clone().cancelled_owned()))
    });

    let timing = &args.candidate.ttl.timing;
    tokio::spawn(release_startup_pages(elector.subscribe(), timing.retry_period, timing.lease_duration));
    let (give_way, mut silent) = tokio::sync::mpsc::channel(1);
    if let Some(progress) = progress {
        tokio::spawn(http::progress::watch_progress(progress, elector.subscribe(), give_way));
    }

    let outcome = loop {
        tokio::select! {
            termination = signals.recv() => {
                tracing::info!(signal = termination.name, "stopping: releasing the lock");
                break Ok(());
            }
            () = resigns.recv() => resign_on_request(&elector).await,
            Some(term) = silent.recv() => give_way_without_progress(&elector, term, args.progress_timeout).await,
            reason = server_failed(&mut server) => {
                server = None;
                break Err(CliError::HttpServer(reason));
            }
            () = elector_stopped(elector.subscribe()) => {
                break Err(CliError::Ended("the elector stopped unexpectedly"));
            }
        }
    };

    // The HTTP server keeps answering while the lock is released (the backend's own steps
    // around the release, such as withdrawing a LeaseCandidate, are its ending's).
    let released = ending.finish(Box::pin(shutdown(elector))).await;
    stop_serving.cancel();
    if let Some(server) = server {
        if tokio::time::timeout(SERVER_STOP_TIMEOUT, server).await.is_err() {
            tracing::debug!("HTTP connections still open; closing them");
        }
    }
    outcome?;
    match released {
        Ok(()) => {
            tracing::info!("released the lock; exiting");
            Ok(exit::SUCCESS)
        }
        Err(error) => {
            tracing::warn!(%error, "exiting without a confirmed release");
            Ok(exit::FAILURE)
        }
    }
}

/// How long open HTTP connections may delay the exit once the lock is released.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(1);

/// Takes the elector back from the HTTP handlers, which only hold it weakly and never across an
/// await, and shuts it down (releasing the lock).
async fn shutdown(mut elector: Arc<Elector>) -> Result<(), ElectorError> {
    for _ in 0..100 {
        match Arc::try_unwrap(elector) {
            Ok(elector) => return elector.shutdown().await,
            Err(shared) => {
                elector = shared;
                tokio::task::yield_now().await;
            }
        }
    }
    // Unreachable on the current-thread runtime; dropping the last handle still releases the lock
    // in the background.
    Err(ElectorError::Stopped)
}

async fn bind(address: &HttpAddress) -> Result<TcpListener, CliError> {
    let listener = TcpListener::bind(&address.0).await.map_err(CliError::io(format!("listen on {}", address.0)))?;
    match listener.local_addr() {
        Ok(bound) => tracing::info!(address = %bound, "serving the leader's name over HTTP"),
        Err(_) => tracing::info!(address = address.0, "serving the leader's name over HTTP"),
    }
    Ok(listener)
}

/// Completes with the reason if the HTTP server task ends; never if there is no server.
async fn server_failed(server: &mut Option<JoinHandle<std::io::Result<()>>>) -> String {
    let Some(task) = server else { return std::future::pending().await };
    match task.await {
        Ok(Ok(())) => "it stopped".to_owned(),
        Ok(Err(error)) => error.to_string(),
        Err(error) => error.to_string(),
    }
}

/// SIGUSR1: steps down if leading (the lock is released at once, so another candidate takes over
/// with a higher term) and stays a candidate.
pub async fn resign_on_request(elector: &Elector) {
    match elector.is_leader() {
        Some(term) => {
            tracing::info!(term = term.0, "SIGUSR1: stepping down and staying a candidate");
            if let Err(error) = elector.resign().await {
                tracing::warn!(%error, "could not step down");
            }
        }
        None => tracing::info!("SIGUSR1: not leading, nothing to step down from"),
    }
}

/// The application made no progress for `silence` during the tenure `term`: resign if that
/// tenure still lasts (the lock is released, a healthy replica leads) and stay a candidate.
async fn give_way_without_progress(elector: &Elector, term: tenure::Term, silence: Option<Duration>) {
    if elector.is_leader() != Some(term) {
        return;
    }
    let silence = silence.map(humantime::format_duration).map(|s| s.to_string()).unwrap_or_default();
    tracing::warn!(
        term = term.0,
        silence,
        "giving way: the application made no progress (POST /progress) for --progress-timeout; stepping down"
    );
    if let Err(error) = elector.resign().await {
        tracing::warn!(%error, "could not step down");
    }
}

/// Start-up is over one retry period after a leader is first known (this instance or another):
/// by then a new leader has renewed once and announced itself (the Kubernetes Event), and a
/// follower has followed the leader's renew. Then gives back the pages of the binary that only
/// start-up used, so that an idle sidecar holds what its steady state runs (see
/// [`startup_pages`]). Never, if no leader is ever known. Once more a lease later: pages another
/// process of the same binary (another candidate starting on this host) held in the page cache at
/// the first release came back with the steady state's pages, and can be given back now.
async fn release_startup_pages(mut leadership: watch::Receiver<Leadership>, retry_period: Duration, lease: Duration) {
    if leadership.wait_for(|now| now.leader.is_some()).await.is_err() {
        return;
    }
    drop(leadership);
    for wait in [retry_period, lease] {
        tokio::time::sleep(wait).await;
        match startup_pages::release() {
            Ok(Released { resident_kib, mappings, refused }) => {
                tracing::debug!(kib = resident_kib, mappings, refused, "released the start-up pages")
            }
            Err(error) => tracing::debug!(%error, "could not release the start-up pages"),
        }
    }
}

/// Completes if the elector's task ends on its own (it never should before a shutdown).
async fn elector_stopped(mut leadership: watch::Receiver<Leadership>) {
    while leadership.changed().await.is_ok() {}
}
