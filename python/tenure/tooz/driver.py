"""The Tooz driver: a ``tenure coordinate`` child process per coordinator, behind Tooz's API.

Why: an OpenStack-style application written against Tooz gets Tenure's leases, fencing terms and
stores (file, etcd, ZooKeeper, Kubernetes) without changing its code, only its URL::

    coordinator = tooz.coordination.get_coordinator("tenure+etcd://127.0.0.1:2379/app?timeout=10", b"me")

One ``tenure coordinate`` child per coordinator, started by :meth:`start` with a pipe on its
stdin (its end of file tells the child this process died: it releases everything), stopped by
:meth:`stop`. Every Tooz call is one HTTP request to the child (each with a timeout); the child
ends the session (locks, leaderships, memberships) when no request arrived for ``timeout``
seconds, so an application must heartbeat (``start(start_heart=True)``, or :meth:`heartbeat`).

What Tooz does not have and this driver adds: the fencing term and the validity of a leadership
(:meth:`TenureDriver.leadership`) and of a lock (:attr:`TenureLock.term`, :meth:`TenureLock.valid`),
judged on this host's monotonic clock and counted from when each request was *sent*, so that a
frozen child or a lost session turns them invalid on time.

Names are mapped to the stores' safe names by :mod:`.names`, the URL read by :mod:`.url`; their
refusals reach Tooz's callers as :class:`tooz.ToozError`. Refused (:class:`tooz.NotImplemented`):
:meth:`TenureLock.break_` (breaking another holder's lock makes two holders, which is what a lease
with a fencing term is there to prevent) and shared locks.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, Generic, List, Optional, Set, Tuple, TypeVar, cast

import tooz
from tooz import coordination, partitioner

from .. import _http
from .._errors import TenureError
from ..member import Member
from ..process import Deposed, Process, StartError
from . import names, url
from .lock import TenureLock
from .names import as_bytes, decode_name, full_form, is_hashed
from .partitioner import TenurePartitioner, stop_member
from .url import duration

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=_http.Client)

#: Where the full member id travels in a member record whose name is a hash of it.
_FULL_MEMBER = "tenure.tooz.member_id"

#: Changes this process made to elections through any coordinator (stand-downs, unwatches,
#: stops): a coordinator that sees the count moved since its last answer about its elections asks
#: its child to read the store (``fresh=1``) instead of answering from its watch-fed view, so that
#: what one coordinator of a process did is seen by the next call of another (the view follows
#: another process's change only as fast as the store's watch).
_local_changes = [0]
_local_changes_lock = threading.Lock()


def _changed_locally() -> None:
    with _local_changes_lock:
        _local_changes[0] += 1


#: The longest single long-poll (``wait_ms``) of a blocking lock acquire or of run_watchers.
LONG_POLL = 5.0
#: How long stop() waits for the child to release everything and exit before killing it.
STOP_TIMEOUT = 15.0


def _tooz_error(function: F) -> F:
    """A function of the name codec or the URL grammar, raising their refusals as Tooz's error."""

    @functools.wraps(function)
    def raising_tooz_error(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (names.BadName, url.BadURL) as error:
            raise tooz.ToozError(str(error)) from None

    return cast(F, raising_tooz_error)


encode_name = _tooz_error(names.encode_name)
holder_name = _tooz_error(names.holder_name)
full_name = _tooz_error(names.full_name)
store_url = _tooz_error(url.store_url)
session_timeout = _tooz_error(url.session_timeout)
coordination_flags = _tooz_error(url.coordination)


class SessionExpired(TenureError, coordination.ToozConnectionError):
    """The child ended the session: no request reached it for ``timeout`` seconds (the
    application did not heartbeat, or was frozen). Every lock and leadership of that session is
    gone. The call that raises it does so at once (within one round trip to the child) and has
    the next session started in the background, in which the coordinator joins its groups again
    and campaigns again where it watches an election: the next call waits for it and goes on from
    there (Tooz's heartbeat thread, which retries, carries on by itself).

    Whichever call comes first after such a freeze raises it (heartbeat, run_watchers,
    get_leader, a lock's acquire or release): the child ends the session on the first request
    that finds it silent for the timeout, even if the child was frozen too. What an application
    should do when it catches this exception: stop, at once, all work it does as a leader or
    under a lock (it holds neither any more; another member may have taken over already), drop
    any state that relied on them, and go on calling Tooz as usual: the next run_watchers runs the
    elected-as-leader callback again if this member wins again, with a new term. A lock must be
    acquired again. Work that checks :meth:`TenureDriver.leadership` or :meth:`TenureLock.valid`
    before each side effect stops on time without catching anything."""


class _Done(coordination.CoordAsyncResult[T], Generic[T]):
    """The result of a call already made (the driver's calls are synchronous: one HTTP request
    each); a Tooz error is raised by :meth:`get`, as Tooz's asynchronous drivers do."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._error: Optional[tooz.ToozError] = None
        self._value: Optional[T] = None
        try:
            self._value = call()
        except tooz.ToozError as error:
            self._error = error
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            self._error = tooz.ToozError(f"unexpected answer from the tenure coordinate child: {error!r}", cause=error)

    def get(self, timeout: Optional[float] = None) -> T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def done(self) -> bool:
        return True


class Leadership:
    """This coordinator's leadership of one group: the fencing term, and whether it is still
    valid on this host's clock (refreshed by :meth:`TenureDriver.heartbeat` and
    :meth:`TenureDriver.run_watchers`; ends at once on a stand-down, an unwatch or a stop)."""

    def __init__(self, group: bytes, term: int, deadline: float) -> None:
        self.group = group
        #: The fencing token of this leadership: pass it to every write the leader makes.
        self.term = term
        self._deadline = deadline

    def valid(self) -> bool:
        """Whether work as the leader may still run now."""
        return time.monotonic() < self._deadline

    def remaining(self) -> float:
        """Seconds of validity left (0 when ended)."""
        return max(0.0, self._deadline - time.monotonic())

    def _refresh(self, deadline: float) -> None:
        if self._deadline > 0:
            self._deadline = max(self._deadline, deadline)

    def _end(self) -> None:
        self._deadline = 0.0

    def __repr__(self) -> str:
        return f"<Leadership {self.group!r} term {self.term} {'valid' if self.valid() else 'ended'}>"


class LeaderElected(coordination.LeaderElected):
    """Tooz's event, with the leadership it announces (:attr:`leadership`: ``term`` and
    ``valid()``)."""

    def __init__(self, group_id: bytes, member_id: bytes, leadership: Leadership) -> None:
        super().__init__(group_id, member_id)
        self.leadership = leadership
        #: The fencing token of this leadership.
        self.term = leadership.term


class TenureDriver(coordination.CoordinationDriverCachedRunWatchers):
    """The Tooz driver for ``tenure+file``, ``tenure+etcd``, ``tenure+zookeeper`` and
    ``tenure+kubernetes`` URLs. Option ``timeout`` (seconds, default 10): the session TTL."""

    CHARACTERISTICS: Tuple[coordination.Characteristics, ...] = (
        coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
    )

    def __init__(self, member_id: bytes, parsed_url: Any, options: Dict[str, Any]) -> None:
        member = as_bytes(member_id)
        super().__init__(member, parsed_url, options)
        self._lock_url, across_hosts = store_url(parsed_url)
        if not across_hosts:
            self.CHARACTERISTICS = tuple(
                c for c in self.CHARACTERISTICS if c != coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS
            )
        self._timeout = session_timeout(options)
        self._coordination: List[str] = coordination_flags(options)
        self._member_name = encode_name(member, "member id")
        self._holder = holder_name(member)
        #: Bounds every request that is not a long-poll.
        self._request_timeout = max(10.0, self._timeout) + 5.0
        self._process: Optional[Process[_http.Client]] = None
        self._endpoint: Optional[_http.Endpoint] = None
        self._locks = threading.Condition()
        self._lock_owners: Dict[str, TenureLock] = {}
        self._state = threading.Lock()
        self._leaderships: Dict[bytes, Leadership] = {}
        self._announced: Dict[bytes, int] = {}
        self._campaigning: Set[bytes] = set()
        self._partitioners: List[TenurePartitioner] = []
        #: The JSON capabilities of every group this coordinator joined, to join again after a
        #: session ended.
        self._memberships: Dict[bytes, bytes] = {}
        #: The count of this process's changes (:data:`_local_changes`) as of the last answer.
        self._seen_changes = _local_changes[0]
        #: Held while the next session starts after one expired (see :meth:`_renew_session`).
        self._renewing = threading.Lock()
        #: Why the last attempt to start the next session failed (the next call tries again).
        self._renew_failed: Optional[tooz.ToozError] = None

    # -- the child -------------------------------------------------------------------------

    def _child(self, client: type[C], command: str, lock: str, *extra: str) -> Process[C]:
        """Starts ``tenure COMMAND`` for this member on ``lock``, with a lifeline on its stdin."""
        ttl = duration(self._timeout)
        arguments = [command, "--stdin-lifeline", "--lock", lock, "--id", self._member_name, "--ttl", ttl, *extra]
        try:
            process = Process(arguments, client, stdin_pipe=True)
        except (StartError, OSError) as error:
            raise coordination.ToozConnectionError(f"tenure {command} did not start: {error}") from error
        process.client.endpoint.timeout = self._request_timeout
        return process

    def _start(self) -> None:
        process = self._child(_http.Client, "coordinate", self._lock_url, "--holder", self._holder, *self._coordination)
        self._process, self._endpoint = process, process.client.endpoint
        self._campaigning = set()
        try:
            self._call("GET", "/groups")  # the store answers (else: ToozConnectionError)
        except tooz.ToozError as error:
            self._process = self._endpoint = None
            process.kill()
            if isinstance(error, coordination.ToozConnectionError):
                raise
            raise coordination.ToozConnectionError(str(error)) from error

    def _stop(self) -> None:
        for partitioned in list(self._partitioners):
            partitioned._stop_member()
        self._partitioners.clear()
        self._memberships.clear()
        with self._renewing:  # a next session being started is stopped too
            self._renew_failed = None
            self._end_session()

    def _end_session(self) -> None:
        """Forgets the session's locks and leaderships and stops its child."""
        process, endpoint = self._process, self._endpoint
        self._process = self._endpoint = None
        self._forget_session()
        self._stop_child(process, endpoint)

    def _forget_session(self) -> None:
        """Ends what this process believes of the session: its locks and leaderships."""
        with self._locks:
            for lock in self._lock_owners.values():
                lock._drop()
            self._lock_owners.clear()
            self._locks.notify_all()
        with self._state:
            for leadership in self._leaderships.values():
                leadership._end()
            self._leaderships.clear()
            self._announced.clear()
            self._campaigning = set()

    @staticmethod
    def _stop_child(process: Optional[Process[_http.Client]], endpoint: Optional[_http.Endpoint]) -> None:
        if process is None or endpoint is None:
            return
        try:
            endpoint.request("POST", "/stop", timeout=STOP_TIMEOUT)
        except _http.SidecarError:
            pass  # gone already, or hangs: the wait below kills it
        process.close_stdin()
        process.wait(STOP_TIMEOUT)
        _changed_locally()

    def _renew_session(self, expired: _http.Endpoint) -> None:
        """After the child ended the session ``expired``: forgets its locks and leaderships at
        once (the caller raises SessionExpired right after, without waiting for a new child, so
        that the application learns within one round trip), and starts the next session in a
        thread: a new child, the groups joined again (elections are campaigned for again by
        run_watchers, which watches them). Calls made meanwhile wait for it (:meth:`_call`)."""
        self._renewing.acquire()
        if self._endpoint is not expired:
            self._renewing.release()
            return  # another thread renewed it already
        process, endpoint = self._process, self._endpoint
        self._process = self._endpoint = None
        try:
            self._forget_session()
            thread = threading.Thread(
                target=self._next_session, args=(process, endpoint), name="tenure-session", daemon=True
            )
            thread.start()
        except BaseException:
            self._renewing.release()
            raise

    def _next_session(self, process: Optional[Process[_http.Client]], endpoint: Optional[_http.Endpoint]) -> None:
        """Stops the expired child and starts the next session; releases ``_renewing``."""
        try:
            self._stop_child(process, endpoint)
            self._restart()
        except tooz.ToozError as error:
            self._renew_failed = error  # the next call tries again, and raises if it fails too
        finally:
            self._renewing.release()

    def _restart(self) -> None:
        """A new child, and the groups of the ended session joined again."""
        self._start()
        self._renew_failed = None
        for group, body in list(self._memberships.items()):
            name = encode_name(group, "group id")
            try:
                self._call("PUT", f"/groups/{name}/members/{self._member_name}", body)
            except tooz.ToozError:
                self._memberships.pop(group, None)
                self._joined_groups.discard(group)

    def _call(
        self,
        method: str,
        path: str,
        body: Optional[bytes] = None,
        group: Optional[bytes] = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """One request to the child; its JSON answer (None when empty). Error answers become
        Tooz's exceptions (the child's refusals about ``group``: :meth:`_refusals`)."""
        endpoint, process = self._endpoint, self._process
        if endpoint is None and (self._renewing.locked() or self._renew_failed is not None):
            with self._renewing:  # another thread is starting the next session: wait for it
                if self._endpoint is None and self._renew_failed is not None:
                    try:
                        self._restart()  # it failed: once more, from this call
                    except tooz.ToozError as error:
                        self._renew_failed = error
                        raise coordination.ToozConnectionError(f"the next tenure session did not start: {error}") from error
                endpoint, process = self._endpoint, self._process
        if endpoint is None or process is None:
            raise tooz.ToozError("the tenure coordinator is not started (call start() first)")
        try:
            status, raw = endpoint.request(method, path, timeout=timeout, body=body)
        except _http.SidecarError as error:
            if process.popen.poll() is not None:
                raise coordination.ToozConnectionError(
                    f"the tenure coordinate child exited ({process.popen.returncode}): {process.log_tail(5)}"
                ) from error
            raise coordination.ToozConnectionError(str(error)) from error
        data: Any = None
        if raw.strip():
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
        if 200 <= status < 300:
            return data
        kind = str(data.get("kind", "")) if isinstance(data, dict) else ""
        message = str(data.get("error", "")) if isinstance(data, dict) else raw.decode("utf-8", "replace").strip()
        refusal = None if group is None else self._refusals(group).get(kind)
        if refusal is not None:
            raise refusal()
        if status == 410 or kind == "session_expired":
            self._renew_session(endpoint)
            raise SessionExpired(
                f"the tenure session ended (no request for {self._timeout:g}s: heartbeat more often), so its"
                f" locks and leaderships were released; a new session has started: {message}"
            )
        if kind == "deposed":
            raise Deposed(message)
        if status == 503 or kind == "unavailable":
            raise coordination.ToozConnectionError(f"the store is unavailable: {message}")
        raise tooz.ToozError(f"{method} {path} answered {status} {kind}: {message}")

    def _refusals(self, group_id: bytes) -> Dict[str, Callable[[], tooz.ToozError]]:
        """The child's refusals about a group (its error kinds), as Tooz's exceptions."""
        return {
            "group_exists": lambda: coordination.GroupAlreadyExist(group_id),
            "group_not_created": lambda: coordination.GroupNotCreated(group_id),
            "group_not_empty": lambda: coordination.GroupNotEmpty(group_id),
            "member_exists": lambda: coordination.MemberAlreadyExist(group_id, self._member_id),
            "member_not_joined": lambda: coordination.MemberNotJoined(group_id, self._member_id),
        }

    @staticmethod
    def _json(value: Any, what: str) -> bytes:
        try:
            return json.dumps(value, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as error:
            raise coordination.SerializationError(
                f"the {what} must be JSON-serialisable (tenure stores them as JSON): {error}"
            ) from error

    # -- groups ----------------------------------------------------------------------------

    def create_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        name = encode_name(group_id, "group id")
        # A hashed name: the full group id goes in the group's record, for get_groups.
        body = json.dumps({"group_id": full_form(group_id)}).encode() if is_hashed(name) else None

        def call() -> None:
            self._call("PUT", f"/groups/{name}", body, group=group_id)

        return _Done(call)

    def get_groups(self) -> coordination.CoordAsyncResult[List[bytes]]:
        def call() -> List[bytes]:
            data = self._call("GET", "/groups")
            about = dict(data.get("about") or {})
            groups = []
            for name in data["groups"]:
                record = about.get(name)
                full = record.get("group_id") if isinstance(record, dict) else None
                groups.append(full_name(str(name), full, "group id"))
            return groups

        return _Done(call)

    def delete_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        name = encode_name(group_id, "group id")

        def call() -> None:
            self._call("DELETE", f"/groups/{name}", group=group_id)

        return _Done(call)

    def _record(self, capabilities: Any) -> bytes:
        """The capabilities as this member's record holds them: as given, or, where the member's
        name is a hash of its id, next to the full id (read back by :meth:`_members`)."""
        if is_hashed(self._member_name):
            capabilities = {_FULL_MEMBER: full_form(self._member_id), "capabilities": capabilities}
        return self._json(capabilities, "capabilities")

    def join_group(
        self, group_id: bytes, capabilities: Optional[coordination.Capabilities] = None
    ) -> coordination.CoordAsyncResult[None]:
        name = encode_name(group_id, "group id")
        body = b'{"capabilities": ' + self._record(capabilities) + b"}"

        def call() -> None:
            self._call("PUT", f"/groups/{name}/members/{self._member_name}", body, group=group_id)
            self._joined_groups.add(as_bytes(group_id))
            self._memberships[as_bytes(group_id)] = body

        return _Done(call)

    def leave_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        name = encode_name(group_id, "group id")

        def call() -> None:
            try:
                self._call("DELETE", f"/groups/{name}/members/{self._member_name}", group=group_id)
            finally:
                self._joined_groups.discard(as_bytes(group_id))
                self._memberships.pop(as_bytes(group_id), None)

        return _Done(call)

    def _members(self, group_id: bytes) -> Dict[bytes, Optional[coordination.Capabilities]]:
        name = encode_name(group_id, "group id")
        data = self._call("GET", f"/groups/{name}/members", group=group_id)
        members: Dict[bytes, Optional[coordination.Capabilities]] = {}
        for member, capabilities in data["members"].items():
            if is_hashed(str(member)):
                record = capabilities if isinstance(capabilities, dict) else {}
                members[full_name(str(member), record.get(_FULL_MEMBER), "member id")] = record.get("capabilities")
            else:
                members[decode_name(str(member))] = capabilities
        return members

    def get_members(self, group_id: bytes) -> coordination.CoordAsyncResult[Set[bytes]]:
        return _Done(lambda: set(self._members(group_id)))

    def get_members_with_capabilities(
        self, group_id: bytes
    ) -> coordination.CoordAsyncResult[Dict[bytes, Optional[coordination.Capabilities]]]:
        return _Done(lambda: self._members(group_id))

    def _capabilities(self, group_id: bytes, member_id: bytes) -> Optional[coordination.Capabilities]:
        members = self._members(group_id)
        member = as_bytes(member_id)
        if member not in members:
            raise coordination.MemberNotJoined(group_id, member_id)
        return members[member]

    def get_member_capabilities(
        self, group_id: bytes, member_id: bytes
    ) -> coordination.CoordAsyncResult[Optional[coordination.Capabilities]]:
        return _Done(lambda: self._capabilities(group_id, member_id))

    def get_member_info(self, group_id: bytes, member_id: bytes) -> coordination.CoordAsyncResult[Dict[str, Any]]:
        return _Done(lambda: {"capabilities": self._capabilities(group_id, member_id)})

    def update_capabilities(
        self, group_id: bytes, capabilities: coordination.Capabilities
    ) -> coordination.CoordAsyncResult[None]:
        name = encode_name(group_id, "group id")
        body = self._record(capabilities)

        def call() -> None:
            self._call("PUT", f"/groups/{name}/members/{self._member_name}/capabilities", body, group=group_id)
            if as_bytes(group_id) in self._memberships:
                self._memberships[as_bytes(group_id)] = b'{"capabilities": ' + body + b"}"

        return _Done(call)

    def join_partitioned_group(
        self,
        group_id: bytes,
        weight: int = 1,
        partitions: int = partitioner.Partitioner.DEFAULT_PARTITION_NUMBER,
    ) -> TenurePartitioner:
        """Joins ``group_id`` (created if needed, capabilities ``{"weight": weight}``) and runs a
        ``tenure member`` child in the group's partitioned store, which decides which objects
        this member owns: see :class:`TenurePartitioner`."""
        group = as_bytes(group_id)
        name = encode_name(group, "group id")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise tooz.ToozError(f"the weight of a member is a positive integer, not {weight!r}")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise tooz.ToozError(f"the number of partitions is a positive integer, not {partitions!r}")
        lock = str(self._call("GET", "/url?" + urllib.parse.urlencode({"kind": "partitioned", "name": name}))["url"])
        process = self._child(
            Member, "member", lock, "--group", name, "--partitions", str(partitions), "--weight", str(weight)
        )
        try:
            self.join_group_create(group, capabilities={"weight": weight})
            result = TenurePartitioner(self, group, partitions, process, self._forget_partitioner)
        except BaseException:
            stop_member(process)
            raise
        self._partitioners.append(result)
        return result

    def _forget_partitioner(self, partitioned: TenurePartitioner) -> None:
        """Takes a partitioned group that was left off the list the driver's stop leaves."""
        if partitioned in self._partitioners:
            self._partitioners.remove(partitioned)

    # -- heartbeat -------------------------------------------------------------------------

    def heartbeat(self) -> float:
        """Keeps the session alive and refreshes the validity of leaderships and locks; returns
        the child's retry interval (seconds)."""
        sent = time.monotonic()
        data = self._call("POST", "/heartbeat")
        campaigns = self._campaigns()
        for name, state in dict(data.get("elections") or {}).items():
            if name in campaigns:
                self._note_election(campaigns[name], state, sent)
        locks = dict(data.get("locks") or {})
        with self._locks:
            for encoded, lock in list(self._lock_owners.items()):
                if not lock._held or lock._acquired_at > sent:
                    continue
                state = locks.get(encoded)
                if isinstance(state, dict) and state.get("term") == lock._term and state.get("valid_ms") is not None:
                    lock._deadline = max(lock._deadline, sent + float(state["valid_ms"]) / 1000.0)
                else:
                    lock._deadline = 0.0  # lost: valid() is false; release() answers False
        return float(data.get("retry_ms", self._timeout * 200)) / 1000.0

    # -- elections -------------------------------------------------------------------------

    def leadership(self, group_id: bytes) -> Optional[Leadership]:
        """This coordinator's current leadership of ``group_id`` (fencing term and validity), or
        None when it does not lead (as last seen by heartbeat, run_watchers or get_leader)."""
        with self._state:
            leadership = self._leaderships.get(as_bytes(group_id))
        return leadership if leadership is not None and leadership.valid() else None

    def _note_election(self, group: bytes, state: Any, sent: float) -> Optional[Leadership]:
        """Records an election's state as the child reported it; the leadership if leading."""
        leading = isinstance(state, dict) and bool(state.get("leading")) and state.get("term") is not None
        with self._state:
            current = self._leaderships.get(group)
            if not leading:
                if current is not None:
                    current._end()
                    del self._leaderships[group]
                return None
            term = int(state["term"])
            valid_ms = state.get("valid_ms")
            deadline = sent + (float(valid_ms) / 1000.0 if valid_ms is not None else 0.0)
            if current is not None and current.term == term:
                current._refresh(deadline)
                return current
            if current is not None:
                current._end()
            self._leaderships[group] = Leadership(group, term, deadline)
            return self._leaderships[group]

    def _election(self, group: bytes) -> Tuple[Dict[str, Any], Optional[Leadership]]:
        name = encode_name(group, "group id")
        sent, state = self._fresh_call(f"/elections/{name}")
        return state, self._note_election(group, state, sent)

    def _fresh_call(self, path: str) -> Tuple[float, Any]:
        """A GET whose answer says who leads: when it took longer than the session timeout (this
        process was frozen while it was in flight, and the answer may have waited in the socket
        since before the session ended), asked again, so that no answer is older than the
        session (the second one is SessionExpired, if the session ended). With when it was sent."""
        seen = _local_changes[0]
        if seen != self._seen_changes:
            path += ("&" if "?" in path else "?") + "fresh=1"
        sent = time.monotonic()
        data = self._call("GET", path)
        if time.monotonic() - sent > self._timeout:
            sent = time.monotonic()
            data = self._call("GET", path)
        self._seen_changes = seen
        return sent, data

    def _campaigns(self) -> Dict[str, bytes]:
        """The groups this coordinator campaigns in, by their safe names (the names the child
        reports elections by: a hashed one cannot be decoded)."""
        return {encode_name(group): group for group in list(self._campaigning)}

    def _campaign(self, group: bytes) -> None:
        if group not in self._campaigning:
            self._call("PUT", f"/elections/{encode_name(group, 'group id')}")
            self._campaigning.add(group)

    def watch_elected_as_leader(self, group_id: bytes, callback: coordination.EventCallback[coordination.LeaderElected]) -> None:
        """Campaigns for the leadership of ``group_id`` (at once); ``callback`` runs from
        :meth:`run_watchers` each time this coordinator becomes the leader (a new term)."""
        self._campaign(as_bytes(group_id))
        super().watch_elected_as_leader(group_id, callback)

    def unwatch_elected_as_leader(
        self, group_id: bytes, callback: coordination.EventCallback[coordination.LeaderElected]
    ) -> None:
        """Removes ``callback``; the last one removed stops the campaign (a leadership held is
        released)."""
        super().unwatch_elected_as_leader(group_id, callback)
        group = as_bytes(group_id)
        if group not in self._hooks_elected_leader and group in self._campaigning:
            self._campaigning.discard(group)
            self._forget_leadership(group)
            try:
                self._call("DELETE", f"/elections/{encode_name(group, 'group id')}")
            finally:
                _changed_locally()

    def _forget_leadership(self, group: bytes) -> None:
        with self._state:
            leadership = self._leaderships.pop(group, None)
            self._announced.pop(group, None)
        if leadership is not None:
            leadership._end()

    def stand_down_group_leader(self, group_id: bytes) -> bool:
        """Releases the leadership of ``group_id`` if held (staying a candidate: another
        candidate takes it; this one takes it back only if nobody else does within a lease).
        True when this coordinator was the leader."""
        group = as_bytes(group_id)
        state, _ = self._election(group)
        self._forget_leadership(group)
        try:
            self._call("POST", f"/elections/{encode_name(group, 'group id')}/resign")
        finally:
            _changed_locally()
        return bool(state.get("leading"))

    def get_leader(self, group_id: bytes) -> coordination.CoordAsyncResult[Optional[bytes]]:  # type: ignore[override]
        def call() -> Optional[bytes]:
            state, _ = self._election(as_bytes(group_id))
            leader = state.get("leader")
            return None if leader is None else decode_name(str(leader))

        return _Done(call)

    def _changes(self, since: int, wait: float) -> int:
        query = urllib.parse.urlencode({"since": since, "wait_ms": int(wait * 1000)})
        data = self._call("GET", f"/changes?{query}", timeout=wait + self._request_timeout)
        return int(data["version"])

    def run_watchers(self, timeout: Optional[float] = None) -> List[Any]:
        """Runs the join/leave callbacks (members compared with the last run) and the
        elected-as-leader callbacks.

        Without ``timeout``: returns after one request to the child for the elections
        (``GET /watchers``), as Tooz's drivers run what is pending and return. The child answers
        each election from one read of its store, and waits for its own elector only where that
        read shows the elector behind (a stand-down another coordinator made a moment ago that
        hands the leadership to this one), or the election undecided (its first round, or a
        leadership just released): so a leadership is reported at once, and a call never answers
        from a view older than the store.

        With ``timeout``: long-polls the child until a callback ran or ``timeout`` passed, so that
        a new leadership runs its callback within milliseconds."""
        started = time.monotonic()
        if self._endpoint is None and not self._renewing.locked() and self._renew_failed is None:
            raise tooz.ToozError("the tenure coordinator is not started (call start() first)")
        result: List[Any] = list(super().run_watchers(timeout))
        groups = list(self._hooks_elected_leader)
        if not groups:
            return result
        for group in groups:
            self._campaign(group)  # again after a restart
        version = 0 if timeout is None else self._changes(0, 0)
        while True:
            result.extend(self._run_election_watchers(groups))
            if timeout is None or result:
                return result
            left = started + timeout - time.monotonic()
            if left <= 0:
                return result
            version = self._changes(version, min(left, LONG_POLL))

    def _run_election_watchers(self, groups: List[bytes]) -> List[Any]:
        """One ``GET /watchers``: notes every election's state and runs the callbacks of the
        leaderships not announced yet."""
        sent, data = self._fresh_call("/watchers")
        states = dict(data.get("elections") or {})
        result: List[Any] = []
        for group in groups:
            state = states.get(encode_name(group))
            if state is None:
                continue
            leadership = self._note_election(group, state, sent)
            with self._state:
                fire = leadership is not None and self._announced.get(group) != leadership.term
                if leadership is None:
                    self._announced.pop(group, None)
                else:
                    self._announced[group] = leadership.term
            hooks = self._hooks_elected_leader.get(group)
            if fire and leadership is not None and hooks is not None:
                result.extend(hooks.run(LeaderElected(group, self._member_id, leadership)))
        return result

    # -- locks -----------------------------------------------------------------------------

    def write_fenced_as_leader(self, group_id: bytes, term: int, target: str, data: bytes) -> None:
        """Writes ``data`` to ``target`` (on a file store a file on the store's file system, on
        etcd a key, on ZooKeeper an absolute node path) only while the leadership of ``group_id``
        of ``term`` (:attr:`Leadership.term`, taken when the work began) lasts: the store itself
        refuses the write of a leader that was deposed, even one paused between its last check and
        this call. Raises :class:`tenure.Deposed` when refused (nothing was written; do not retry
        under this term)."""
        self._write_fenced("election", encode_name(as_bytes(group_id), "group id"), term, target, data)

    def _write_fenced(self, kind: str, name: str, term: int, target: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"kind": kind, "name": name, "term": term, "target": target})
        self._call("POST", f"/fenced?{query}", body=data)

    def get_lock(self, name: bytes) -> TenureLock:
        raw = as_bytes(name)
        return TenureLock(self, raw, encode_name(raw, "lock name"))

    def _acquire(self, lock: TenureLock, blocking: bool, deadline: Optional[float]) -> bool:
        name = lock._encoded
        with self._locks:
            # One holder per coordinator: the child holds a lock once for all its users.
            while name in self._lock_owners:
                if not blocking:
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._locks.wait(left)
            self._lock_owners[name] = lock
        acquired = False
        try:
            while True:
                if not blocking:
                    wait = 0.0
                elif deadline is None:
                    wait = LONG_POLL
                else:
                    wait = max(0.0, min(LONG_POLL, deadline - time.monotonic()))
                sent = time.monotonic()
                data = self._call(
                    "POST", f"/locks/{name}?wait_ms={int(wait * 1000)}", timeout=wait + self._request_timeout
                )
                if data.get("acquired"):
                    lock._term = int(data["term"])
                    lock._deadline = sent + float(data["valid_ms"]) / 1000.0
                    lock._acquired_at = sent
                    lock._held = acquired = True
                    return True
                if not blocking or (deadline is not None and time.monotonic() >= deadline):
                    return False
        finally:
            if not acquired:
                with self._locks:
                    if self._lock_owners.get(name) is lock:
                        del self._lock_owners[name]
                    self._locks.notify_all()

    def _release(self, lock: TenureLock) -> bool:
        name = lock._encoded
        with self._locks:
            if self._lock_owners.get(name) is not lock or not lock._held:
                return False
        try:
            data = self._call("DELETE", f"/locks/{name}")
            return bool(data.get("released"))
        except SessionExpired:
            return False  # the session ended, and every lock with it
        finally:
            with self._locks:
                lock._drop()
                if self._lock_owners.get(name) is lock:
                    del self._lock_owners[name]
                self._locks.notify_all()

