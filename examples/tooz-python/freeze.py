#!/usr/bin/env python3
"""A plain Tooz application frozen past its session timeout: how long after the thaw it keeps
believing it leads; and the store requests of such applications at rest (issue 32).

The application (``freeze.py app``) is the issue's reference loop, nothing more: it watches
``elected_as_leader`` on one group and, every 0.1 s, calls ``heartbeat()``, ``run_watchers()``
and ``get_leader(group)``. It believes it leads from a ``get_leader`` answer naming itself until
a Tooz call tells it otherwise (``get_leader`` naming another member or nobody, or an exception
such as the Tenure driver's ``SessionExpired``). It writes one witness line per answer, with
``time.monotonic()`` (one ``CLOCK_MONOTONIC`` for every process on the host).

``bench``: N applications on one URL. Per freeze: the current leader is frozen with SIGSTOP
(``--freeze tree``, the default: its process group, the application and the driver's ``tenure
coordinate`` child, as a frozen container or VM; ``--freeze app``: the application's process
only), until another application's ``get_leader`` names itself and the session timeout + 0.5 s
passed; then SIGCONT. **Belief after the thaw** = the first answer after SIGCONT that does not
name the frozen application (or raises), minus the SIGCONT time; **stale answers** = answers
after SIGCONT that still name it (0 expected). Prints median / p99 (nearest rank) / max.

``rest``: N applications on a fresh etcd or ZooKeeper server (``servers.py``), one leading; after
they settled, the server's request counters over ``--rest-seconds``: etcd
``grpc_server_msg_received_total`` (by method), ZooKeeper ``zk_packets_received`` (pings
included). Only the store's side is counted, not the driver's loopback requests to its child.

    python3 freeze.py bench --store etcd --freezes 40
    python3 freeze.py rest --store etcd --rest-seconds 60

Stores: ``file`` (a directory), ``etcd``, ``zookeeper`` (``servers.py``), ``kubernetes`` (``tenure
apiserver``: ``$TENURE_BIN`` or ``tenure`` on PATH). ``--url`` overrides the Tenure URL template
(``{port}``, ``{lease}``, ``{dir}``), e.g. to measure one of Tooz's own drivers.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

GROUP = b"freeze-bench"
PERIOD = 0.1

URLS = {
    "file": "tenure+file://{dir}/store?timeout={lease}",
    "etcd": "tenure+etcd://127.0.0.1:{port}/freeze?timeout={lease}",
    "zookeeper": "tenure+zookeeper://127.0.0.1:{port}/freeze?timeout={lease}",
    "kubernetes": "tenure+kubernetes://default/freeze?timeout={lease}",
}


def get_coordinator(url, member_id):
    """tooz.coordination.get_coordinator, or the class named by $TOOZ_DRIVER ("module:Class")
    when the URL's scheme has no installed entry point (the driver used from a checkout)."""
    from tooz import coordination
    try:
        return coordination.get_coordinator(url, member_id)
    except Exception as error:  # stevedore's NoMatches when the entry point is not installed
        spec = os.environ.get("TOOZ_DRIVER")
        if not spec or type(error).__name__ != "NoMatches":
            raise
        import importlib
        import urllib.parse
        from oslo_utils import netutils
        module, _, cls = spec.partition(":")
        parsed = netutils.urlsplit(url)
        return getattr(importlib.import_module(module), cls)(member_id, parsed, urllib.parse.parse_qs(parsed.query))


# -- the application ---------------------------------------------------------------------------

def app(args):
    me = args.id.encode()
    out = os.open(args.witness, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def witness(**fields):
        fields.update(id=args.id, pid=os.getpid(), t=time.monotonic())
        os.write(out, (json.dumps(fields) + "\n").encode())

    coordinator = get_coordinator(args.url, me)
    coordinator.start(start_heart=False)
    try:
        coordinator.create_group(GROUP).get()
    except Exception:  # tooz.coordination.GroupAlreadyExist
        pass
    coordinator.watch_elected_as_leader(GROUP, lambda event: None)
    witness(ev="ready")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        try:
            coordinator.heartbeat()
            coordinator.run_watchers()
            leader = coordinator.get_leader(GROUP).get()
            witness(ev="answer", me=leader == me, leader=None if leader is None else leader.decode(errors="replace"))
        except Exception as error:  # noqa: BLE001 - what a plain application would log and go on with
            witness(ev="error", kind=type(error).__name__, error=str(error)[:200])
        time.sleep(PERIOD)
    coordinator.stop()
    return 0


# -- servers -----------------------------------------------------------------------------------

class ApiServer:
    """`tenure apiserver` on a free port, for tenure+kubernetes (KUBECONFIG for the apps)."""
    port = 0

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="freeze-apiserver-")
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        binary = os.environ.get("TENURE_BIN") or shutil.which("tenure") or "tenure"
        self.log = open(os.path.join(self.dir, "apiserver.log"), "wb")
        self.proc = subprocess.Popen([binary, "apiserver", "--listen", "127.0.0.1:0", "--kubeconfig", self.kubeconfig],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (os.path.exists(self.kubeconfig) and os.path.getsize(self.kubeconfig) > 0):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"tenure apiserver did not start; see {self.dir}")
            time.sleep(0.1)  # schedule: polling for the kubeconfig file

    def stop(self):
        self.proc.terminate()
        self.proc.wait(15)


