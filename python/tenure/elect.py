"""A client of ``tenure elect --http``: who leads, pushed changes, and a tenure held while working.

The rule it helps a leader keep: work runs only while this instance's tenure is valid on this
host's clock, and the lock is released (on SIGTERM, or on a step-down) only after the work has
stopped. :meth:`Sidecar.lead` waits for leadership and returns a :class:`Tenure` that

* opens ``GET /hold?term=T``, so that a graceful release waits for :meth:`Tenure.close`;
* keeps a local deadline, refreshed from ``GET /status`` every retry period and measured from
  when each request was sent, so that :meth:`Tenure.valid` turns false on time even when the
  sidecar is frozen (SIGSTOP) or dead and can push nothing;
* ends at once when the sidecar says ``ended`` (lost, stepped down, stopping).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional

from ._errors import TenureError
from ._http import Client, SidecarError

#: Longer than the 15 s between the sidecars' keep-alive comments: a silence this long means the
#: sidecar is gone or frozen.
IDLE_TIMEOUT = 20.0
#: The hold stream carries a line every second; this much silence ends the tenure.
HOLD_IDLE_TIMEOUT = 5.0


class NotLeading(TenureError):
    """This instance does not lead with the term asked for: work must not start."""


class LeadTimeout(TenureError, TimeoutError):
    """:meth:`Sidecar.lead` waited its ``timeout`` and this instance did not lead."""


@dataclass(frozen=True)
class Leadership:
    """One snapshot of ``GET /events``: who leads, under which term, and this instance's part."""

    #: The holder, or None while unknown.
    leader: Optional[str]
    #: The holder's term (the fencing token), when known.
    term: Optional[int]
    #: This instance's part: ``leader``, ``follower`` or ``releasing``.
    role: str

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Leadership":
        """Reads one event's data."""
        return cls(leader=data.get("leader"), term=data.get("term"), role=str(data.get("role", "")))


@dataclass(frozen=True)
class Status:
    """``GET /status``, with the monotonic instant the request was sent (deadlines count from it)."""

    leader: Optional[str]
    #: True while this instance leads on its own clock (the field to act on).
    is_leader: bool
    identity: str
    term: Optional[int]
    role: str
    #: Grows with each leadership change (for long-polls and to order snapshots).
    version: int
    lease_duration: float
    renew_deadline: float
    retry_period: float
    #: While leading: seconds this instance still leads if no renew succeeds from now on.
    valid_for: Optional[float]
    #: ``time.monotonic()`` when the request was sent.
    asked_at: float
    #: The whole answer (counters, wait reasons).
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @property
    def valid_until(self) -> Optional[float]:
        """The ``time.monotonic()`` deadline of this instance's tenure, if it leads."""
        if not self.is_leader or self.valid_for is None:
            return None
        return self.asked_at + self.valid_for


