//! `tenure elect` as the leader-elector:0.5 sidecar on Kubernetes, end to end: a `tenure apiserver`
//! process, three `tenure elect` processes started with the seed's container args, and checks made
//! only through their HTTP APIs and kubectl, as an application and an operator would.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{get, http_get, http_leader, metric, run_to_end, wait_until, EventStream, TempDir, Tenure, TENURE};

/// The seed's args (`--election=kuryr-controller --http=0.0.0.0:16401 --election-namespace=kube-system
/// --ttl=5s`), with a loopback port of the test's choosing (three replicas share one host here).
const SEED_ARGS: [&str; 4] = ["elect", "--election=kuryr-controller", "--election-namespace=kube-system", "--ttl=5s"];

/// A `tenure apiserver` process and the kubeconfig it wrote.
struct Cluster {
    _server: Tenure,
    dir: TempDir,
}

impl Cluster {
    fn start(label: &str) -> Cluster {
        let dir = TempDir::new(label);
        let kubeconfig = dir.join("kubeconfig");
        let server = common::start_apiserver(&kubeconfig);
        Cluster { _server: server, dir }
    }

    fn kubeconfig(&self) -> String {
        self.dir.join("kubeconfig").display().to_string()
    }

    /// Starts `tenure elect` with the seed's args plus `extra`, as pod `id`, on a free loopback port.
    fn elect(&self, id: &str, extra: &[&str]) -> (Tenure, String) {
        self.elect_with_ttl(id, "5s", extra)
    }

    /// As [`Cluster::elect`], with another `--ttl` than the seed's.
    fn elect_with_ttl(&self, id: &str, ttl: &str, extra: &[&str]) -> (Tenure, String) {
        let mut command = Command::new(TENURE);
        let args =
            SEED_ARGS.iter().map(|a| if a.starts_with("--ttl=") { format!("--ttl={ttl}") } else { a.to_string() });
        command.args(args).args(["--http=127.0.0.1:0", &format!("--id={id}")]).args(extra);
        command.env("KUBECONFIG", self.kubeconfig()).env_remove("KUBERNETES_SERVICE_HOST");
        let tenure = Tenure::start_with(id, &mut command);
        let address = tenure.http_address();
        (tenure, address)
    }

    fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let output = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .stdin(Stdio::null())
            .output()
            .expect("kubectl is installed (scripts/test makes sure)");
        let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
        (output.status.success(), text)
    }
}

/// Waits until every address answers `leader`; returns how long it took.
fn all_report(addresses: &[&str], leader: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    wait_until(limit, || addresses.iter().all(|a| http_leader(a).as_deref() == Some(leader)).then_some(()))
        .unwrap_or_else(|| {
            let answers: Vec<_> = addresses.iter().map(|a| http_leader(a)).collect();
            panic!("not all report {leader:?} within {limit:?}: {answers:?}")
        });
    started.elapsed()
}

fn is_leader(address: &str) -> bool {
    http_get(address, "/isLeader").is_some_and(|body| body.contains("true"))
}

/// Agreement within 30 s: a coordinated handover goes through the coordinator (lease release,
/// candidate pings), which a machine loaded several times over stretched past 15 s once.
fn the_leader(addresses: &[&str]) -> String {
    wait_until(Duration::from_secs(30), || {
        let first = http_leader(addresses[0]).filter(|l| !l.is_empty())?;
        addresses.iter().all(|a| http_leader(a).as_deref() == Some(first.as_str())).then_some(first)
    })
    .unwrap_or_else(|| {
        let answers: Vec<_> = addresses.iter().map(|a| http_get(a, "/status")).collect();
        panic!("the candidates do not agree on one leader: {answers:#?}")
    })
}

