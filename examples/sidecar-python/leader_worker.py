#!/usr/bin/env python3
"""Leader-gated work next to a `tenure elect` sidecar, in Python with its standard library only.

This is the Kuryr controller's loop from the seed ("start the Watcher on gaining leadership, stop
it gracefully on losing it"), push-based instead of polling the sidecar every 5 s:

* follow ``GET /events`` (Server-Sent Events): the sidecar pushes every change of leader, term or
  role the moment its elector sees it;
* on ``role: leader`` start the worker with that tenure's term; on anything else stop it
  gracefully (the in-flight item finishes, nothing new starts);
* a closed or silent event stream means the sidecar is gone or frozen: stop at once;
* self-fencing in the application too: the worker holds a local deadline, refreshed from
  ``GET /status`` (``validForSeconds``, measured from when the request was sent) every renew
  period; past it the worker stops even if no event arrived (a sidecar paused by SIGSTOP pushes
  nothing);
* the worker holds the tenure with ``GET /hold?term=T`` while it runs: on SIGTERM the sidecar
  says ``ended`` and releases the lock only once the worker has finished its item and closed the
  hold (or after the drain timeout), so the next leader never overlaps with it;
* every side effect carries the term (the fencing token): the store it writes to must refuse a
  term lower than one it has seen.

Run it next to a sidecar:

    tenure elect --election my-controller --http 127.0.0.1:4040 &
    python3 leader_worker.py --sidecar http://127.0.0.1:4040 --witness /tmp/work.log

``--witness`` appends one line per event of the worker (``start``, ``work``, ``stop``) with the
term and ``time.monotonic()``, so that a test can check that two workers never overlapped.
"""

import argparse
import http.client
import json
import signal
import socket
import sys
import threading
import time
import urllib.parse


class Sidecar:
    """The sidecar's HTTP API: the event stream and the status."""

    def __init__(self, url):
        parsed = urllib.parse.urlsplit(url)
        self.host = parsed.hostname
        self.port = parsed.port or 80

    def status(self, timeout):
        """``GET /status`` as a dict, and the monotonic time the request was sent."""
        sent = time.monotonic()
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            connection.request("GET", "/status")
            response = connection.getresponse()
            if response.status != 200:
                raise OSError(f"/status answered {response.status}")
            return json.loads(response.read()), sent
        finally:
            connection.close()

    def hold(self, term, timeout):
        """Opens ``GET /hold?term=T``: a socket and its line reader once the sidecar answered
        ``holding T``; None if it does not lead with that term."""
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            sock.sendall(f"GET /hold?term={term} HTTP/1.1\r\nHost: sidecar\r\n\r\n".encode())
            reader = sock.makefile("rb")
            status = reader.readline().split()
            if len(status) < 2 or status[1] != b"200":
                raise OSError(f"/hold answered {status}")
            while reader.readline() not in (b"\r\n", b"\n", b""):
                pass  # the headers
            sock.settimeout(None)  # the sidecar writes a line every second; silence is not an error here
            while True:
                line = reader.readline()
                if not line:
                    raise OSError("the hold closed")
                if line.startswith(b"holding"):
                    return sock, reader
        except (OSError, ValueError):
            sock.close()
            return None

    def events(self, idle_timeout):
        """Yields each leadership snapshot pushed on ``GET /events``. Ends (raises) when the
        stream closes or stays silent for ``idle_timeout`` (the sidecar sends a keep-alive
        comment every 15 s, so a longer silence means it is gone or frozen)."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=idle_timeout)
        try:
            connection.request("GET", "/events", headers={"Accept": "text/event-stream"})
            response = connection.getresponse()
            if response.status != 200:
                raise OSError(f"/events answered {response.status}")
            data = []
            while True:
                line = response.readline()
                if not line:
                    raise OSError("the event stream closed")
                line = line.decode("utf-8").rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif line == "" and data:
                    yield json.loads("\n".join(data))
                    data = []
        finally:
            connection.close()


class Worker:
    """The leader's work: runs on its own thread while this replica leads, under one term."""

    def __init__(self, sidecar, term, witness, item_seconds):
        self.sidecar = sidecar
        self.term = term
        self.witness = witness
        self.item_seconds = item_seconds
        self.stopping = threading.Event()
        self.valid_until = 0.0
        self.lock = threading.Lock()
        self.hold = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def extend(self, valid_until):
        with self.lock:
            self.valid_until = max(self.valid_until, valid_until)

    def valid(self):
        with self.lock:
            return time.monotonic() < self.valid_until and not self.stopping.is_set()

    def start(self, valid_until):
        """Holds the tenure, then starts working; False if the tenure is already over."""
        self.hold = self.sidecar.hold(self.term, timeout=2.0)
        if self.hold is None:
            return False
        self.extend(valid_until)
        threading.Thread(target=self.follow_hold, daemon=True).start()
        self.witness.write("start", self.term)
        self.thread.start()
        return True

    def follow_hold(self):
        """Stops the work when the sidecar says the tenure ended (or the hold breaks)."""
        _, reader = self.hold
        try:
            while True:
                line = reader.readline()
                if not line or line.startswith(b"ended"):
                    break
        except (OSError, ValueError):
            pass
        self.stopping.set()

    def run(self):
        while self.valid():
            # One unit of work: in a real controller, handle one event and write the result
            # with `self.term` as the fencing token.
            self.witness.write("work", self.term)
            self.stopping.wait(self.item_seconds)
        self.witness.write("stop", self.term)
        # The work has stopped: let the sidecar release the lock.
        sock, _ = self.hold
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def stop(self):
        """Graceful: the item in flight finishes, then the thread ends."""
        self.stopping.set()
        self.thread.join()


