"""A client of ``tenure member --http``: which keys this replica owns (Active/Active).

The rule it helps keep: work on a key runs only while :meth:`Member.owns` says so; when a
partition is revoked it shows as ``draining`` and the group waits for the application to finish
its work on it and call :meth:`Member.release` (up to the sidecar's drain timeout) before the
next owner starts. A ``lost`` partition (this member was paused past its lease, or cut off) must
be dropped at once: another member may own it already.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

from ._errors import TenureError
from ._http import Client, SidecarError
from .elect import IDLE_TIMEOUT

#: A partition's states in an assignment.
OWNED, DRAINING, LOST = "owned", "draining", "lost"


class StillAssigned(TenureError):
    """A release of a partition the group has not revoked: the application's bookkeeping is off."""


@dataclass(frozen=True)
class Partition:
    """One partition this member holds, with the term of its ownership (the fencing token)."""

    partition: int
    term: int
    #: :data:`OWNED`, :data:`DRAINING` or :data:`LOST`.
    state: str


@dataclass(frozen=True)
class Assignment:
    """``GET /assignment``, and each event of ``GET /events``."""

    member: str
    #: Grows with every change.
    version: int
    partition_count: int
    #: The live members as this member sees them.
    members: List[str]
    partitions: List[Partition]

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Assignment":
        """Reads one answer."""
        try:
            return cls(
                member=str(data["member"]),
                version=int(data["version"]),
                partition_count=int(data["partitionCount"]),
                members=[str(m) for m in data["members"]],
                partitions=[Partition(int(p["partition"]), int(p["term"]), str(p["state"])) for p in data["partitions"]],
            )
        except (KeyError, TypeError, ValueError) as error:
            raise SidecarError(f"unexpected assignment document: {error!r}") from None

    def in_state(self, state: str) -> Dict[int, int]:
        """The partitions in ``state``, with their terms."""
        return {p.partition: p.term for p in self.partitions if p.state == state}


@dataclass(frozen=True)
class Owns:
    """``GET /owns?key=K``: whether this member owns the key now, and under which term."""

    key: str
    owns: bool
    partition: int
    #: The term of the ownership while owned.
    term: Optional[int]


class Member(Client):
    """The HTTP API of one ``tenure member --http ADDR`` (``url`` is ``http://ADDR``)."""

    def owns(self, key: str) -> Owns:
        """Whether work on ``key`` may run now, and under which term."""
        data = self.endpoint.json("GET", "/owns?" + urllib.parse.urlencode({"key": key}))
        term = data.get("term")
        return Owns(str(data["key"]), bool(data["owns"]), int(data["partition"]), None if term is None else int(term))

    def assignment(self) -> Assignment:
        """The members and this member's partitions now."""
        return Assignment.from_json(self.endpoint.json("GET", "/assignment"))

    def events(self, idle_timeout: float = IDLE_TIMEOUT) -> Iterator[Assignment]:
        """Each change of the assignment, the current one first. Raises :class:`SidecarError`
        when the stream closes or stays silent for ``idle_timeout``: stop all work then."""
        for data in self.endpoint.events("/events", idle_timeout):
            yield Assignment.from_json(data)

    def release(self, partition: int, term: int) -> bool:
        """Tells the group the work on a draining partition has stopped, so it moves on at once.
        False when there was nothing to release (already released, or lost); raises
        :class:`StillAssigned` for a partition that is still this member's."""
        query = urllib.parse.urlencode({"partition": partition, "term": term})
        status, body = self.endpoint.request("POST", f"/release?{query}")
        if status == 409:
            raise StillAssigned(body.decode("utf-8", "replace").strip())
        if status != 200:
            raise SidecarError(f"POST {self.url}/release answered {status}: {body.decode('utf-8', 'replace').strip()}")
        try:
            return bool(json.loads(body)["released"])
        except (KeyError, TypeError, ValueError) as error:
            raise SidecarError(f"unexpected release answer: {error!r}") from None