#[test]
fn the_seed_sidecar_args_elect_one_leader_fail_over_and_hand_over() {
    let cluster = Cluster::start("kube-seed");
    let mut replicas: Vec<(Tenure, String)> =
        ["pod-a", "pod-b", "pod-c"].iter().map(|id| cluster.elect(id, &[])).collect();
    let addresses: Vec<String> = replicas.iter().map(|(_, a)| a.clone()).collect();
    let all: Vec<&str> = addresses.iter().map(String::as_str).collect();
    let leader = the_leader(&all);
    assert_eq!(all.iter().filter(|a| is_leader(a)).count(), 1, "exactly one says it leads");

    // Probes and metrics match the state, on every replica.
    for (tenure, address) in &replicas {
        let leads = tenure.name == leader;
        assert_eq!(get(address, "/healthz").map(|(code, _)| code), Some(200));
        assert_eq!(get(address, "/readyz").map(|(code, _)| code), Some(200));
        let series = "leader_election_master_status{name=\"kuryr-controller\"}";
        assert_eq!(metric(address, series), Some(if leads { 1.0 } else { 0.0 }), "{}", tenure.name);
    }
    // Every replica's SSE stream, from now on; checked at the end on the one that survives.
    let mut streams: Vec<(String, EventStream)> =
        replicas.iter().map(|(t, a)| (t.name.clone(), EventStream::open(a))).collect();
    let firsts: Vec<serde_json::Value> = streams.iter_mut().map(|(_, s)| s.next().1).collect();
    assert!(firsts.iter().all(|e| e["leader"] == leader.as_str()), "{firsts:?}");

    // The lock is the one leader-elector:0.5 used (Endpoints annotation) and a Lease beside it.
    let (ok, described) = cluster.kubectl(&["describe", "ep", "kuryr-controller", "-n", "kube-system"]);
    assert!(ok && described.contains("control-plane.alpha.kubernetes.io/leader"), "{described}");
    assert!(described.contains(&format!("\"holderIdentity\":\"{leader}\"")), "{described}");
    let (ok, leases) = cluster.kubectl(&["get", "lease", "kuryr-controller", "-n", "kube-system"]);
    assert!(ok && leases.contains(&leader), "{leases}");
    let (ok, events) = cluster.kubectl(&["get", "events", "-n", "kube-system"]);
    assert!(ok && events.contains(&format!("{leader} became leader")), "{events}");

    // kill -9 of the leader: the others report the new one within lease + 1 s.
    let index = replicas.iter().position(|(t, _)| t.name == leader).unwrap();
    let (mut killed, _) = replicas.remove(index);
    killed.signal(libc::SIGKILL);
    killed.wait_exit(Duration::from_secs(5)).expect("killed");
    let rest: Vec<&str> = replicas.iter().map(|(_, a)| a.as_str()).collect();
    let started = Instant::now();
    let second = wait_until(Duration::from_secs(6), || {
        let leader = http_leader(rest[0]).filter(|l| !l.is_empty() && *l != killed.name)?;
        rest.iter().all(|a| http_leader(a).as_deref() == Some(leader.as_str())).then_some(leader)
    })
    .unwrap_or_else(|| panic!("no new leader reported by all within lease + 1 s ({:?})", started.elapsed()));

    // SIGTERM of the new leader: it releases, the last one reports itself within 1 s.
    let index = replicas.iter().position(|(t, _)| t.name == second).unwrap();
    let (mut stopped, _) = replicas.remove(index);
    stopped.signal(libc::SIGTERM);
    let last = replicas[0].1.clone();
    let took = all_report(&[&last], &replicas[0].0.name, Duration::from_secs(5));
    assert!(took < Duration::from_secs(1), "handover after SIGTERM took {took:?}");
    assert_eq!(stopped.exit_code(Duration::from_secs(5)), 0, "{}", stopped.log());
    let (ok, events) = cluster.kubectl(&["get", "events", "-n", "kube-system"]);
    assert!(ok && events.contains(&format!("{second} stopped leading")), "{events}");

    // The survivor pushed each change once and in order: the first leader, the second, itself.
    let survivor = replicas[0].0.name.clone();
    let (_, mut stream) = streams.into_iter().find(|(name, _)| *name == survivor).unwrap();
    let mut leaders = vec![leader.clone()];
    let mut last_term = 0;
    while leaders.last() != Some(&survivor) {
        let (_, event) = stream.next();
        let term = event["term"].as_u64().unwrap_or(last_term);
        assert!(term >= last_term, "terms never go back: {event}");
        last_term = term;
        let named = event["leader"].as_str().unwrap_or("").to_owned();
        if !named.is_empty() && leaders.last() != Some(&named) {
            assert!(!leaders.contains(&named), "{named} pushed twice: {leaders:?}");
            leaders.push(named);
        }
    }
    assert_eq!(leaders, [leader, second, survivor.clone()]);
    assert_eq!(metric(&last, "leader_election_master_status{name=\"kuryr-controller\"}"), Some(1.0));
}

