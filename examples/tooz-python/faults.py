#!/usr/bin/env python3
"""Fault runner and witness checker for controller.py.

Starts N controllers on one Tooz URL, waits for a leader that handles objects, then injects
faults in rotation, each on the current leader:

* ``kill``: SIGKILL of the controller, then restart it (a new incarnation, id ``rK-I``);
* ``killtree``: SIGKILL of the controller and every process it started (the Tenure driver's
  ``tenure coordinate`` child) at once, as when a container or host dies; the same as ``kill``
  for drivers without a child;
* ``stop``: SIGSTOP for ``--pause`` seconds (default 2 x lease + 1), then SIGCONT;
* ``term``: SIGTERM (the controller stands down, leaves and stops), then restart it.

Before each fault it waits (with a deadline) for a leader that has handled a few objects. It stops
by itself after ``--faults`` faults and stops every controller it started.

From the witness file (all processes on this host, so ``time.monotonic()`` is one clock) it checks:

* overlaps: two handling intervals (begin..end) of different processes that intersect; each
  handling of the deposed leader (the lower term, else the older election) that overlaps is
  counted once, as ``stale_start`` (it *began* after the newer leader was elected: the deposed
  leader did not know) or ``in_flight`` (it began before, e.g. frozen mid-handling), with whether
  the fake API refused its commit by its term;
* terms: every new leadership's term is higher than every earlier one's (when the driver has one);

and measures per fault: failover (kill/SIGSTOP -> first ``begin`` of a newly elected leader), the
callback latency (-> the new leader's ``watch_elected_as_leader`` callback), graceful handover
(SIGTERM -> the next leader's callback and first begin). Prints medians and p99.

    python3 faults.py --url 'zookeeper://127.0.0.1:2181?timeout=3' --lease 3 --faults 30
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def percentile(values, p):
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


class Witness:
    """Reads the witness file incrementally."""

    def __init__(self, path):
        self.path = path
        self.lines = []
        self.offset = 0
        self.partial = b""

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.lines
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        for raw in complete:
            if raw.strip():
                try:
                    self.lines.append(json.loads(raw))
                except ValueError:
                    self.lines.append({"ev": "garbled", "raw": raw[:200].decode(errors="replace"), "mono": 0})
        return self.lines

    def wait_for(self, predicate, timeout, step=0.02):
        """The first line (in file order) satisfying predicate, waiting up to timeout seconds."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            lines = self.poll()
            for line in lines[seen:]:
                if predicate(line):
                    return line
            seen = len(lines)
            if time.monotonic() >= deadline:
                return None
            time.sleep(step)


def descendants(pid):
    """Every process below pid (from /proc/PID/task/TID/children)."""
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                kids = []
            found.extend(kids)
            stack.extend(kids)
    return found


class Cluster:
    """N controller processes; replica k's incarnations are ids rK-1, rK-2, ..."""

    def __init__(self, url, n, workdir, extra_args, env):
        self.url, self.n, self.workdir, self.extra, self.env = url, n, workdir, extra_args, env
        os.makedirs(workdir, exist_ok=True)
        self.witness_path = os.path.join(workdir, "witness.jsonl")
        self.api = os.path.join(workdir, "api")
        self.procs = {}        # replica -> (id, Popen)
        self.incarnation = {}
        self.events = []       # the runner's own events: kills, stops, ...
        self.witness = Witness(self.witness_path)

    def start(self, replica):
        self.incarnation[replica] = self.incarnation.get(replica, 0) + 1
        ident = f"r{replica}-{self.incarnation[replica]}"
        log = open(os.path.join(self.workdir, f"{ident}.log"), "wb")
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "controller.py"), "--url", self.url, "--id", ident,
             "--witness", self.witness_path, "--api", self.api] + self.extra,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        log.close()
        self.procs[replica] = (ident, proc)
        self.events.append({"ev": "started", "id": ident, "pid": proc.pid, "mono": time.monotonic()})
        return ident

    def wait_ready(self, ident, timeout):
        return self.witness.wait_for(lambda l: l.get("ev") == "ready" and l.get("id") == ident, timeout)

    def replica_of(self, ident):
        for replica, (i, _) in self.procs.items():
            if i == ident:
                return replica
        return None

    def signal(self, replica, sig, kind):
        ident, proc = self.procs[replica]
        t = time.monotonic()
        proc.send_signal(sig)
        self.events.append({"ev": kind, "id": ident, "pid": proc.pid, "mono": t})
        return t

    def kill_tree(self, replica):
        """SIGKILL of the controller and of every process it started (a Tenure driver's child),
        frozen first so that none of them reacts to the others' death: a container or host dying."""
        ident, proc = self.procs[replica]
        pids = [proc.pid] + descendants(proc.pid)
        t = time.monotonic()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.events.append({"ev": "kill", "id": ident, "pid": proc.pid, "tree": pids, "mono": t})
        return t

    def wait_exit(self, replica, timeout):
        ident, proc = self.procs[replica]
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            t = time.monotonic()
            proc.kill()
            proc.wait(10)
            self.events.append({"ev": "killed_after_timeout", "id": ident, "mono": t})
            return False
        self.events.append({"ev": "exited", "id": ident, "code": proc.returncode, "mono": time.monotonic()})
        return True

    def stop_all(self, timeout=20):
        for replica, (ident, proc) in self.procs.items():
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for replica, (ident, proc) in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                self.events.append({"ev": "killed_at_end", "id": ident, "mono": time.monotonic()})

    def leader(self, since, count, timeout):
        """Waits for a live process with `count` begins after `since`; returns (replica, id) of
        the one with the latest begin, or None."""
        deadline = time.monotonic() + timeout
        while True:
            begins = {}
            last = {}
            for line in self.witness.poll():
                if line.get("ev") == "begin" and line["mono"] > since:
                    begins[line["id"]] = begins.get(line["id"], 0) + 1
                    last[line["id"]] = line["mono"]
            live = {i: r for r, (i, p) in self.procs.items() if p.poll() is None}
            ready = [i for i in begins if begins[i] >= count and i in live]
            if ready:
                ident = max(ready, key=lambda i: last[i])
                return live[ident], ident
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