def server_for(store):
    import servers
    return {"etcd": servers.Etcd, "zookeeper": servers.ZooKeeper, "kubernetes": ApiServer}.get(store, lambda: None)()


# -- the runner --------------------------------------------------------------------------------

class Apps:
    def __init__(self, url, n, workdir, env):
        self.url, self.workdir, self.env = url, workdir, env
        self.witness_path = os.path.join(workdir, "witness.jsonl")
        self.procs = {}
        self.lines, self.offset, self.partial = [], 0, b""
        for i in range(1, n + 1):
            ident = f"app{i}"
            log = open(os.path.join(workdir, f"{ident}.log"), "wb")
            self.procs[ident] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "app", "--url", url, "--id", ident, "--witness", self.witness_path],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def poll(self):
        try:
            with open(self.witness_path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.lines
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        self.lines.extend(json.loads(raw) for raw in complete if raw.strip())
        return self.lines

    def wait(self, predicate, timeout):
        """Polls the witness lines until predicate(lines) returns a value; None after timeout."""
        deadline = time.monotonic() + timeout
        while True:
            found = predicate(self.poll())
            if found is not None or time.monotonic() >= deadline:
                return found
            for ident, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{ident} exited ({proc.returncode}); see {self.workdir}/{ident}.log")
            time.sleep(0.01)  # schedule: polling the witness file

    def leader(self, timeout):
        """An application whose latest answer names itself, given within the last second."""
        def find(lines):
            latest = {}
            for line in lines:
                if line["ev"] in ("answer", "error"):
                    latest[line["id"]] = line
            now = time.monotonic()
            for ident, line in latest.items():
                if line.get("me") and now - line["t"] < 1.0:
                    return ident
            return None
        return self.wait(find, timeout)

    def signal(self, ident, sig, tree):
        pid = self.procs[ident].pid
        if tree:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)

    def stop(self):
        for ident, proc in self.procs.items():
            try:
                os.killpg(proc.pid, signal.SIGCONT)
                proc.terminate()
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def setup(args):
    workdir = args.workdir or tempfile.mkdtemp(prefix=f"freeze-{args.store}-")
    os.makedirs(workdir, exist_ok=True)
    server = server_for(args.store)
    if server is not None:
        server.start()
    env = os.environ.copy()
    if args.store == "kubernetes":
        env["KUBECONFIG"] = server.kubeconfig
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH"), here] if p)
    url = (args.url or URLS[args.store]).format(port=getattr(server, "port", 0), lease=args.lease, dir=workdir)
    return workdir, server, env, url