#[test]
fn a_leader_label_follows_the_leader_and_kubectl_finds_it() {
    let cluster = Cluster::start("kube-label");
    for pod in ["pod-a", "pod-b"] {
        let manifest = format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"{pod}\",\"namespace\":\"kube-system\"}},\"spec\":{{\"containers\":[{{\"name\":\"c\",\"image\":\"x\"}}]}}}}"
        );
        let path = cluster.dir.join(&format!("{pod}.json"));
        std::fs::write(&path, manifest).unwrap();
        let (ok, out) = cluster.kubectl(&["create", "-f", path.to_str().unwrap()]);
        assert!(ok, "{out}");
    }
    let extra = ["--lock-type=leases", "--leader-label=example.com/leader=yes"];
    let pods = |selector: &str| cluster.kubectl(&["get", "pods", "-n", "kube-system", "-l", selector, "-o", "name"]).1;
    let (mut a, a_http) = cluster.elect("pod-a", &extra);
    all_report(&[&a_http], "pod-a", Duration::from_secs(10));
    let (_b, b_http) = cluster.elect("pod-b", &extra);
    all_report(&[&b_http], "pod-a", Duration::from_secs(10));
    wait_until(Duration::from_secs(10), || (pods("example.com/leader=yes").trim() == "pod/pod-a").then_some(()))
        .unwrap_or_else(|| panic!("pod-a is not labelled: {}", pods("example.com/leader")));

    a.signal(libc::SIGTERM);
    assert_eq!(a.exit_code(Duration::from_secs(5)), 0, "{}", a.log());
    all_report(&[&b_http], "pod-b", Duration::from_secs(5));
    wait_until(Duration::from_secs(10), || (pods("example.com/leader=yes").trim() == "pod/pod-b").then_some(()))
        .unwrap_or_else(|| panic!("the label did not move to pod-b: {}", pods("example.com/leader")));
}