def new_leader_after(cluster, t0, exclude, timeout):
    """The first `elected` line after t0 by another process, then its first begin."""
    elected = cluster.witness.wait_for(
        lambda l: l.get("ev") == "elected" and l["mono"] > t0 and l["id"] != exclude, timeout)
    if elected is None:
        return None, None
    begin = cluster.witness.wait_for(
        lambda l: l.get("ev") == "begin" and l["id"] == elected["id"] and l["mono"] >= elected["mono"],
        max(1.0, timeout - (time.monotonic() - t0)))
    return elected, begin


def run(url, n=3, faults=30, lease=3.0, pause=None, workdir=None, extra_args=(), env=None,
        kinds=("kill", "killtree", "stop", "term"),
        log=print):
    pause = pause if pause is not None else 2 * lease + 1
    workdir = workdir or tempfile.mkdtemp(prefix="tooz-faults-")
    os.makedirs(workdir, exist_ok=True)
    cluster = Cluster(url, n, workdir, list(extra_args), env or os.environ.copy())
    takeover_timeout = 4 * lease + 15
    results = []
    run_started = time.monotonic()
    try:
        for replica in range(1, n + 1):
            cluster.start(replica)
        for replica in range(1, n + 1):
            if not cluster.wait_ready(cluster.procs[replica][0], 60):
                raise RuntimeError(f"replica {replica} not ready in 60 s; see {workdir}")
        since = run_started
        for k in range(faults):
            kind = kinds[k % len(kinds)]
            for replica, (ident, proc) in list(cluster.procs.items()):
                if proc.poll() is not None:   # exited by itself (e.g. its session expired): a supervisor restarts it
                    cluster.events.append({"ev": "exited", "id": ident, "code": proc.returncode, "mono": time.monotonic()})
                    log(f"{ident} exited by itself with {proc.returncode}: restarting it")
                    cluster.start(replica)
                    cluster.wait_ready(cluster.procs[replica][0], 60)
            found = cluster.leader(since, 3, takeover_timeout)
            if found is None:
                results.append({"fault": k, "kind": kind, "error": "no leader handling objects"})
                log(f"fault {k}: no leader handling objects within {takeover_timeout} s")
                since = time.monotonic()
                continue
            replica, ident = found
            result = {"fault": k, "kind": kind, "target": ident}
            if kind in ("kill", "killtree"):
                if kind == "kill":
                    t0 = cluster.signal(replica, signal.SIGKILL, "kill")
                else:
                    t0 = cluster.kill_tree(replica)
                cluster.wait_exit(replica, 10)
                elected, begin = new_leader_after(cluster, t0, ident, takeover_timeout)
                cluster.start(replica)
            elif kind == "stop":
                t0 = cluster.signal(replica, signal.SIGSTOP, "sigstop")
                # the fault schedule: the leader stays frozen for `pause` seconds
                elected, begin = new_leader_after(cluster, t0, ident, pause)
                time.sleep(max(0.0, t0 + pause - time.monotonic()))
                t1 = cluster.signal(replica, signal.SIGCONT, "sigcont")
                result["pause"] = t1 - t0
                if elected is None:
                    elected, begin = new_leader_after(cluster, t0, ident, takeover_timeout)
                # Does the thawed leader notice? It must not begin objects after the new leader.
                lost = cluster.witness.wait_for(
                    lambda l: l.get("id") == ident and l["mono"] > t1 and l.get("ev") in ("lost", "error"),
                    2 * lease + 2)
                stale = [l for l in cluster.witness.poll()
                         if l.get("id") == ident and l.get("ev") == "begin" and l["mono"] > t1
                         and (lost is None or l["mono"] < lost["mono"])]
                result["thawed_noticed_loss"] = (lost["mono"] - t1) if lost else None
                result["thawed_begins_before_noticing"] = len(stale)
                if lost is None and stale and begin is not None:
                    # It never noticed: two leaders from now on. Contain it for the next faults.
                    cluster.signal(replica, signal.SIGKILL, "kill_stale_leader")
                    cluster.wait_exit(replica, 10)
                    cluster.start(replica)
                    result["stale_leader_killed"] = True
            else:  # term
                t0 = cluster.signal(replica, signal.SIGTERM, "sigterm")
                elected, begin = new_leader_after(cluster, t0, ident, takeover_timeout)
                result["graceful_exit"] = cluster.wait_exit(replica, 10 + 2 * lease)
                standdown = [l for l in cluster.witness.poll() if l.get("id") == ident and l.get("ev") == "standdown"]
                if standdown and elected is not None:
                    result["standdown_to_callback"] = (elected.get("cb_mono") or elected["mono"]) - standdown[0]["mono"]
                cluster.start(replica)
            result["t0"] = t0
            if elected is not None:
                result["new_leader"] = elected["id"]
                result["callback"] = (elected.get("cb_mono") or elected["mono"]) - t0
            if begin is not None:
                result["first_begin"] = begin["mono"] - t0
            results.append(result)
            log(f"fault {k} {kind} {ident}: " + ", ".join(
                f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}"
                for key, value in result.items() if key not in ("fault", "kind", "target", "t0")))
            # the restarted replica must be back in standby before the next fault
            cluster.wait_ready(cluster.procs[replica][0], 60)
            since = time.monotonic()
    finally:
        cluster.stop_all()
    with open(os.path.join(workdir, "runner-events.jsonl"), "w") as f:
        for event in cluster.events:
            f.write(json.dumps(event) + "\n")
    lines = cluster.witness.poll()
    summary = analyse(lines, cluster.events, results)
    summary.update(url=url, n=n, faults=faults, lease=lease, pause=pause, workdir=workdir,
                   seconds=time.monotonic() - run_started)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump({"summary": summary, "results": results}, f, indent=1)
    return summary, results