class Sidecar(Client):
    """The HTTP API of one ``tenure elect --http ADDR`` (``url`` is ``http://ADDR``)."""

    def leader(self) -> str:
        """``GET /``: the leader's name, ``""`` while nobody is known to lead."""
        return str(self.endpoint.json("GET", "/").get("name", ""))

    def status(self, since: Optional[int] = None, wait: Optional[float] = None) -> Status:
        """``GET /status``; with ``since`` and ``wait``, held until the version differs from
        ``since`` (at most ``wait`` seconds, at most 60)."""
        query = {}
        if since is not None:
            query["since"] = str(since)
        if wait is not None:
            query["wait"] = f"{int(wait * 1000)}ms"
        path = "/status" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        timeout = None if wait is None else self.endpoint.timeout + wait
        asked_at = time.monotonic()
        data = self.endpoint.json("GET", path, timeout)
        try:
            return Status(
                leader=data.get("leader"),
                is_leader=bool(data["isLeader"]),
                identity=str(data["identity"]),
                term=data.get("term"),
                role=str(data["role"]),
                version=int(data["version"]),
                lease_duration=float(data["leaseDurationSeconds"]),
                renew_deadline=float(data["renewDeadlineSeconds"]),
                retry_period=float(data["retryPeriodSeconds"]),
                valid_for=None if data.get("validForSeconds") is None else float(data["validForSeconds"]),
                asked_at=asked_at,
                raw=data,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise SidecarError(f"{self.url}/status answered an unexpected document: {error!r}") from None

    def events(self, idle_timeout: float = IDLE_TIMEOUT) -> Iterator[Leadership]:
        """Each leadership change as the sidecar sees it, the current state first (``GET
        /events``). Raises :class:`SidecarError` when the stream closes or stays silent for
        ``idle_timeout``: stop any work then, the sidecar is gone or frozen."""
        for data in self.endpoint.events("/events", idle_timeout):
            yield Leadership.from_json(data)

    def hold(self, status: Status) -> "Tenure":
        """Holds the tenure ``status`` shows this instance leading with. Raises
        :class:`NotLeading` if it does not lead with that term (anymore)."""
        if status.valid_until is None or status.term is None:
            raise NotLeading(f"{status.identity} does not lead (role {status.role})")
        return Tenure(self, status.term, status.valid_until, status.retry_period)

    def lead(self, timeout: Optional[float] = None) -> "Tenure":
        """Waits until this instance leads and holds that tenure. Raises :class:`LeadTimeout` (a
        TimeoutError) after ``timeout`` seconds, :class:`SidecarError` if the sidecar goes away."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if status.is_leader:
                try:
                    return self.hold(status)
                except NotLeading:
                    pass  # over already: wait for the next tenure
            remaining = 60.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise LeadTimeout(f"{status.identity} did not lead within {timeout} s")
            self.status(since=status.version, wait=min(remaining, 60.0))


class Tenure:
    """Permission to do a leader's work under one term, held through the sidecar.

    Check :meth:`valid` before every side effect and pass :attr:`term` to what you write (the
    store must refuse a lower term). Close it (or leave the ``with`` block) once the work has
    stopped: a sidecar that is releasing the lock waits for that, up to its drain timeout.
    """

    def __init__(self, sidecar: Sidecar, term: int, valid_until: float, retry_period: float) -> None:
        #: The fencing token of this tenure.
        self.term = term
        self._sidecar = sidecar
        self._valid_until = valid_until
        self._retry_period = max(retry_period, 0.05)
        self._guard = threading.Lock()
        self._ended = threading.Event()
        self._connection, self._socket, self._response = self._open_hold()
        self._follower = threading.Thread(target=self._follow_hold, name=f"tenure-hold-{term}", daemon=True)
        self._follower.start()
        threading.Thread(target=self._refresh, name=f"tenure-refresh-{term}", daemon=True).start()

    def _open_hold(self) -> "tuple[http.client.HTTPConnection, socket.socket, http.client.HTTPResponse]":
        endpoint = self._sidecar.endpoint
        connection = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=HOLD_IDLE_TIMEOUT)
        try:
            connection.connect()
            # Kept apart: http.client may drop its own reference while the response reads on.
            sock = connection.sock
            assert sock is not None
            connection.request("GET", f"/hold?term={self.term}")
            response = connection.getresponse()
            if response.status == 409:
                raise NotLeading(f"not leading with term {self.term}")
            if response.status != 200:
                raise SidecarError(f"{endpoint.url}/hold answered {response.status}")
            first = response.readline()
            if not first.startswith(b"holding"):
                raise NotLeading(f"the tenure of term {self.term} ended before it was held")
            return connection, sock, response
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            if isinstance(error, SidecarError):
                raise
            raise SidecarError(f"{endpoint.url}/hold: {error}") from error
        except NotLeading:
            connection.close()
            raise

    def _follow_hold(self) -> None:
        """Ends the tenure when the sidecar says ``ended``, or the hold breaks or falls silent."""
        try:
            while not self._ended.is_set():
                line = self._response.readline()
                if not line or line.startswith(b"ended"):
                    break
        except (OSError, ValueError, http.client.HTTPException):
            pass
        self._ended.set()

    def _refresh(self) -> None:
        """Moves the local deadline from ``/status`` every retry period; ends the tenure when the
        sidecar no longer leads with this term or the deadline has passed."""
        while not self._ended.wait(self._retry_period):
            if time.monotonic() >= self._valid_until:
                break
            try:
                status = self._sidecar.status()
            except SidecarError:
                continue  # the deadline stays where it is and passes on its own
            until = status.valid_until
            if status.term != self.term or until is None:
                break
            with self._guard:
                self._valid_until = max(self._valid_until, until)
        self._ended.set()

    def valid(self) -> bool:
        """True while work may run: the sidecar has not said the tenure ended and its deadline,
        counted on this host's clock, has not passed."""
        with self._guard:
            until = self._valid_until
        return not self._ended.is_set() and time.monotonic() < until

    def remaining(self) -> float:
        """Seconds the tenure lasts from now if the sidecar never renews again (0 once over)."""
        with self._guard:
            until = self._valid_until
        return 0.0 if self._ended.is_set() else max(0.0, until - time.monotonic())

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the tenure ends (True) or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.valid():
            left = self.remaining() if deadline is None else min(self.remaining(), deadline - time.monotonic())
            if left <= 0:
                return not self.valid()
            self._ended.wait(left)
        return True

    def progress(self) -> None:
        """Tells the sidecar that the work under this tenure advanced (``POST /progress``): with
        ``tenure elect --progress-timeout``, a leader whose application stays silent that long
        gives way to a healthy replica. Call it whenever an item of work completes. Raises
        :class:`NotLeading` if the sidecar no longer leads with this term (stop the work), and
        :class:`SidecarError` if the sidecar does not watch progress (no ``--progress-timeout``)."""
        status, body = self._sidecar.endpoint.request("POST", f"/progress?term={self.term}")
        if status == 409:
            self._ended.set()
            raise NotLeading(body.decode("utf-8", "replace").strip())
        if status != 204:
            text = body.decode("utf-8", "replace").strip()
            raise SidecarError(f"POST {self._sidecar.url}/progress answered {status}: {text}")

    def close(self) -> None:
        """Tells the sidecar that the work under this tenure has stopped (it may release the
        lock now). Idempotent."""
        self._ended.set()
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed already
        # The follower reads the stream until the shutdown above ends it; only then is it closed.
        if threading.current_thread() is not self._follower:
            self._follower.join()
        self._response.close()
        self._connection.close()

    def __enter__(self) -> "Tenure":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Tenure(term={self.term}, valid={self.valid()}, remaining={self.remaining():.3f})"
