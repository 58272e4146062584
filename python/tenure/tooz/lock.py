"""The lock an application holds (``coordinator.get_lock(name)``): Tooz's lock API plus what Tooz's
locks lack, :attr:`TenureLock.term` and :meth:`TenureLock.valid`. Its requests, and the table of the
locks a coordinator holds (which the coordinator's session ends), are the driver's."""

from __future__ import annotations

import time
from typing import Optional, Protocol, Union

import tooz
from tooz import locking, utils


class LockRequests(Protocol):
    """What a lock asks of the driver that made it (the driver makes the requests and keeps the
    table of held locks, which its session ends); a protocol, so that this module needs no import
    of the driver's."""

    def _acquire(self, lock: TenureLock, blocking: bool, deadline: Optional[float]) -> bool: ...

    def _release(self, lock: TenureLock) -> bool: ...

    def heartbeat(self) -> float: ...

    def _write_fenced(self, kind: str, name: str, term: int, target: str, data: bytes) -> None: ...


class TenureLock(locking.Lock):
    """An exclusive lock held through the coordinator's child (``POST /locks/NAME``), with the
    fencing term of each acquisition."""

    def __init__(self, driver: LockRequests, name: bytes, encoded: str) -> None:
        super().__init__(name)
        self._driver = driver
        #: The lock's safe name.
        self._encoded = encoded
        self._held = False
        self._term: Optional[int] = None
        self._deadline = 0.0
        self._acquired_at = 0.0

    @property
    def term(self) -> Optional[int]:
        """The fencing term of the current (or last) acquisition."""
        return self._term

    def valid(self) -> bool:
        """Held, and still valid on this host's clock (refreshed by heartbeats)."""
        return self._held and time.monotonic() < self._deadline

    def write_fenced(self, target: str, data: bytes, term: Optional[int] = None) -> None:
        """Writes ``data`` to ``target`` (on a file store a file on the store's file system, on
        etcd a key, on ZooKeeper an absolute node path) only while the acquisition of ``term``
        (default: the current one) still holds this lock: the store itself refuses the write of a
        holder that lost the lock, even one paused between its last check and this call. Raises
        :class:`tenure.Deposed` when refused (nothing was written; do not retry under this
        term)."""
        term = self._term if term is None else term
        if term is None:
            raise tooz.ToozError(f"lock {self.name!r} was never acquired: no term to write under")
        self._driver._write_fenced("lock", self._encoded, term, target, data)

    def _drop(self) -> None:
        """Not held any more (released, or its session ended)."""
        self._held = False
        self._deadline = 0.0

    def acquire(self, blocking: Union[bool, float] = True, shared: bool = False, timeout: Optional[float] = None) -> bool:
        if shared:
            raise tooz.NotImplemented("tenure locks are exclusive: shared locks are not implemented")
        wait, limit = utils.convert_blocking(blocking, timeout)
        deadline = None if not wait or limit is None else time.monotonic() + float(limit)
        return self._driver._acquire(self, wait, deadline)

    def release(self) -> bool:
        return self._driver._release(self)

    def heartbeat(self) -> bool:
        """Refreshes the coordinator's session; whether this lock is still held."""
        if not self._held:
            return False
        self._driver.heartbeat()
        return self.valid()

    def is_still_owner(self) -> bool:
        return self.valid()

    def break_(self) -> bool:
        raise tooz.NotImplemented(
            "tenure does not break locks: breaking another holder's lock makes two holders"
            " (the old one does not know); a lock is freed by its holder or by its lease running out"
        )
