//! What the write gate costs per request: a plain `kube::Client` against gated clients
//! (Active/Passive on an elector, Active/Active on a group member) that are allowed to write, so
//! every request is checked and then sent.
//!
//! Each gate is measured twice: wrapping an existing client (`WriteGate::client`, one more
//! `tower` buffer hop per request) and as a layer of a client built from the configuration
//! (`ClientBuilder::try_from(config)?.with_layer(&gate)`, no extra hop).
//!
//! Two measurements, each interleaving the clients request by request in a new random order every
//! round (so load from elsewhere on the machine hits them alike) and reporting medians:
//!
//! 1. against `tenure apiserver` on loopback, in this process: `GET` and `PUT` (a
//!    compare-and-swap replace) of a ConfigMap, through `Api`, as a controller makes them;
//! 2. against a no-op API (answers `{}` after yielding once, no network): the gate's own cost,
//!    without the noise of a real request around it.
//!
//! `cargo run --release -p tenure-kube --example write_gate_bench` (`TENURE_BENCH_ROUNDS`, default
//! 2000, sets the requests per client and kind).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Method, Request, Response};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::client::{Body, ClientBuilder};
use kube::Api;
use tenure::locks::memory::MemoryStore;
use tenure::Elector;
use tenure_apiserver::{ApiServer, ApiServerConfig};
use tenure_group::stores::memory::MemoryGroupStore;
use tenure_group::{Group, GroupConfig};
use tenure_kube::{ClusterOptions, WriteGate};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The clients compared: a plain one, and each gate wrapping it (`WriteGate::client`, same
/// connection pool) or built into a client of its own as a layer (`ClientBuilder::with_layer`),
/// measured against a second plain client with a pool of its own ("plain, own").
const VARIANTS: [&str; 6] = ["plain", "plain, own", "A/P client()", "A/P layer", "A/A client()", "A/A layer"];
/// The variant each one's overhead is measured against.
const BASELINE: [usize; 6] = [0, 0, 0, 1, 0, 1];

/// Answers every request with `{}` after yielding once to the runtime (as a request that has to
/// wait for its answer does), so that a gated write waits on its permission too.
#[derive(Clone)]
struct NoopApi;

impl tower_service::Service<Request<Body>> for NoopApi {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<Body>) -> Self::Future {
        Box::pin(async {
            tokio::task::yield_now().await;
            Ok(Response::new(Body::from(b"{}".to_vec())))
        })
    }
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Times `rounds` requests of each of `clients`, interleaved (in a new random order every round);
/// returns the samples per client.
async fn interleaved<C, F, Fut>(clients: &[C], rounds: usize, request: F) -> Vec<Vec<Duration>>
where
    F: Fn(&C, usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut samples = vec![Vec::with_capacity(rounds); clients.len()];
    let mut order: Vec<usize> = (0..clients.len()).collect();
    let mut random = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 0..rounds {
        shuffle(&mut order, &mut random);
        for &i in &order {
            settle().await;
            let start = Instant::now();
            request(&clients[i], round).await;
            samples[i].push(start.elapsed());
        }
    }
    samples
}

/// A new random order (Fisher-Yates on xorshift64), so that no client always follows the same
/// other one.
fn shuffle(order: &mut [usize], state: &mut u64) {
    for i in (1..order.len()).rev() {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        order.swap(i, (*state % (i as u64 + 1)) as usize);
    }
}

/// Lets the tasks a request woke on its way out (buffer workers, connection tasks) run before
/// the next one is timed, so that their work is not billed to the next client in the rotation.
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

fn report(what: &str, samples: &mut [Vec<Duration>]) {
    let medians: Vec<Duration> = samples.iter_mut().map(|s| median(s)).collect();
    for (i, (variant, samples)) in VARIANTS.iter().zip(samples.iter_mut()).enumerate() {
        let (p50, p90, baseline) = (medians[i], percentile(samples, 0.9), medians[BASELINE[i]]);
        let overhead = micros(p50) - micros(baseline);
        println!(
            "{what:<26} {variant:<13} p50 {:>8.2} us  p90 {:>8.2} us  vs {:<10} {overhead:>+7.2} us ({:>+6.2} %)",
            micros(p50),
            micros(p90),
            VARIANTS[BASELINE[i]],
            100.0 * overhead / micros(baseline),
        );
    }
}

fn main() -> Result<(), BoxError> {
    let rounds: usize = std::env::var("TENURE_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(2000);
    // The server on a thread of its own, as another process would be; the clients on this one.
    let server_runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let server = server_runtime.block_on(ApiServer::start(ApiServerConfig::default()))?;
    let kubeconfig = std::env::temp_dir().join(format!("write-gate-bench-{}.kubeconfig", server.address().port()));
    server.write_kubeconfig(&kubeconfig)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let outcome = runtime.block_on(async {
        // The permission sources: an elector that leads (memory lock), a member alone in its group.
        let elector = Elector::builder("bench", MemoryStore::new().client("bench")).spawn()?;
        drop(elector.acquired().await?);
        // The default 1024 partitions, all this member's.
        let group = Group::builder("bench", MemoryGroupStore::new().client("bench")).join()?;
        while group.assignment().borrow().owned.len() < GroupConfig::default().partition_count as usize {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let leader = WriteGate::leader(&elector);
        let owner = WriteGate::owner(group.ownership());

        // 1. Against the API server: the wrapping gates share the plain client's connection pool,
        // as a controller's would; a layered client has a pool of its own.
        let options = ClusterOptions { kubeconfig: Some(kubeconfig.clone()), ..ClusterOptions::default() };
        let base = options.client("bench").await?;
        let layered = |gate: &WriteGate, config: kube::Config| -> Result<kube::Client, BoxError> {
            Ok(ClientBuilder::try_from(config)?.with_layer(gate).build())
        };
        let clients = [
            base.clone(),
            kube::Client::try_from(options.config("bench").await?)?,
            leader.client(base.clone()),
            layered(&leader, options.config("bench").await?)?,
            owner.client(base.clone()),
            layered(&owner, options.config("bench").await?)?,
        ];
        let apis: Vec<(Api<ConfigMap>, String)> = clients
            .iter()
            .enumerate()
            .map(|(i, client)| (Api::default_namespaced(client.clone()), format!("bench-{i}")))
            .collect();
        for (api, name) in &apis {
            let cm = ConfigMap {
                metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &cm).await?;
        }
        let warmup = (rounds / 10).max(50);
        let get = |(api, name): &(Api<ConfigMap>, String), _round: usize| {
            let (api, name) = (api.clone(), name.clone());
            async move {
                api.get(&name).await.expect("get");
            }
        };
        interleaved(&apis, warmup, get).await;
        let mut gets = interleaved(&apis, rounds, get).await;
        // PUT: a compare-and-swap replace with the version just read; only the replace is timed.
        let mut puts = vec![Vec::with_capacity(rounds); apis.len()];
        let mut order: Vec<usize> = (0..apis.len()).collect();
        let mut random = 0x2545_f491_4f6c_dd1d_u64;
        for round in 0..rounds {
            shuffle(&mut order, &mut random);
            for &i in &order {
                let (api, name) = &apis[i];
                let mut cm = api.get(name).await?;
                cm.data = Some([("round".to_owned(), round.to_string())].into());
                settle().await;
                let start = Instant::now();
                api.replace(name, &PostParams::default(), &cm).await?;
                puts[i].push(start.elapsed());
            }
        }
        println!("{rounds} requests per client and kind, interleaved; tenure apiserver on loopback, in this process");
        report("GET configmap (apiserver)", &mut gets);
        report("PUT configmap (apiserver)", &mut puts);

        // 2. Against a no-op API: what the gate itself costs.
        let noop = kube::Client::new(NoopApi, "default");
        let noop_layered = |gate: &WriteGate| ClientBuilder::new(NoopApi, "default").with_layer(gate).build();
        let noops = [
            noop.clone(),
            kube::Client::new(NoopApi, "default"),
            leader.client(noop.clone()),
            noop_layered(&leader),
            owner.client(noop.clone()),
            noop_layered(&owner),
        ];
        let send = |method: Method| {
            move |client: &kube::Client, _round: usize| {
                let request = Request::builder()
                    .method(method.clone())
                    .uri("/api/v1/namespaces/default/configmaps/bench-1")
                    .body(Body::from(br#"{"metadata":{"name":"bench-1"}}"#.to_vec()))
                    .expect("a request");
                let client = client.clone();
                async move {
                    client.send(request).await.expect("sent");
                }
            }
        };
        let noop_rounds = rounds * 10;
        interleaved(&noops, noop_rounds / 10, send(Method::PUT)).await;
        let mut noop_gets = interleaved(&noops, noop_rounds, send(Method::GET)).await;
        let mut noop_puts = interleaved(&noops, noop_rounds, send(Method::PUT)).await;
        println!("{noop_rounds} requests per client and kind against a no-op API (no network): the gate's own cost");
        report("GET (no-op API)", &mut noop_gets);
        report("PUT (no-op API)", &mut noop_puts);

        group.leave().await?;
        elector.shutdown().await?;
        Ok::<_, BoxError>(())
    });
    let _ = std::fs::remove_file(&kubeconfig);
    server_runtime.block_on(server.shutdown());
    outcome
}