def intervals(lines, events):
    """Handling intervals (id, obj, term, start, end, accepted); an object without an end ends
    when its process was killed."""
    open_ = {}
    out = []
    death = {}
    for event in events:
        if event["ev"] in ("kill", "kill_stale_leader", "killed_after_timeout", "killed_at_end"):
            death.setdefault(event["id"], event["mono"])
    for line in lines:
        if line.get("ev") == "begin":
            open_[(line["id"], line["obj"])] = line
        elif line.get("ev") == "end":
            begin = open_.pop((line["id"], line["obj"]), None)
            if begin:
                out.append({"id": line["id"], "obj": line["obj"], "term": begin.get("term"),
                            "start": begin["mono"], "end": line["mono"], "accepted": line.get("accepted")})
    for (ident, obj), begin in open_.items():
        out.append({"id": ident, "obj": obj, "term": begin.get("term"), "start": begin["mono"],
                    "end": death.get(ident, begin["mono"]), "accepted": None, "unfinished": True})
    return sorted(out, key=lambda i: i["start"])


def analyse(lines, events, results):
    elected_at = {}   # (id, term) -> mono of the elected line: the age of a leadership
    elections = [l for l in lines if l.get("ev") == "elected"]
    for line in elections:
        elected_at.setdefault((line["id"], line.get("term")), line.get("cb_mono") or line["mono"])
    spans = intervals(lines, events)
    overlaps = []
    active = []
    for span in spans:
        active = [a for a in active if a["end"] > span["start"]]
        for other in active:
            if other["id"] == span["id"]:
                continue
            # which one is the deposed leader: the lower term, else the older election
            def age(s):
                return (s["term"] if s["term"] is not None else -1,
                        elected_at.get((s["id"], s["term"]), s["start"]))
            older, newer = (other, span) if age(other) <= age(span) else (span, other)
            overlaps.append({
                # stale start: the deposed leader began it after the newer leadership was
                # established (its election, else its first overlapping handling)
                "kind": "stale_start" if older["start"] > elected_at.get((newer["id"], newer["term"]), newer["start"])
                        else "in_flight",
                "older": older["id"], "older_obj": older["obj"], "newer": newer["id"], "older_term": older["term"],
                "newer_term": newer["term"], "seconds": min(older["end"], newer["end"]) - max(older["start"], newer["start"]),
                "older_commit_refused": older.get("accepted") is False, "at": span["start"]})
        active.append(span)
    term_violations = []
    highest = None
    for line in elections:
        term = line.get("term")
        if term is None:
            continue
        if highest is not None and term <= highest:
            term_violations.append({"id": line["id"], "term": term, "after": highest, "at": line["mono"]})
        highest = term if highest is None else max(highest, term)

    def stats(key, kind):
        values = [r[key] for r in results if r.get("kind") == kind and isinstance(r.get(key), (int, float))]
        return {"n": len(values), "median": percentile(values, 50), "p99": percentile(values, 99),
                "max": max(values) if values else None}

    deposed = {}
    for o in overlaps:   # one entry per handling of a deposed leader that overlapped another's
        deposed.setdefault((o["older"], o["older_obj"]), o)
    unique = list(deposed.values())
    return {
        "handlings": len(spans),
        "overlap_pairs": len(overlaps),
        "leaderships": len(elections),
        "terms_known": sum(1 for l in elections if l.get("term") is not None),
        "overlaps": len(unique),
        "overlaps_stale_start": sum(1 for o in unique if o["kind"] == "stale_start"),
        "overlaps_in_flight": sum(1 for o in unique if o["kind"] == "in_flight"),
        "overlaps_fenced_by_api": sum(1 for o in unique if o["older_commit_refused"]),
        "overlap_seconds_total": sum(o["seconds"] for o in overlaps),
        "overlap_examples": unique[:5],
        "commits_refused": sum(1 for s in spans if s.get("accepted") is False),
        "term_violations": len(term_violations),
        "term_violation_examples": term_violations[:5],
        "faults_without_takeover": sum(1 for r in results if "first_begin" not in r),
        "stale_leaders_killed": sum(1 for r in results if r.get("stale_leader_killed")),
        "thawed_begins_before_noticing": sum(r.get("thawed_begins_before_noticing", 0) for r in results),
        "kill_failover": stats("first_begin", "kill"),
        "kill_callback": stats("callback", "kill"),
        "killtree_failover": stats("first_begin", "killtree"),
        "killtree_callback": stats("callback", "killtree"),
        "stop_failover": stats("first_begin", "stop"),
        "stop_callback": stats("callback", "stop"),
        "stop_thawed_noticed_loss": stats("thawed_noticed_loss", "stop"),
        "term_handover_callback": stats("callback", "term"),
        "term_handover_first_begin": stats("first_begin", "term"),
        "term_standdown_to_callback": stats("standdown_to_callback", "term"),
        "errors": sum(1 for l in lines if l.get("ev") == "error"),
    }


