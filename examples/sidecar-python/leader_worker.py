#!/usr/bin/env python3
"""Leader-gated work next to a `tenure elect` sidecar, with the `tenure` Python package.

This is the Kuryr controller's loop from the seed ("start the Watcher on gaining leadership, stop
it gracefully on losing it"), push-based instead of polling the sidecar every 5 s.
``Sidecar.lead()`` waits for leadership (long-polls ``/status``) and returns a ``Tenure`` that:

* holds the sidecar's tenure (``GET /hold?term=T``): on SIGTERM the sidecar says ``ended`` and
  releases the lock only once this worker has finished its item and closed the hold (or after
  the drain timeout), so the next leader never overlaps with it;
* self-fences on this host's clock: ``valid()`` turns false at the deadline the sidecar last
  reported (measured from when it was asked), even if the sidecar is frozen (SIGSTOP) or dead
  and can push nothing;
* carries the term (the fencing token) that every side effect passes to the store it writes.

Run it next to a sidecar (``pip install tenure`` gives both; from a checkout, set
``PYTHONPATH=python``):

    tenure elect --election my-controller --http 127.0.0.1:4040 &
    python3 leader_worker.py --sidecar http://127.0.0.1:4040 --witness /tmp/work.log

``--witness`` appends one line per event of the worker (``start``, ``work``, ``stop``) with the
term and ``time.monotonic()``, so that a test can check that two workers never overlapped.
"""

import argparse
import signal
import sys
import threading
import time

import tenure


class Witness:
    """Appends `<event> <term> <monotonic seconds> <name>` lines, flushed at once."""

    def __init__(self, path, name):
        self.file = open(path, "a", buffering=1) if path else None
        self.name = name

    def write(self, event, term):
        if self.file:
            self.file.write(f"{event} {term} {time.monotonic():.6f} {self.name}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sidecar", required=True, help="the sidecar's HTTP address, e.g. http://127.0.0.1:4040")
    parser.add_argument("--witness", help="append start/work/stop lines to this file")
    parser.add_argument("--name", default="worker", help="this replica's name in the witness")
    parser.add_argument("--item-seconds", type=float, default=0.05, help="how long one unit of work takes")
    args = parser.parse_args()

    sidecar = tenure.Sidecar(args.sidecar)
    witness = Witness(args.witness, args.name)
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    while not stop_requested.is_set():
        try:
            held = sidecar.lead(timeout=1.0)  # returns at each change, so SIGTERM is seen within 1 s
        except TimeoutError:
            continue
        except tenure.SidecarError:
            stop_requested.wait(0.2)  # the sidecar is gone or restarting: reconnect back-off
            continue
        with held:  # leaving it tells the sidecar the work has stopped
            witness.write("start", held.term)
            while held.valid() and not stop_requested.is_set():
                # One unit of work: in a real controller, handle one event and write the result
                # with `held.term` as the fencing token.
                witness.write("work", held.term)
                held.wait(args.item_seconds)
            witness.write("stop", held.term)
    return 0


if __name__ == "__main__":
    sys.exit(main())
