"""Fenced writes through the Tooz driver (issue 34): a lock holder's or a leader's write that the
store itself refuses once its term is over, on every store the driver serves. Skipped without
tooz; each store as in test_tooz_names (stores.py)."""

import os
import subprocess
import sys
import time
import unittest
import urllib.parse
import uuid
from typing import Any, List, Optional

import stores

try:
    import tooz
    import tooz.coordination

    import tenure
except ImportError:  # tooz is an optional dependency
    tooz = None  # type: ignore[assignment]

TIMEOUT = 2  # seconds: the session TTL of the coordinators here


def _store_test(store: str) -> Any:
    @unittest.skipIf(tooz is None, "tooz is not installed (pip install tenure[tooz])")
    class FencedOnStore(unittest.TestCase):
        url = ""
        base = ""

        @classmethod
        def setUpClass(cls) -> None:
            cls.url = stores.fresh_url(store, TIMEOUT)
            cls.base = stores.url(store) or ""

        def coordinator(self, member: bytes) -> Any:
            coordinator = tooz.coordination.get_coordinator(self.url, member)
            coordinator.start()
            self.addCleanup(coordinator.stop)
            return coordinator

        def target(self) -> str:
            """Where a write goes: a file beside the store's locks, an etcd key, a node."""
            name = uuid.uuid4().hex[:8]
            if store == "file":
                return os.path.join(urllib.parse.urlsplit(self.url).path, f"state-{name}")
            return f"/tooz-fenced-{name}"

        def stored(self, target: str) -> Optional[bytes]:
            """What the store holds at ``target``, where this test can read it (file, etcd)."""
            if store == "file":
                with open(target, "rb") as f:
                    return f.read()
            if store == "etcd":
                endpoint = urllib.parse.urlsplit(self.base).netloc
                read = ["etcdctl", "--endpoints", endpoint, "get", target, "--print-value-only"]
                value = subprocess.run(read, capture_output=True, check=True, env={**os.environ, "ETCDCTL_API": "3"})
                return value.stdout.rstrip(b"\n")
            return None

        def expect(self, target: str, content: bytes) -> None:
            found = self.stored(target)
            if found is not None:
                self.assertEqual(found, content)

        def keep_alive_until(self, coordinator: Any, done: Any) -> bool:
            """Calls ``done`` until it is true (at most 3 sessions long), heartbeating
            ``coordinator`` between calls so that its session outlives the wait."""
            deadline = time.monotonic() + 3 * TIMEOUT
            while time.monotonic() < deadline:
                if done():
                    return True
                coordinator.heartbeat()
                time.sleep(0.05)  # pacing the attempts, not waiting for an event
            return False

        def test_a_lock_holder_that_lost_the_lock_cannot_write_under_its_term(self) -> None:
            a, b = self.coordinator(b"a"), self.coordinator(b"b")
            target, name = self.target(), b"state-lock"
            lock_a = a.get_lock(name)
            self.assertTrue(lock_a.acquire(blocking=False))
            if store == "kubernetes":  # an object of its own kind: the library's term_fenced
                with self.assertRaises(tooz.ToozError):
                    lock_a.write_fenced(target, b"a1")
                return
            lock_a.write_fenced(target, b"a1")
            self.expect(target, b"a1")
            term_a = lock_a.term
            lock_a.release()
            lock_b = b.get_lock(name)
            # a keeps its session alive meanwhile: its write below must be refused by the store
            # for its term, not for a session it let expire.
            self.assertTrue(self.keep_alive_until(a, lambda: lock_b.acquire(blocking=False)))
            self.assertGreater(lock_b.term, term_a)
            lock_b.write_fenced(target, b"b1")
            with self.assertRaises(tenure.Deposed) as refused:
                lock_a.write_fenced(target, b"a2")
            self.assertIn("deposed", str(refused.exception))
            self.assertIsInstance(refused.exception, tenure.TenureError)
            self.expect(target, b"b1")
            # The new holder's own writes go on; a term that never held the lock is refused too.
            lock_b.write_fenced(target, b"b2")
            with self.assertRaises(tenure.Deposed):
                lock_b.write_fenced(target, b"b3", term=lock_b.term + 1000)
            self.expect(target, b"b2")

        def test_a_leader_that_stood_down_cannot_write_under_its_term(self) -> None:
            if store == "kubernetes":
                self.skipTest("Kubernetes objects are fenced by the library's term_fenced")
            a, b = self.coordinator(b"a"), self.coordinator(b"b")
            group, target = b"fenced-" + uuid.uuid4().hex[:8].encode(), self.target()
            elected: List[Any] = []
            a.watch_elected_as_leader(group, elected.append)
            a.run_watchers()
            term_a = a.leadership(group).term
            a.write_fenced_as_leader(group, term_a, target, b"a1")
            b.watch_elected_as_leader(group, elected.append)
            self.assertEqual(b.run_watchers(), [])  # b campaigns (its candidacy is in the store) before a stands down
            a.stand_down_group_leader(group)
            self.keep_alive_until(a, lambda: bool(b.run_watchers(timeout=0.2)) or b.leadership(group) is not None)
            self.assertEqual([e.member_id for e in elected], [b"a", b"b"])
            term_b = b.leadership(group).term
            b.write_fenced_as_leader(group, term_b, target, b"b1")
            with self.assertRaises(tenure.Deposed):
                a.write_fenced_as_leader(group, term_a, target, b"a2")
            self.expect(target, b"b1")

        def test_bad_targets_and_terms_are_refused_without_a_write(self) -> None:
            a = self.coordinator(b"a")
            lock = a.get_lock(b"bad-input")
            with self.assertRaises(tooz.ToozError):  # never acquired: no term
                lock.write_fenced(self.target(), b"x")
            self.assertTrue(lock.acquire(blocking=False))
            with self.assertRaises(tooz.ToozError):
                lock.write_fenced(self.target(), b"x", term=0)
            with self.assertRaises(tooz.ToozError):
                lock.write_fenced("", b"x")
            if store == "zookeeper":
                with self.assertRaises(tooz.ToozError):
                    lock.write_fenced("relative/node", b"x")

    FencedOnStore.__name__ = FencedOnStore.__qualname__ = f"FencedOn{store.capitalize()}"
    return FencedOnStore


for _store in stores.STORES:
    globals()[f"FencedOn{_store.capitalize()}"] = _store_test(_store)


if __name__ == "__main__":
    sys.exit(unittest.main())
