#!/usr/bin/env python3
"""Graceful handover through Tooz's API: the time from the leader's ``stand_down_group_leader``
call to the ``watch_elected_as_leader`` callback of the next leader, over many rounds.

Two coordinators in one process, each with a thread in a ``run_watchers(timeout)`` loop; the
leader of each round stands down after it led for ``--settle`` seconds (default: the URL's
``timeout``, so that the other, which stood down in the round before, is a candidate again, as
in a deployment where stand-downs are not milliseconds apart), and the other's callback time is
taken on the same monotonic clock. Prints the median and p99 (nearest rank).

    python3 handover.py --url 'tenure+etcd://127.0.0.1:2379/bench?timeout=3' --rounds 100
    python3 handover.py --store etcd --rounds 100   # on a throwaway server (freeze.py's)
"""

import argparse
import contextlib
import sys
import tempfile
import threading
import urllib.parse
import time

import tooz.coordination

import freeze

GROUP = b"handover"


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url")
    where.add_argument("--store", choices=("file", "etcd", "zookeeper"), help="a throwaway store, timeout 3 s")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--settle", type=float, help="seconds a leader leads before it stands down")
    args = parser.parse_args()
    if args.store:
        with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as servers:
            server = freeze.server_for(args.store)
            port = servers.enter_context(server).port if server else 0
            args.url = freeze.URLS[args.store].format(dir=scratch, port=port, lease=3)
            measure(args)
    else:
        measure(args)


def measure(args):
    if args.settle is None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(args.url).query)
        args.settle = float(query.get("timeout", ["10"])[0])

    elected = {}          # member -> monotonic time of its latest callback
    changed = threading.Condition()
    stop = threading.Event()
    coordinators = {}
    for member in (b"a", b"b"):
        coordinator = tooz.coordination.get_coordinator(args.url, member)
        coordinator.start(start_heart=True)
        coordinators[member] = coordinator

    def on_elected(event, member):
        with changed:
            elected[member] = time.monotonic()
            changed.notify_all()

    def watch(member):
        coordinator = coordinators[member]
        coordinator.watch_elected_as_leader(GROUP, lambda event: on_elected(event, member))
        while not stop.is_set():
            coordinator.run_watchers(timeout=1)

    threads = [threading.Thread(target=watch, args=(m,), daemon=True) for m in coordinators]
    for thread in threads:
        thread.start()

    def wait_for(condition, limit, what):
        deadline = time.monotonic() + limit
        with changed:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0:
                    for member, coordinator in coordinators.items():
                        log = getattr(getattr(coordinator, "_process", None), "log_tail", lambda n: "")(12)
                        print(f"--- {member!r}:\n{log}", file=sys.stderr)
                    sys.exit(f"{what}: not within {limit:.0f} s")
                changed.wait(left)

    wait_for(lambda: elected, 30, "a first leader")
    times = []
    for _ in range(args.rounds):
        with changed:
            leader = max(elected, key=elected.get)
        follower = b"b" if leader == b"a" else b"a"
        before = elected.get(follower)
        stop.wait(max(0.0, elected[leader] + args.settle - time.monotonic()))  # the schedule
        started = time.monotonic()
        coordinators[leader].stand_down_group_leader(GROUP)
        wait_for(lambda: elected.get(follower) != before, 30, f"round {len(times) + 1}: {follower!r} elected after {leader!r} stood down")
        times.append(elected[follower] - started)
    stop.set()
    for thread in threads:
        thread.join(5)
    for coordinator in coordinators.values():
        coordinator.stop()
    print(f"{args.url}: stand_down -> next leader's callback over {len(times)} rounds: "
          f"median {percentile(times, 0.5) * 1000:.1f} ms, p99 {percentile(times, 0.99) * 1000:.1f} ms, "
          f"max {max(times) * 1000:.1f} ms; over 100 ms: {sum(t > 0.1 for t in times)}")


if __name__ == "__main__":
    main()
