"""Coordinated Leader Election through the Tooz driver (issue 35): Tooz coordinators on the
Kubernetes store with ``coordinated=1``, upgraded one by one; the API server's coordinator keeps
the group's leadership on the oldest version while one remains. Skipped without tooz."""

import sys
import threading
import time
import unittest
import uuid
from typing import Any, Dict, List, Tuple

import stores

try:
    import tooz
    import tooz.coordination
except ImportError:  # tooz is an optional dependency
    tooz = None  # type: ignore[assignment]

TIMEOUT = 2  # seconds: the session TTL (and the elections' leases)


@unittest.skipIf(tooz is None, "tooz is not installed (pip install tenure[tooz])")
class CoordinatedTest(unittest.TestCase):
    def setUp(self) -> None:
        base = stores.url("kubernetes")
        if base is None:
            raise unittest.SkipTest(f"kubernetes cannot run here: {stores.why('kubernetes')}")
        self.url = f"{base}-{uuid.uuid4().hex[:8]}?timeout={TIMEOUT}&coordinated=1"
        self.group = b"upgrade"
        self.replicas: Dict[bytes, Tuple[Any, str, threading.Event, threading.Thread]] = {}

    def start(self, member: bytes, version: str) -> None:
        """A replica: a coordinator of ``version`` that campaigns and keeps its session alive."""
        coordinator = tooz.coordination.get_coordinator(f"{self.url}&binary_version={version}", member)
        coordinator.start()
        coordinator.watch_elected_as_leader(self.group, lambda event: None)
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                coordinator.run_watchers(timeout=0.2)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        self.replicas[member] = (coordinator, version, stop, thread)
        self.addCleanup(self.stop, member)

    def stop(self, member: bytes) -> None:
        replica = self.replicas.pop(member, None)
        if replica is not None:
            coordinator, _, stop, thread = replica
            stop.set()
            thread.join()
            coordinator.stop()

    def leaders(self) -> List[bytes]:
        return [m for m, (c, _, _, _) in self.replicas.items() if c.leadership(self.group) is not None]

    def settled_leader(self) -> bytes:
        """The one replica that leads once every replica agrees on it, the coordinator's choice."""
        deadline = time.monotonic() + 10 * TIMEOUT
        while time.monotonic() < deadline:
            leaders = self.leaders()
            if len(leaders) == 1:
                seen = {c.get_leader(self.group).get() for c, _, _, _ in self.replicas.values()}
                oldest = min(version for _, version, _, _ in self.replicas.values())
                if seen == {leaders[0]} and self.replicas[leaders[0]][1] == oldest:
                    return leaders[0]
            time.sleep(0.05)  # polling the replicas' own views: no event spans them all
        raise AssertionError(f"no leader of the oldest version settled: {self.leaders()}")

    def test_a_rolling_upgrade_keeps_the_oldest_version_leading(self) -> None:
        for member in (b"pod-a", b"pod-b", b"pod-c"):
            self.start(member, "1.0")
        self.settled_leader()
        overlaps = []
        for member in (b"pod-b", b"pod-a", b"pod-c"):
            self.stop(member)
            self.start(member, "1.1")
            leader = self.settled_leader()
            if any(version == "1.0" for _, version, _, _ in self.replicas.values()):
                self.assertEqual(self.replicas[leader][1], "1.0", f"after upgrading {member!r}")
            overlaps.append(len(self.leaders()))
        self.assertEqual(overlaps, [1, 1, 1], "exactly one replica believes it leads")

    def test_versions_without_coordinated_and_a_file_store_are_refused(self) -> None:
        with self.assertRaises(tooz.ToozError):
            tooz.coordination.get_coordinator(self.url.replace("coordinated=1", "binary_version=1.0"), b"x")
        file_url = f"{stores.url('file')}/{uuid.uuid4().hex[:8]}?timeout={TIMEOUT}&coordinated=1"
        coordinator = tooz.coordination.get_coordinator(file_url, b"x")
        with self.assertRaises(tooz.ToozError):  # the child refuses at start: not a Kubernetes base
            coordinator.start()


if __name__ == "__main__":
    sys.exit(unittest.main())
