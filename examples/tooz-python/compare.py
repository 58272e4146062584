#!/usr/bin/env python3
"""Runs controller.py + faults.py on several Tooz drivers against servers of its own, and measures
the requests per minute each idle coordinator sends to the store.

For each driver: a fresh server (etcd or ZooKeeper on free loopback ports; none for file URLs);
N idle controllers (``--idle``: campaigning, one leading, no objects) for ``--rest-seconds``, with
the server's request counters read before and after (etcd: ``/metrics``
``grpc_server_msg_received_total``, which the v3 JSON gateway also ends up in; ZooKeeper:
``mntr`` ``zk_packets_received``, pings included); then the fault run of faults.py.

    /tmp/example-venv/bin/python compare.py --drivers etcd,zookeeper --faults 24 --lease 3

Drivers and their URL templates ({port}, {lease}, {dir} are filled in):
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time

import faults
import servers

URLS = {
    "etcd": "etcd3+http://127.0.0.1:{port}?timeout={lease}",
    "zookeeper": "zookeeper://127.0.0.1:{port}?timeout={lease}",
    "tenure-etcd": "tenure+etcd://127.0.0.1:{port}/tooz-bench?timeout={lease}",
    "tenure-zookeeper": "tenure+zookeeper://127.0.0.1:{port}/tooz-bench?timeout={lease}",
    "tenure-file": "tenure+file://{dir}/store?timeout={lease}",
}
# variants: the same server and URL with extra controller arguments
VARIANTS = {
    "zookeeper-callback-only": ("zookeeper", ["--check", "none"]),
    "etcd-callback-only": ("etcd", ["--check", "none"]),
}
__doc__ += "\n".join(f"    {k:18} {v}" for k, v in URLS.items()) + "\n"


def server_for(driver):
    if driver.endswith("etcd"):
        return servers.Etcd()
    if driver.endswith("zookeeper"):
        return servers.ZooKeeper()
    return None


def requests_of(counters):
    if "grpc_server_msg_received_total" in counters:
        return counters["grpc_server_msg_received_total"]
    return counters["zk_packets_received"]


def at_rest(url, server, n, seconds, workdir, lease, extra=()):
    """Requests per minute per idle coordinator (None without a server to count at)."""
    cluster = faults.Cluster(url, n, workdir, ["--idle"] + list(extra), os.environ.copy())
    try:
        for replica in range(1, n + 1):
            cluster.start(replica)
        for replica in range(1, n + 1):
            if not cluster.wait_ready(cluster.procs[replica][0], 60):
                raise RuntimeError(f"idle replica {replica} not ready; see {workdir}")
        elected = cluster.witness.wait_for(lambda l: l.get("ev") == "elected", 4 * lease + 15)
        if elected is None:
            raise RuntimeError(f"no idle leader; see {workdir}")
        time.sleep(2 * lease)   # schedule: let joins and the first campaign settle before counting
        if server is None:
            return {"elected": True}
        before = server.counters()
        t0 = time.monotonic()
        time.sleep(seconds)     # schedule: the measurement window
        after = server.counters()
        minutes = (time.monotonic() - t0) / 60
        result = {"requests_per_min_per_coordinator": (requests_of(after) - requests_of(before)) / minutes / n,
                  "window_s": minutes * 60}
        writes = "etcd_server_proposals_committed_total" if "by_method" in after else "zk_zxid"
        result["writes_per_min_per_coordinator"] = (after[writes] - before[writes]) / minutes / n
        result["writes_counter"] = writes
        if "by_method" in after:
            result["by_method_per_min_per_coordinator"] = {
                m: round((v - before["by_method"].get(m, 0.0)) / minutes / n, 1)
                for m, v in after["by_method"].items() if v - before["by_method"].get(m, 0.0) > 0}
            result["grpc_handled_per_min_per_coordinator"] = (
                after["grpc_server_handled_total"] - before["grpc_server_handled_total"]) / minutes / n
        else:
            result["packets_sent_per_min_per_coordinator"] = (
                after["zk_packets_sent"] - before["zk_packets_sent"]) / minutes / n
        return result
    finally:
        cluster.stop_all()


def table(report):
    """The README's table for a report (driver -> results)."""
    def m(stat):
        if not stat or stat.get("median") is None:
            return "-"
        return f"{stat['median']:.2f} / {stat['p99']:.2f}"

    rows = ["| driver (controller check) | requests/min per idle coordinator | writes/min per idle coordinator "
            "| kill -9 controller: failover | kill -9 controller + driver child: failover | SIGSTOP 7 s: failover "
            "| thawed leader stops within | SIGTERM: handover (to callback) | overlapping handlings: stale start / in flight (fenced by term) "
            "| term violations |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for driver, r in report.items():
        if "error" in r:
            rows.append(f"| {driver} | failed: {r['error']} |||||||||")
            continue
        s, rest = r["summary"], r["at_rest"]
        check = next((l for l in [r.get("check")] if l), None)
        thawed = s["stop_thawed_noticed_loss"]
        thawed_text = m(thawed) if thawed["n"] else f"never ({s['stale_leaders_killed']}/{s['stop_failover']['n']} killed by the runner)"
        rows.append(
            f"| {driver}{' (' + check + ')' if check else ''} | {rest.get('requests_per_min_per_coordinator', 0):.0f} "
            f"| {rest.get('writes_per_min_per_coordinator', float('nan')):.0f} "
            f"| {m(s['kill_failover'])} | {m(s['killtree_failover'])} | {m(s['stop_failover'])} | {thawed_text} "
            f"| {m(s['term_handover_callback'])} "
            f"| {s['overlaps_stale_start']} / {s['overlaps_in_flight']} ({s['overlaps_fenced_by_api']}) | {s['term_violations']} |")
    rows.append("")
    rows.append("Times in seconds, median / p99 (nearest rank) over the faults of that kind.")
    return "\n".join(rows)


def main():
    # SIGTERM (also what a background job gets instead of SIGINT): unwind, so that the finally
    # blocks stop every controller and server this run started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description="Tooz drivers under controller.py's fault run",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--drivers", default="etcd,zookeeper")
    parser.add_argument("--faults", type=int, default=24)
    parser.add_argument("--lease", type=int, default=3, help="the drivers' timeout option, seconds")
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--rest-seconds", type=float, default=60)
    parser.add_argument("--url", action="append", default=[], help="DRIVER=TEMPLATE to override a URL template")
    parser.add_argument("--out", help="write all results as JSON here")
    parser.add_argument("--workdir")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="only print the table of earlier --out files")
    args = parser.parse_args()
    if args.table:
        merged = {}
        for path in args.table:
            with open(path) as f:
                merged.update(json.load(f))
        print(table(merged))
        return 0
    urls = dict(URLS)
    for item in args.url:
        name, _, template = item.partition("=")
        urls[name] = template
    base = args.workdir or tempfile.mkdtemp(prefix="tooz-compare-")
    report = {}
    for driver in args.drivers.split(","):
        workdir = os.path.join(base, driver)
        os.makedirs(workdir, exist_ok=True)
        kind, extra = VARIANTS.get(driver, (driver, []))
        server = server_for(kind)
        try:
            if server:
                server.start()
            url = urls[kind].format(port=server.port if server else 0, lease=args.lease, dir=workdir)
            print(f"== {driver}: {url} {' '.join(extra)}", flush=True)
            rest = at_rest(url, server, args.n, args.rest_seconds, os.path.join(workdir, "rest"), args.lease, extra)
            print(f"at rest: {json.dumps(rest)}", flush=True)
            summary, results = faults.run(url, args.n, args.faults, args.lease, workdir=os.path.join(workdir, "faults"),
                                          extra_args=extra, log=lambda s: print(s, flush=True))
            faults.print_summary(summary, lambda s: print(s, flush=True))
            ready = [l for l in faults.Witness(os.path.join(workdir, "faults", "witness.jsonl")).poll() if l.get("ev") == "ready"]
            check = f"{ready[0].get('mode')}, {ready[0].get('check')}" if ready else None
            report[driver] = {"url": url, "check": check, "controller_args": extra, "at_rest": rest, "summary": summary, "results": results}
        except Exception as error:  # one driver's failure must not hide the others' numbers
            print(f"{driver}: FAILED: {type(error).__name__}: {error}", flush=True)
            report[driver] = {"error": f"{type(error).__name__}: {error}"}
        finally:
            if server:
                server.stop()
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1, default=str)
    print()
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