#[test]
fn a_rolling_migration_from_endpoints_to_leases_never_has_two_leaders() {
    let cluster = Cluster::start("kube-migrate");
    // Phase by phase, one replica at a time is replaced, as a Deployment's rolling update does:
    // endpoints (leader-elector:0.5's lock) -> endpointsleases -> leases.
    let mut replicas: Vec<(Tenure, String)> =
        ["a0", "b0", "c0"].iter().map(|id| cluster.elect_with_ttl(id, "2s", &["--lock-type=endpoints"])).collect();
    the_leader(&replicas.iter().map(|(_, a)| a.as_str()).collect::<Vec<_>>());
    let mut samples = 0u64;
    let mut check = |replicas: &[(Tenure, String)]| {
        let leading: Vec<&str> = replicas.iter().filter(|(_, a)| is_leader(a)).map(|(t, _)| t.name.as_str()).collect();
        samples += 1;
        assert!(leading.len() <= 1, "two leaders at once: {leading:?}");
    };
    for (phase, kind) in [(1, "endpointsleases"), (2, "leases")] {
        for slot in 0..3 {
            let id = format!("{}{phase}", ["a", "b", "c"][slot]);
            let (new, address) = cluster.elect_with_ttl(&id, "2s", &[&format!("--lock-type={kind}")]);
            let (mut old, _) = std::mem::replace(&mut replicas[slot], (new, address));
            // The old replica leaves as Kubernetes stops it: SIGTERM (it releases if it leads).
            old.signal(libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(1);
            while Instant::now() < deadline {
                check(&replicas);
            }
            assert_eq!(old.exit_code(Duration::from_secs(5)), 0, "{}", old.log());
            // One replica leads; the others name it, except that an endpointsleases replica cannot
            // name a leases replica's leadership (it sees an Endpoints record the leases replicas
            // no longer write): client-go's placeholder holder, which the sidecar answers as unknown.
            let leader = wait_until(Duration::from_secs(15), || {
                let leading: Vec<&(Tenure, String)> = replicas.iter().filter(|(_, a)| is_leader(a)).collect();
                let [(leader, _)] = leading.as_slice() else { return None };
                let named = replicas.iter().all(|(_, a)| {
                    let answer = http_leader(a).unwrap_or_default();
                    answer == leader.name || answer.is_empty()
                });
                named.then(|| leader.name.clone())
            })
            .unwrap_or_else(|| {
                let answers: Vec<_> = replicas.iter().map(|(_, a)| http_get(a, "/status")).collect();
                panic!("no single leader named by all: {answers:#?}")
            });
            check(&replicas);
            assert!(replicas.iter().any(|(t, _)| t.name == leader), "the leader {leader} is a running replica");
        }
    }
    assert!(samples > 30, "the invariant was sampled {samples} times");
}

#[test]
fn bad_kubernetes_flags_are_one_line_usage_errors() {
    for (args, needle) in [
        (vec!["elect", "--election=x", "--lock-type=pods"], "lock type"),
        (vec!["elect", "--election=x", "--lock-type=leases", "--lock=memory:"], "--lock-type"),
        (vec!["elect", "--election=x", "--leader-label=-bad"], "label"),
        (vec!["elect", "--election=x", "--lock=kube://Bad/leases/x"], "namespace"),
        (vec!["elect", "--election-namespace=kube-system"], "--election"),
    ] {
        let (code, _, stderr) = run_to_end(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn run_and_status_use_the_same_kubernetes_lock() {
    let cluster = Cluster::start("kube-run");
    let tenure = |args: &[&str]| {
        let output = Command::new(TENURE)
            .args(args)
            .env("KUBECONFIG", cluster.kubeconfig())
            .stdin(Stdio::null())
            .output()
            .expect("run tenure");
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
    };
    let mut args = common::words("run --election=job --lock-type=leases --id=runner --ttl=2s -- sh -c");
    args.push("echo term=$TENURE_TERM; exit 3");
    let (code, stdout, stderr) = tenure(&args);
    assert_eq!(code, 3, "{stderr}");
    assert_eq!(stdout.trim(), "term=1");

    let (code, stdout, stderr) =
        tenure(&["status", "--election=job", "--lock=kube://default/leases/job", "--output=json"]);
    assert_eq!(code, 0, "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["state"], "free", "run released the lock when its command ended: {status}");
    assert_eq!(status["term"], 1, "{status}");
    let (ok, lease) = cluster.kubectl(&["get", "lease", "job", "-o", "jsonpath={.spec.leaseTransitions}"]);
    assert!(ok && lease == "1", "the term is the Lease's leaseTransitions: {lease}");
    let (code, _, stderr) = tenure(&["status", "--election=job", "--lock=kube://default/leases/none"]);
    assert_eq!(code, 0, "a lock never written is a free lock: {stderr}");
}

/// The repository's `deploy/` directory.
fn deploy_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

#[test]
fn the_deploy_manifests_apply_and_the_example_sidecar_args_elect() {
    let cluster = Cluster::start("kube-deploy");
    let rbac = deploy_dir().join("rbac");
    let mut files: Vec<_> = std::fs::read_dir(&rbac).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 6, "one RBAC file per lock kind and the pod label: {files:?}");
    for file in &files {
        let (ok, out) = cluster.kubectl(&["apply", "-f", file.to_str().unwrap()]);
        assert!(ok, "{}: {out}", file.display());
    }
    let (ok, roles) = cluster.kubectl(&["get", "roles", "-o", "name"]);
    for kind in ["leases", "endpoints", "configmaps", "endpointsleases", "configmapsleases"] {
        assert!(ok && roles.contains(&format!("role.rbac.authorization.k8s.io/tenure-elector-{kind}")), "{roles}");
    }
    let example = deploy_dir().join("example-deployment.yaml");
    let (ok, out) = cluster.kubectl(&["apply", "-f", example.to_str().unwrap()]);
    assert!(ok, "{out}");
    let jsonpath = "jsonpath={.spec.template.spec.initContainers[?(@.name==\"leader-elector\")].args}";
    let (ok, args) = cluster.kubectl(&["get", "deployment", "kuryr-controller", "-n", "kube-system", "-o", jsonpath]);
    assert!(ok, "{args}");
    let args: Vec<String> = serde_json::from_str(&args).unwrap_or_else(|e| panic!("{e}: {args}"));
    assert!(args.iter().any(|a| a == "--election=kuryr-controller"), "{args:?}");

    // The example's args as the container runtime would pass them ($(POD_NAME) expanded), with
    // the port moved to a free loopback one.
    let args: Vec<String> =
        args.iter()
            .map(|a| {
                if a.starts_with("--http=") {
                    "--http=127.0.0.1:0".to_owned()
                } else {
                    a.replace("$(POD_NAME)", "pod-x")
                }
            })
            .collect();
    let mut command = Command::new(TENURE);
    command.arg("elect").args(&args).env("KUBECONFIG", cluster.kubeconfig());
    let sidecar = Tenure::start_with("pod-x", &mut command);
    let address = sidecar.http_address();
    all_report(&[&address], "pod-x", Duration::from_secs(10));
    let (ok, lease) = cluster.kubectl(&["get", "lease", "kuryr-controller", "-n", "kube-system"]);
    assert!(ok && lease.contains("pod-x"), "{lease}");
}

#[test]
fn status_watch_on_kubernetes_prints_the_handover_as_it_is_pushed() {
    let cluster = Cluster::start("kube-watch");
    // A long interval: the changes must arrive through the API server's watch, not by polling.
    let mut command = Command::new(TENURE);
    command
        .args(["status", "--election=kuryr-controller", "--election-namespace=kube-system", "--watch"])
        .args(["--interval", "1h", "--output", "json"])
        .env("KUBECONFIG", cluster.kubeconfig())
        .env_remove("KUBERNETES_SERVICE_HOST");
    let watch = Tenure::start_with("watch", &mut command);
    let (mut one, one_http) = cluster.elect("one", &[]);
    wait_until(Duration::from_secs(10), || is_leader(&one_http).then_some(())).expect("one leads");
    let (_two, two_http) = cluster.elect("two", &[]);
    wait_until(Duration::from_secs(10), || (http_leader(&two_http)? == "one").then_some(())).expect("two follows");
    common::wait_for_watched_leaders(&watch, &["one"]);
    one.signal(libc::SIGTERM);
    common::wait_for_watched_leaders(&watch, &["one", "two"]);
    assert_eq!(one.exit_code(Duration::from_secs(5)), 0);
}

/// `tenure elect --coordinated` as `version`, on the Lease `ctl` of the default namespace.
fn coordinated(cluster: &Cluster, id: &str, version: &str) -> (Tenure, String) {
    let mut command = Command::new(TENURE);
    command.args(["elect", "--election=ctl", "--lock=kube://default/leases/ctl", "--ttl=2s", "--coordinated"]);
    command.args([format!("--binary-version={version}"), "--http=127.0.0.1:0".into(), format!("--id={id}")]);
    command.env("KUBECONFIG", cluster.kubeconfig()).env_remove("KUBERNETES_SERVICE_HOST");
    let tenure = Tenure::start_with(id, &mut command);
    let address = tenure.http_address();
    (tenure, address)
}

#[test]
fn a_rolling_upgrade_of_coordinated_sidecars_keeps_the_oldest_version_leading() {
    let cluster = Cluster::start("kube-coordinated");
    let mut replicas: Vec<(Tenure, String, &str)> = ["pod-a", "pod-b", "pod-c"]
        .iter()
        .map(|id| {
            let (tenure, address) = coordinated(&cluster, id, "1.0");
            (tenure, address, "1.0")
        })
        .collect();
    let addresses = |replicas: &[(Tenure, String, &str)]| replicas.iter().map(|r| r.1.clone()).collect::<Vec<_>>();
    let all = addresses(&replicas);
    the_leader(&all.iter().map(String::as_str).collect::<Vec<_>>());
    let (ok, listed) = cluster.kubectl(&["get", "leasecandidates"]);
    assert!(ok && ["pod-a", "pod-b", "pod-c"].iter().all(|p| listed.contains(p)), "{listed}");

    for id in ["pod-b", "pod-a", "pod-c"] {
        let position = replicas.iter().position(|r| r.0.name == id).unwrap();
        let (mut old, _, _) = replicas.remove(position);
        old.signal(libc::SIGTERM);
        assert_eq!(old.exit_code(Duration::from_secs(10)), 0, "{}", old.log());
        let (tenure, address) = coordinated(&cluster, id, "1.1");
        replicas.push((tenure, address, "1.1"));
        let all = addresses(&replicas);
        let leader = the_leader(&all.iter().map(String::as_str).collect::<Vec<_>>());
        let version = replicas.iter().find(|r| r.0.name == leader).unwrap().2;
        if replicas.iter().any(|r| r.2 == "1.0") {
            assert_eq!(version, "1.0", "after upgrading {id}, {leader} leads on {version} while 1.0 remains");
        }
        assert_eq!(all.iter().filter(|a| is_leader(a)).count(), 1, "exactly one says it leads");
    }
}

/// `tenure run --coordinated` as `version`, on the Lease `job`: its command appends `start ID`
/// when it starts and `stop ID` when it stops to `log`.
fn coordinated_run(cluster: &Cluster, id: &str, version: &str, log: &std::path::Path) -> Tenure {
    let script = format!(
        "echo \"start $TENURE_IDENTITY\" >> {log}; trap 'echo \"stop $TENURE_IDENTITY\" >> {log}; exit 0' TERM; \
         while :; do sleep 0.05; done",
        log = log.display()
    );
    let mut command = Command::new(TENURE);
    command.args(["run", "--election=job", "--lock=kube://default/leases/job", "--ttl=2s", "--coordinated"]);
    command.args([format!("--binary-version={version}"), format!("--id={id}"), "--".into(), "sh".into(), "-c".into(), script]);
    command.env("KUBECONFIG", cluster.kubeconfig()).env_remove("KUBERNETES_SERVICE_HOST");
    Tenure::start_with(id, &mut command)
}

/// Who runs the command according to `log`; panics if two ever ran at once.
fn running(log: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let mut current: Option<String> = None;
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("start", id)) => {
                assert!(current.is_none(), "{id} started while {current:?} ran:\n{text}");
                current = Some(id.to_owned());
            }
            Some(("stop", id)) => {
                assert_eq!(current.as_deref(), Some(id), "{id} stopped but {current:?} ran:\n{text}");
                current = None;
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    current
}

/// Who runs the command once the coordinator is settled: the Lease names that replica as holder
/// and prefers no other (a handover it asked for is over).
fn settled_runner(cluster: &Cluster, log: &std::path::Path) -> Option<String> {
    let runner = running(log)?;
    let (ok, lease) = cluster.kubectl(&["get", "lease", "job", "-o", "json"]);
    let lease: serde_json::Value = serde_json::from_str(&lease).ok().filter(|_| ok)?;
    let spec = &lease["spec"];
    let preferred = spec["preferredHolder"].as_str().filter(|p| !p.is_empty());
    (spec["holderIdentity"].as_str() == Some(runner.as_str()) && preferred.is_none_or(|p| p == runner)).then_some(runner)
}

#[test]
fn a_rolling_upgrade_of_coordinated_runs_keeps_the_oldest_version_running_the_command_alone() {
    let cluster = Cluster::start("kube-coordinated-run");
    let log = cluster.dir.join("commands");
    let mut replicas: Vec<(Tenure, &str)> =
        ["pod-a", "pod-b", "pod-c"].iter().map(|id| (coordinated_run(&cluster, id, "1.0", &log), "1.0")).collect();
    wait_until(Duration::from_secs(30), || settled_runner(&cluster, &log)).expect("one replica runs the command");
    for id in ["pod-b", "pod-a", "pod-c"] {
        let position = replicas.iter().position(|r| r.0.name == id).unwrap();
        let (mut old, _) = replicas.remove(position);
        old.signal(libc::SIGTERM);
        // The command's own status if it ran it, else 128 + SIGTERM (stopped before leading).
        let code = old.exit_code(Duration::from_secs(10));
        assert!(code == 0 || code == 128 + libc::SIGTERM, "exit {code}: {}", old.log());
        replicas.push((coordinated_run(&cluster, id, "1.1", &log), "1.1"));
        let oldest: Vec<&str> = replicas.iter().filter(|r| r.1 == "1.0").map(|r| r.0.name.as_str()).collect();
        let runner = wait_until(Duration::from_secs(30), || {
            settled_runner(&cluster, &log).filter(|runner| oldest.is_empty() || oldest.contains(&runner.as_str()))
        });
        assert!(runner.is_some(), "after upgrading {id}, no 1.0 replica of {oldest:?} runs the command alone");
    }
}

#[test]
fn coordinated_flags_are_checked_before_anything_starts() {
    for (args, expected) in [
        (vec!["elect", "--election=e", "--lock=file:///tmp/x", "--coordinated"], "needs a Kubernetes Lease lock"),
        (vec!["elect", "--election=e", "--lock=kube://default/endpoints/e", "--coordinated"], "needs a Lease lock"),
        (vec!["elect", "--election=e", "--binary-version=1.0"], "--coordinated"),
        (vec!["elect", "--election=e", "--coordinated", "--binary-version=one"], "not a version"),
        (vec!["elect", "--election=e", "--coordinated", "--binary-version=1.0", "--emulation-version=1.1"], "newer than"),
    ] {
        let (code, stdout, stderr) = run_to_end(&args);
        assert_eq!(code, 2, "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
