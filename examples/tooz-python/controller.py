#!/usr/bin/env python3
"""A Kuryr-like Active/Passive controller on Tooz's coordination API.

The seed (Kuryr's "Active/Passive High Availability" design): every replica runs, one is the
leader and is the only one that handles objects ("start the Watcher on gaining leadership, stop it
gracefully on losing it"), the others wait in standby. Here on Tooz instead of a leader-elector
sidecar:

* ``coordinator.join_group(GROUP)`` then ``watch_elected_as_leader(GROUP, callback)``, and a
  ``run_watchers(timeout)`` loop (Tooz runs the election inside ``run_watchers``);
* only while leader it handles objects of a small file-based fake API (``--api DIR``): it claims
  the next object, "allocates" an address for it (the slow part, ``--handle-seconds``) and commits
  the allocation with its fencing term; the fake API refuses a commit whose term is lower than one
  it already saw (the store-side fencing a real API would do with the term);
* before each handling it checks that the leadership is still valid:
  ``coordinator.leadership(GROUP)`` (``.term``, ``.valid()``) where the driver has it (the Tenure
  driver), else ``get_leader(GROUP)`` compared with its own id, else nothing but the callback;
* SIGTERM: finish the object in hand, stand down, leave the group, stop the coordinator.

Tooz's own etcd driver (``etcd3+http://``) does not implement ``watch_elected_as_leader`` (it
raises ``NotImplemented``), so there the controller falls back to the usual Tooz idiom, a
non-blocking ``get_lock(GROUP).acquire()`` tried on every loop, and its only check is
``lock.acquired`` (local state).

Every event is a witness line (JSON, appended with O_APPEND to ``--witness``) with the replica id,
pid, object, term, ``time.monotonic()`` and ``time.time()``; ``faults.py`` checks them.

    python3 controller.py --url zookeeper://127.0.0.1:2181?timeout=3 --id r1 \\
        --witness /tmp/w.log --api /tmp/api

The URL may also come from ``$TOOZ_URL``. Standard library and tooz only.
"""

import argparse
import fcntl
import json
import os
import re
import signal
import sys
import threading
import time

import tooz
from tooz import coordination

GROUP = b"kuryr-controller"


class Witness:
    """One JSON line per event, appended with O_APPEND (one write per line)."""

    def __init__(self, path, replica):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None
        self.replica = replica

    def write(self, event, **fields):
        if self.fd is None:
            return
        line = {"ev": event, "id": self.replica, "pid": os.getpid(),
                "mono": time.monotonic(), "wall": time.time()}
        line.update(fields)
        os.write(self.fd, (json.dumps(line, sort_keys=True) + "\n").encode())