def fmt(stat):
    if not stat or stat["n"] == 0:
        return "n=0"
    return f"median {stat['median']:.2f} s, p99 {stat['p99']:.2f} s (n={stat['n']})"


def print_summary(summary, out=print):
    out(f"url: {summary['url']}  faults: {summary['faults']}  lease: {summary['lease']} s  pause: {summary['pause']} s")
    out(f"handlings: {summary['handlings']}  leaderships: {summary['leaderships']}  "
        f"terms known: {summary['terms_known']}  errors logged: {summary['errors']}")
    out(f"overlapping handlings: {summary['overlaps']} ({summary['overlap_pairs']} pairs; stale start {summary['overlaps_stale_start']}, in flight "
        f"{summary['overlaps_in_flight']}, fenced by the API {summary['overlaps_fenced_by_api']}, "
        f"{summary['overlap_seconds_total']:.2f} s in all)  term violations: {summary['term_violations']}")
    out(f"faults without takeover: {summary['faults_without_takeover']}  stale leaders killed: "
        f"{summary['stale_leaders_killed']}  begins by thawed leaders before noticing: {summary['thawed_begins_before_noticing']}")
    for key in ("kill_failover", "kill_callback", "killtree_failover", "killtree_callback", "stop_failover", "stop_callback", "stop_thawed_noticed_loss",
                "term_handover_callback", "term_handover_first_begin", "term_standdown_to_callback"):
        out(f"  {key:28} {fmt(summary[key])}")


def main():
    # SIGTERM (also what a background job gets instead of SIGINT): unwind, so that the finally
    # blocks stop every controller and server this run started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("TOOZ_URL"), required=not os.environ.get("TOOZ_URL"))
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--lease", type=float, default=3.0, help="the driver's timeout (for the pause and deadlines)")
    parser.add_argument("--pause", type=float, help="SIGSTOP duration (default 2 x lease + 1)")
    parser.add_argument("--workdir")
    parser.add_argument("--kinds", default="kill,killtree,stop,term")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args, extra = parser.parse_known_args()
    summary, _ = run(args.url, args.n, args.faults, args.lease, args.pause, args.workdir, extra,
                     kinds=tuple(args.kinds.split(",")))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_summary(summary)
    return 1 if summary["overlaps"] or summary["term_violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