def bench(args):
    workdir, server, env, url = setup(args)
    print(f"== {args.store}: {url}, {args.n} applications, freeze {args.freeze}, workdir {workdir}", flush=True)
    apps = Apps(url, args.n, workdir, env)
    beliefs, stale_total, takeovers, results = [], 0, [], []
    try:
        for i in range(args.freezes):
            leader = apps.leader(60)
            if leader is None:
                raise RuntimeError(f"no leader within 60 s; see {workdir}")
            time.sleep(args.settle)  # schedule: let the others' loops run a while under this leader
            t_stop = time.monotonic()
            apps.signal(leader, signal.SIGSTOP, args.freeze == "tree")
            try:
                took = apps.wait(lambda lines: next((l["t"] for l in reversed(lines) if l["ev"] == "answer" and l["me"]
                                                     and l["id"] != leader and l["t"] > t_stop), None), 30)
                if took is None:
                    raise RuntimeError(f"freeze {i + 1}: nobody took over from {leader} within 30 s; see {workdir}")
                left = t_stop + args.lease + 0.5 - time.monotonic()
                if left > 0:
                    time.sleep(left)  # schedule: keep it frozen past its session timeout
            finally:
                t_cont = time.monotonic()
                apps.signal(leader, signal.SIGCONT, args.freeze == "tree")

            def told(lines):
                for line in lines:
                    if line["id"] == leader and line["t"] > t_cont and line["ev"] in ("answer", "error") \
                            and not line.get("me"):
                        return line
                return None
            line = apps.wait(told, 30)
            if line is None:
                raise RuntimeError(f"freeze {i + 1}: {leader} still believes it leads 30 s after the thaw; see {workdir}")
            stale = sum(1 for l in apps.lines if l["id"] == leader and l["ev"] == "answer" and l["me"]
                        and t_cont < l["t"] < line["t"])
            belief = line["t"] - t_cont
            beliefs.append(belief)
            takeovers.append(took - t_stop)
            stale_total += stale
            results.append({"leader": leader, "belief_s": belief, "stale": stale, "told_by": line.get("kind", "get_leader"),
                            "takeover_s": took - t_stop, "frozen_s": t_cont - t_stop})
            print(f"freeze {i + 1}: {leader} frozen {t_cont - t_stop:.2f} s (taken over after {took - t_stop:.2f} s); "
                  f"told {belief * 1000:.1f} ms after the thaw by {line.get('kind', 'get_leader')}; stale answers {stale}",
                  flush=True)
            # the thawed application is back in its loop (a normal answer) before the next freeze
            if apps.wait(lambda lines: next((l for l in reversed(lines) if l["id"] == leader and l["ev"] == "answer"
                                             and l["t"] > line["t"]), None), 60) is None:
                raise RuntimeError(f"{leader} did not answer again after its thaw; see {workdir}")
    finally:
        apps.stop()
        if server is not None:
            server.stop()
    ms = [b * 1000 for b in beliefs]
    summary = {"store": args.store, "url": url, "freeze": args.freeze, "freezes": len(ms),
               "belief_ms": {"median": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "max": max(ms)},
               "stale_answers": stale_total, "takeover_s_median": percentile(takeovers, 0.5)}
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "results": results}, f, indent=1)
    return 0


def rest(args):
    workdir, server, env, url = setup(args)
    if server is None or not hasattr(server, "counters"):
        sys.exit("rest needs a server that counts requests: --store etcd or zookeeper")
    print(f"== {args.store}: {url}, {args.n} applications at rest, workdir {workdir}", flush=True)
    apps = Apps(url, args.n, workdir, env)
    try:
        if apps.leader(60) is None:
            raise RuntimeError(f"no leader within 60 s; see {workdir}")
        time.sleep(2 * args.lease)  # schedule: let joins and the first election settle before counting
        before, t0 = server.counters(), time.monotonic()
        time.sleep(args.rest_seconds)  # schedule: the measurement window
        after, minutes = server.counters(), (time.monotonic() - t0) / 60
        errors = sum(1 for l in apps.poll() if l["ev"] == "error")
    finally:
        apps.stop()
        server.stop()
    key = "grpc_server_msg_received_total" if "by_method" in after else "zk_packets_received"
    total = (after[key] - before[key]) / minutes
    summary = {"store": args.store, "url": url, "apps": args.n, "window_s": round(minutes * 60, 1),
               "requests_per_min_all_apps": round(total), "requests_per_min_per_app": round(total / args.n),
               "errors": errors}
    if "by_method" in after:
        summary["by_method_per_min_all_apps"] = {
            m: round((v - before["by_method"].get(m, 0.0)) / minutes) for m, v in after["by_method"].items()
            if v - before["by_method"].get(m, 0.0) > 0}
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    one = sub.add_parser("app", help="one application (started by bench and rest)")
    one.add_argument("--url", required=True)
    one.add_argument("--id", required=True)
    one.add_argument("--witness", required=True)
    for name in ("bench", "rest"):
        p = sub.add_parser(name)
        p.add_argument("--store", choices=sorted(URLS), required=True)
        p.add_argument("--url", help="URL template instead of the store's Tenure URL ({port}, {lease}, {dir})")
        p.add_argument("--lease", type=int, default=3, help="the session timeout, seconds")
        p.add_argument("-n", type=int, default=3)
        p.add_argument("--workdir")
        p.add_argument("--out", help="write the results as JSON here")
        if name == "bench":
            p.add_argument("--freezes", type=int, default=40)
            p.add_argument("--freeze", choices=("tree", "app"), default="tree")
            p.add_argument("--settle", type=float, default=1.0, help="seconds under each leader before its freeze")
        else:
            p.add_argument("--rest-seconds", type=float, default=60)
    args = parser.parse_args()
    return {"app": app, "bench": bench, "rest": rest}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
