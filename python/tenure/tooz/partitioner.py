"""Tooz's partitioned groups, with ownership decided by a second child, ``tenure member``, apart from
the coordinator's ``tenure coordinate``: this module owns that child's client and its graceful stop."""

from __future__ import annotations

import subprocess
import time
from typing import Any, Callable, List, Optional

import tooz
from tooz import coordination, partitioner

from .. import _http
from ..member import DRAINING, Member
from ..process import Process

#: How long leaving waits for the ``tenure member`` child to hand its partitions over and exit
#: before killing it.
MEMBER_STOP_TIMEOUT = 15.0


def _release_draining(member: Member) -> List[int]:
    """Releases every draining partition of ``member``; the partitions released."""
    draining = member.assignment().in_state(DRAINING)
    return [partition for partition, term in draining.items() if member.release(partition, term)]


def stop_member(process: Process[Member], timeout: float = MEMBER_STOP_TIMEOUT) -> None:
    """Stops a ``tenure member`` child gracefully: the end of file on its lifeline makes it leave
    the group (every partition drains, then moves at once). The application stopped its work (it
    left the group, or stopped the coordinator), so draining partitions are released as soon as
    they show, instead of waiting for the drain timeout."""
    process.close_stdin()
    deadline = time.monotonic() + timeout
    while process.popen.poll() is None and time.monotonic() < deadline:
        try:
            _release_draining(process.client)
            process.popen.wait(0.05)
        except subprocess.TimeoutExpired:
            continue
        except Exception:  # the member stopped serving: it is exiting
            try:
                process.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            break
    process.wait(max(0.0, deadline - time.monotonic()))


def _one_replica(replicas: int) -> None:
    if replicas != 1:
        raise tooz.NotImplemented("tenure assigns each object to one member: replicas must be 1")


class TenurePartitioner(partitioner.Partitioner):
    """Tooz's partitioner, with ownership decided by Tenure (``tenure member``).

    :meth:`belongs_to_self` answers whether this member *owns* the object now, as its ``tenure
    member`` child says (``GET /owns``): a partition is assigned to a new owner only after the
    previous owner's revoke (and release, or drain timeout), so two members never both get True
    for one object while their leases hold. :meth:`owns` adds the fencing term. The objects' keys
    are ``str(obj)`` (or ``obj.__tooz_hash__()``, decoded as UTF-8).

    :attr:`ring` and :meth:`members_for_object` for *other* members are Tooz's consistent hash ring
    over the group's members and weights, advisory only (a ``tenure member`` answers only for
    itself): an object this member owns is answered as this member's, one it does not own as the
    ring's choice among the others.

    Draining: after a revoke, :meth:`belongs_to_self` is False at once; call
    :meth:`release_draining` once no work on such objects is running any more, so the partitions
    move at once (else they move after the drain timeout, the session TTL / 2).
    """

    def __init__(
        self, coordinator: coordination.CoordinationDriver, group_id: bytes, partitions: int,
        process: Process[Member], forget: Callable[[TenurePartitioner], None],
    ) -> None:
        super().__init__(coordinator, group_id, partitions=partitions)
        self._me: bytes = coordinator._member_id
        #: Takes this partitioner off its driver's list once it left the group.
        self._forget = forget
        self._process: Optional[Process[Member]] = process

    @property
    def member(self) -> Member:
        """The client of this member's ``tenure member`` child (assignment, events, releases)."""
        if self._process is None:
            raise tooz.ToozError("the partitioned group was left")
        return self._process.client

    @staticmethod
    def _key(obj: object) -> str:
        return partitioner.Partitioner._hash_object(obj).decode("utf-8", "backslashreplace")

    def owns(self, obj: object) -> Optional[int]:
        """The fencing term under which this member owns ``obj`` now, or None."""
        try:
            answer = self.member.owns(self._key(obj))
        except _http.SidecarError as error:
            raise coordination.ToozConnectionError(str(error)) from error
        return answer.term if answer.owns else None

    def belongs_to_self(self, obj: object, ignore_members: Optional[Any] = None, replicas: int = 1) -> bool:
        _one_replica(replicas)
        return self.owns(obj) is not None

    def members_for_object(self, obj: object, ignore_members: Optional[Any] = None, replicas: int = 1) -> Any:
        _one_replica(replicas)
        me = self._me
        ignored = set(ignore_members or ())
        if me not in ignored and self.owns(obj) is not None:
            return {me}
        others = set(self.ring.nodes) - ignored - {me}
        if not others:
            return set()
        return self.ring.get_nodes(self._hash_object(obj), ignore_nodes=ignored | {me}, replicas=1)

    def release_draining(self) -> List[int]:
        """Tells the group that work on every draining partition has stopped (they move to
        their new owners at once); the partitions released."""
        try:
            return _release_draining(self.member)
        except _http.SidecarError as error:
            raise coordination.ToozConnectionError(str(error)) from error

    def _stop_member(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_member(process)
        self._forget(self)

    def stop(self) -> None:
        """Stops watching the group and leaves the partitioned group (graceful: the partitions
        move at once)."""
        try:
            super().stop()
        finally:
            self._stop_member()