class FakeApi:
    """A shared directory standing for the API the controller writes to (Neutron + annotations).

    ``state.json`` holds the next object number and the highest fencing term seen; every call
    takes an exclusive flock on ``lock``. ``commit`` refuses a term lower than the highest seen
    (a term of None cannot be fenced and is always accepted).
    """

    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.lock_path = os.path.join(directory, "lock")
        self.state_path = os.path.join(directory, "state.json")
        self.log_path = os.path.join(directory, "allocations.log")

    def _locked(self, update):
        with open(self.lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(self.state_path) as f:
                    state = json.load(f)
            except (FileNotFoundError, ValueError):
                state = {"next": 0, "fence": None}
            result = update(state)
            tmp = self.state_path + f".{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, self.state_path)
            return result

    def claim(self):
        def update(state):
            state["next"] += 1
            return f"obj-{state['next']}"
        return self._locked(update)

    def commit(self, obj, term, replica):
        def update(state):
            fence = state.get("fence")
            if term is not None and fence is not None and term < fence:
                return False
            if term is not None:
                state["fence"] = term if fence is None else max(fence, term)
            n = int(obj.split("-")[1])
            with open(self.log_path, "a") as log:
                log.write(f"{obj} 10.0.{n // 250 % 250}.{n % 250 + 2} {term} {replica}\n")
            return True
        return self._locked(update)


def get_coordinator(url, member_id):
    """tooz.coordination.get_coordinator, or a driver class named by $TOOZ_DRIVER ("module:Class")
    when the URL's scheme has no installed entry point (a driver used from a checkout)."""
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
        return getattr(importlib.import_module(module), cls)(
            member_id, parsed, urllib.parse.parse_qs(parsed.query))


class Leadership:
    """How this controller learns it leads, whether it still does, and under which term."""

    def __init__(self, coord, member_id, check):
        self.coord = coord
        self.member_id = member_id
        self.elected = threading.Event()   # set by the callback (or by a lock acquisition)
        self.lock = None
        try:
            coord.watch_elected_as_leader(GROUP, self._on_elected)
            self.mode = "callback"
        except tooz.NotImplemented:
            self.mode = "lock"               # Tooz's etcd3gw driver: a lock is the election
            self.lock = coord.get_lock(GROUP)
        if check == "auto":
            if hasattr(coord, "leadership"):
                check = "leadership"
            elif self.mode == "lock":
                check = "lock"
            else:
                check = "get_leader"
        self.check = check
        self.term = None
        self.elected_at = None
        self.check_error = None

    def _on_elected(self, event):
        self.elected_at = time.monotonic()
        self.elected.set()

    def campaign(self):
        """In lock mode, one non-blocking attempt (the callback mode campaigns in run_watchers)."""
        if self.mode == "lock" and not self.elected.is_set():
            if self.lock.acquire(blocking=False):
                self.elected_at = time.monotonic()
                self.elected.set()

    def current_term(self):
        """The fencing term of the leadership just gained (None if the driver has none)."""
        if self.check == "leadership":
            held = self.coord.leadership(GROUP)
            return getattr(held, "term", None) if held is not None else None
        # Driver internals, read only for the measurement: Tooz exposes no term.
        leader_lock = getattr(self.coord, "_leader_locks", {}).get(GROUP)
        if leader_lock is not None and getattr(leader_lock, "node", None):
            match = re.search(r"(\d+)$", leader_lock.node)   # the ZooKeeper sequence number
            return int(match.group(1)) if match else None
        if self.lock is not None and hasattr(self.coord, "client"):
            kvs = self.coord.client.get(self.lock._key.decode(), metadata=True)
            return int(kvs[0][1]["create_revision"]) if kvs else None   # etcd create revision
        return None

    def still_valid(self):
        """The check before each handling; a failing check counts as a lost leadership (Tooz's
        ZooKeeper get_leader raises kazoo's own exceptions, e.g. SessionExpiredError)."""
        try:
            return self._still_valid()
        except Exception as error:
            self.check_error = f"{type(error).__name__}: {error}"[:300]
            return False

    def _still_valid(self):
        if self.check == "leadership":
            held = self.coord.leadership(GROUP)
            return held is not None and held.valid() and held.term == self.term
        if self.check == "get_leader":
            leader = self.coord.get_leader(GROUP).get()
            return leader == self.member_id
        if self.check == "lock":
            return self.lock.acquired
        return True   # "none": nothing but the callback

    def on_lost(self):
        """After a failed check: with Tenure's leadership(), a newer term already held is a new
        leadership (its callback may have run before the check noticed); other drivers keep
        stale local state (kazoo's lock.is_acquired, the etcd lock's lease) until told to stand
        down, which also lets them campaign again."""
        old_term = self.term
        self.elected.clear()
        if self.check == "leadership":
            held = self.coord.leadership(GROUP)
            if held is not None and held.valid() and held.term != old_term:
                self.elected_at = time.monotonic()
                self.elected.set()
            return
        self.stand_down()

    def stand_down(self):
        self.elected.clear()
        if self.mode == "lock":
            try:
                self.lock.release()
            except tooz.ToozError:
                pass
        else:
            self.coord.stand_down_group_leader(GROUP)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("TOOZ_URL"), help="Tooz backend URL (default $TOOZ_URL)")
    parser.add_argument("--id", required=True, help="this replica's member id")
    parser.add_argument("--witness", help="append JSON witness lines to this file")
    parser.add_argument("--api", help="the fake API's directory (objects and allocations)")
    parser.add_argument("--idle", action="store_true", help="no objects: lead but handle nothing (at rest)")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds per run_watchers loop when not handling")
    parser.add_argument("--handle-seconds", type=float, default=0.05, help="how long one handling takes")
    parser.add_argument("--gap-seconds", type=float, default=0.05, help="pause between two handlings")
    parser.add_argument("--check", default="auto", choices=["auto", "leadership", "get_leader", "lock", "none"],
                        help="the validity check before each handling")
    args = parser.parse_args()
    if not args.url:
        parser.error("--url or $TOOZ_URL is required")

    member_id = args.id.encode()
    witness = Witness(args.witness, args.id)
    api = FakeApi(args.api) if args.api else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    coord = get_coordinator(args.url, member_id)
    coord.start(start_heart=True)
    try:
        coord.create_group(GROUP).get()
    except coordination.GroupAlreadyExist:
        pass
    leadership = Leadership(coord, member_id, args.check)
    witness.write("ready", url=args.url, mode=leadership.mode, check=leadership.check)
    joined = False
    leading = False
    handled = 0
    next_watch = 0.0
    while not stop.is_set():
        began = time.monotonic()
        try:
            if not joined:
                try:
                    coord.join_group(GROUP).get()
                    joined = True
                    witness.write("joined")
                except coordination.MemberAlreadyExist:
                    joined = True
            if not leading:
                # standby: wait here for the callback (Tenure long-polls; others return at once)
                coord.run_watchers(timeout=args.poll)
                next_watch = time.monotonic() + args.poll
            elif began >= next_watch:
                coord.run_watchers(timeout=0)   # the leader's periodic task, between objects
                next_watch = began + args.poll
            leadership.campaign()
            if leadership.elected.is_set() and not leading:
                leadership.term = leadership.current_term()
                leading = True
                witness.write("elected", term=leadership.term, cb_mono=leadership.elected_at)
            if leading and not leadership.still_valid():
                witness.write("lost", term=leadership.term, check_error=leadership.check_error)
                leadership.check_error = None
                leading = False
                leadership.on_lost()
                continue
            if leading and api is not None and not args.idle:
                obj = api.claim()
                witness.write("begin", obj=obj, term=leadership.term)
                time.sleep(args.handle_seconds)       # the Neutron calls
                accepted = api.commit(obj, leadership.term, args.id)
                witness.write("end", obj=obj, term=leadership.term, accepted=accepted)
                handled += 1
                stop.wait(args.gap_seconds)
                continue
        except Exception as error:  # tooz errors, and driver exceptions that tooz lets through
            witness.write("error", error=f"{type(error).__name__}: {error}"[:300])
            if type(error).__name__ == "SessionExpired" and leading:
                # Tenure's driver: the child ended the session (this process was frozen past the
                # timeout) and released everything; the driver has started a new session, in which
                # this replica campaigns again like any other.
                witness.write("lost", term=leadership.term, check_error="SessionExpired")
                leading = False
                leadership.on_lost()
        stop.wait(max(0.0, args.poll - (time.monotonic() - began)))

    # Graceful stop: stand down first (so the next leader starts at once), then leave and stop.
    witness.write("standdown", term=leadership.term, leading=leading)
    try:
        if leading:
            leadership.stand_down()
        if joined:
            coord.leave_group(GROUP).get()
    except Exception as error:
        witness.write("error", error=f"{type(error).__name__}: {error}"[:300])
    coord.stop()
    witness.write("stopped", handled=handled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