class Witness:
    """Appends `<event> <term> <monotonic seconds> <name>` lines, flushed at once."""

    def __init__(self, path, name):
        self.file = open(path, "a", buffering=1) if path else None
        self.name = name
        self.lock = threading.Lock()

    def write(self, event, term):
        if self.file:
            with self.lock:
                self.file.write(f"{event} {term} {time.monotonic():.6f} {self.name}\n")


def refresh_validity(sidecar, worker, period, timeout):
    """Keeps the worker's local deadline current from /status while it runs."""
    while not worker.stopping.wait(period):
        try:
            status, sent = sidecar.status(timeout)
        except (OSError, ValueError):
            continue  # the deadline stays where it was; the worker stops when it passes
        if status.get("isLeader") and status.get("term") == worker.term:
            worker.extend(sent + float(status.get("validForSeconds") or 0.0))
        else:
            worker.stopping.set()


def follow(sidecar, witness, item_seconds, stop_requested):
    """One connection to the sidecar's event stream: start and stop the worker with leadership."""
    worker = None
    try:
        for snapshot in sidecar.events(idle_timeout=20.0):
            leading = snapshot.get("role") == "leader"
            term = snapshot.get("term")
            if worker and (not leading or term != worker.term):
                worker.stop()
                worker = None
            if leading and worker is None and not stop_requested.is_set():
                status, sent = sidecar.status(timeout=2.0)
                if not status.get("isLeader") or status.get("term") != term:
                    continue  # already over: wait for the next event
                worker = Worker(sidecar, term, witness, item_seconds)
                if not worker.start(sent + float(status.get("validForSeconds") or 0.0)):
                    worker = None
                    continue
                period = float(status.get("retryPeriodSeconds") or 1.0)
                threading.Thread(
                    target=refresh_validity, args=(sidecar, worker, period, period), daemon=True
                ).start()
            if stop_requested.is_set():
                return
    except (OSError, ValueError):
        pass  # the sidecar is gone, frozen or restarting: nothing may go on
    finally:
        if worker:
            worker.stop()


class Stop(Exception):
    """SIGTERM: stop following, stop the work gracefully, exit."""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sidecar", required=True, help="the sidecar's HTTP address, e.g. http://127.0.0.1:4040")
    parser.add_argument("--witness", help="append start/work/stop lines to this file")
    parser.add_argument("--name", default="worker", help="this replica's name in the witness")
    parser.add_argument("--item-seconds", type=float, default=0.05, help="how long one unit of work takes")
    args = parser.parse_args()

    sidecar = Sidecar(args.sidecar)
    witness = Witness(args.witness, args.name)
    stop_requested = threading.Event()

    def on_sigterm(*_):
        stop_requested.set()
        raise Stop()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        while not stop_requested.is_set():
            follow(sidecar, witness, args.item_seconds, stop_requested)
            stop_requested.wait(0.2)  # reconnect back-off
    except Stop:
        pass  # follow() stopped the worker on its way out
    return 0


if __name__ == "__main__":
    sys.exit(main())
