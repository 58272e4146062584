"""The Tooz driver (tenure.tooz_driver): what a Tooz user would notice. Skipped without tooz.

The coordinators run real `tenure coordinate` children on a file store in a temporary directory.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid
from typing import Any, Callable, List

try:
    import tooz
    import tooz.coordination
    from tenure import tooz_driver
except ImportError:  # tooz is an optional dependency
    tooz = None  # type: ignore[assignment]

TIMEOUT = 2  # seconds: the session TTL (and the leases) of the coordinators here


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Polls ``condition`` until true; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.01)


@unittest.skipIf(tooz is None, "tooz is not installed (pip install tenure[tooz])")
class NamesTest(unittest.TestCase):
    def test_safe_names_stay_and_others_are_hex(self) -> None:
        self.assertEqual(tooz_driver.encode_name(b"workers-1"), "workers-1")
        self.assertEqual(tooz_driver.encode_name("workers-1"), "workers-1")
        self.assertEqual(tooz_driver.encode_name(b"Workers"), "x-" + b"Workers".hex())
        self.assertEqual(tooz_driver.encode_name("é"), "x-c3a9")
        # A safe name that looks encoded is encoded too, so that decoding gives it back.
        self.assertEqual(tooz_driver.encode_name(b"x-ab"), "x-" + b"x-ab".hex())
        for name in (b"workers-1", b"Workers", b"x-ab", b"x-ray", b"\x00\xff", "é".encode(), b"a" * 40):
            self.assertEqual(tooz_driver.decode_name(tooz_driver.encode_name(name)), name)

    def test_long_names_are_hashed_and_only_empty_or_foreign_names_are_refused(self) -> None:
        self.assertEqual(tooz_driver.encode_name(b"A" * 19), "x-" + "41" * 19)
        for name in (b"A" * 20, b"a" * 41, uuid.uuid4().hex.upper().encode(), b"h-" + b"a" * 38):
            encoded = tooz_driver.encode_name(name, "group id")
            self.assertTrue(tooz_driver.is_hashed(encoded), encoded)
            self.assertEqual(len(encoded), tooz_driver.MAX_NAME)
            self.assertEqual(tooz_driver.full_name(encoded, "x-" + name.hex(), "group id"), name)
            with self.assertRaises(tooz.ToozError):  # a record that carries another name
                tooz_driver.full_name(encoded, "x-" + (name + b"!").hex(), "group id")
        self.assertNotEqual(tooz_driver.encode_name(b"a" * 41), tooz_driver.encode_name(b"A" * 41))
        with self.assertRaises(tooz.ToozError):
            tooz_driver.encode_name(b"", "group id")
        with self.assertRaises(TypeError):
            tooz_driver.encode_name(5)  # type: ignore[arg-type]
        self.assertEqual(tooz_driver.decode_name(tooz_driver.holder_name(b"H" * 300)), b"H" * 300)

    def test_store_urls(self) -> None:
        from oslo_utils import netutils

        def url(text: str) -> str:
            return tooz_driver.store_url(netutils.urlsplit(text))[0]

        self.assertEqual(url("tenure+file:///var/lib/app?timeout=5"), "file:///var/lib/app")
        self.assertEqual(url("tenure+etcd://127.0.0.1:2379/prefix?timeout=5"), "etcd://127.0.0.1:2379/prefix")
        self.assertEqual(url("tenure+zookeeper://h:2181/path"), "zk://h:2181/path")
        self.assertEqual(url("tenure+kubernetes://ns/prefix"), "kube://ns/leases/prefix")
        with self.assertRaises(tooz.ToozError):
            url("tenure+file://relative/dir")


@unittest.skipIf(tooz is None, "tooz is not installed (pip install tenure[tooz])")
class CoordinatorTest(unittest.TestCase):
    def setUp(self) -> None:
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        self.url = f"tenure+file://{directory.name}?timeout={TIMEOUT}"
        self.group = b"g-" + uuid.uuid4().hex[:8].encode()

    def coordinator(self, member: bytes, start: bool = True, url: str = "") -> Any:
        coordinator = tooz.coordination.get_coordinator(url or self.url, member)
        self.assertIsInstance(coordinator, tooz_driver.TenureDriver)
        if start:
            coordinator.start()

            def stop() -> None:
                if coordinator.is_started:
                    coordinator.stop()

            self.addCleanup(stop)
        return coordinator

    def test_the_term_increases_across_stand_downs(self) -> None:
        a, b = self.coordinator(b"a"), self.coordinator(b"b")
        elected: List[Any] = []
        a.watch_elected_as_leader(self.group, elected.append)
        a.run_watchers()
        self.assertEqual([e.member_id for e in elected], [b"a"])
        first = a.leadership(self.group)
        self.assertIsNotNone(first)
        self.assertTrue(first.valid())
        self.assertIs(elected[0].leadership, first)
        self.assertEqual(elected[0].term, first.term)

        b.watch_elected_as_leader(self.group, elected.append)
        self.assertEqual(b.run_watchers(), [])
        self.assertTrue(a.stand_down_group_leader(self.group))
        self.assertFalse(first.valid(), "a stand-down ends the leadership at once")
        self.assertIsNone(a.leadership(self.group))
        started = time.monotonic()
        b.run_watchers(timeout=3 * TIMEOUT)
        self.assertEqual([e.member_id for e in elected], [b"a", b"b"])
        # run_watchers(timeout) long-polls the child: it returns once b leads, not at the timeout.
        self.assertLess(time.monotonic() - started, TIMEOUT, "the callback waited for the timeout")
        second = b.leadership(self.group)
        self.assertGreater(second.term, first.term)
        self.assertEqual(elected[1].term, second.term)
        self.assertEqual(b.get_leader(self.group).get(), b"b")

        self.assertTrue(b.stand_down_group_leader(self.group))
        a.run_watchers(timeout=3 * TIMEOUT)
        self.assertEqual([e.member_id for e in elected], [b"a", b"b", b"a"])
        self.assertGreater(a.leadership(self.group).term, second.term)

    def test_a_frozen_child_loses_the_lock_and_the_leadership_on_time(self) -> None:
        a, b = self.coordinator(b"a"), self.coordinator(b"b")
        a.watch_elected_as_leader(self.group, lambda event: None)
        lock = a.get_lock(b"resource")
        sent = time.monotonic()
        a.run_watchers()
        leadership = a.leadership(self.group)
        self.assertIsNotNone(leadership)
        self.assertTrue(lock.acquire(blocking=False))
        self.assertIsNotNone(lock.term)
        self.assertTrue(lock.valid())
        a._process.signal(signal.SIGSTOP)
        self.addCleanup(a._process.signal, signal.SIGCONT)
        # Judged on this host's clock, counted from when the acquire was sent: at the latest one
        # session TTL later (the margin is only for a loaded machine's thread wake-up).
        wait_for(lambda: not lock.valid(), TIMEOUT + 1.0, "the lock stayed valid with its child frozen")
        wait_for(lambda: not leadership.valid(), TIMEOUT + 1.0, "the leadership stayed valid with its child frozen")
        self.assertLessEqual(time.monotonic() - sent, TIMEOUT + 1.0)
        self.assertIsNone(a.leadership(self.group))

        other = b.get_lock(b"resource")
        self.assertTrue(other.acquire(blocking=4 * TIMEOUT), "the frozen holder's lease did not run out")
        self.assertGreater(other.term, lock.term)
        a._process.signal(signal.SIGCONT)
        self.assertFalse(lock.release(), "the thawed coordinator claimed a lock it had lost")
        self.assertTrue(other.release())

    def test_an_application_that_does_not_heartbeat_loses_its_session(self) -> None:
        a, b = self.coordinator(b"a"), self.coordinator(b"b")
        lock = a.get_lock(b"resource")
        self.assertTrue(lock.acquire(blocking=False))
        a.join_group_create(self.group)
        # b heartbeats (its heart thread), a does not: a's child ends a's session after TIMEOUT.
        b.heart.start()
        self.addCleanup(b.heart.stop)
        wait_for(lambda: "no request from the application" in a._process.log_tail(50), 3 * TIMEOUT, "no session end")
        self.assertFalse(lock.valid())
        wait_for(lambda: b"a" not in b.get_members(self.group).get(), TIMEOUT, "a's membership was not removed")
        self.assertTrue(b.get_lock(b"resource").acquire(blocking=True))
        # a's first call after the silence is refused, never answered from the old session...
        with self.assertRaises(tooz.coordination.ToozConnectionError) as raised:
            a.heartbeat()
        self.assertIsInstance(raised.exception, tooz_driver.SessionExpired)
        self.assertFalse(lock.release(), "the old session's lock is gone")
        # ... and the coordinator goes on in a new session, a member of its group again.
        self.assertTrue(a.heartbeat() > 0)
        self.assertIn(b"a", b.get_members(self.group).get())
        self.assertFalse(a.get_lock(b"resource").acquire(blocking=False), "b holds it now")

    def test_the_locks_of_an_application_that_dies_are_freed_at_once(self) -> None:
        url = self.url.replace(f"timeout={TIMEOUT}", "timeout=30")
        script = (
            "import sys, tooz.coordination\n"
            f"c = tooz.coordination.get_coordinator({url!r}, b'doomed')\n"
            "c.start()\n"
            "assert c.get_lock(b'resource').acquire(blocking=False)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n"
        )
        app = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert app.stdin is not None and app.stdout is not None
        self.addCleanup(app.stdout.close)
        self.addCleanup(app.stdin.close)
        self.addCleanup(app.wait)
        self.addCleanup(app.kill)
        self.assertEqual(app.stdout.readline().strip(), b"held")
        b = self.coordinator(b"b", url=url)
        lock = b.get_lock(b"resource")
        self.assertFalse(lock.acquire(blocking=False))
        app.kill()  # SIGKILL: nothing runs in the application; its child sees the pipe close
        started = time.monotonic()
        self.assertTrue(lock.acquire(blocking=20), "the dead application's lock was not freed")
        self.assertLess(time.monotonic() - started, 10, "freed by the 30 s lease, not by the pipe")
        self.assertTrue(lock.release())

    def test_a_partitioned_object_has_one_owner_and_moves_when_it_leaves(self) -> None:
        a, b = self.coordinator(b"a"), self.coordinator(b"b")
        pa = a.join_partitioned_group(self.group, partitions=8)
        pb = b.join_partitioned_group(self.group, partitions=8)
        objects = [f"object-{i}" for i in range(50)]

        def split() -> bool:
            pa.release_draining()  # the test runs no work on revoked objects
            owners = [(pa.belongs_to_self(o), pb.belongs_to_self(o)) for o in objects]
            self.assertFalse(any(x and y for x, y in owners), "two owners of one object")
            return all(x or y for x, y in owners) and any(x for x, _ in owners) and any(y for _, y in owners)

        wait_for(split, 20, "the objects were not shared between the two members")
        owned_by_a = [o for o in objects if pa.belongs_to_self(o)]
        terms = {o: pa.owns(o) for o in owned_by_a}
        self.assertEqual(pa.members_for_object(owned_by_a[0]), {b"a"})
        a.leave_partitioned_group(pa)
        wait_for(lambda: all(pb.belongs_to_self(o) for o in objects), 20, "b did not take over a's objects")
        for o in owned_by_a:
            self.assertGreater(pb.owns(o), terms[o])

    def test_capabilities_that_are_not_json_are_a_tooz_error(self) -> None:
        a = self.coordinator(b"a")
        a.create_group(self.group).get()
        started = time.monotonic()
        with self.assertRaises(tooz.ToozError) as raised:
            a.join_group(self.group, {"when": object()}).get()
        self.assertIn("JSON", str(raised.exception))
        self.assertLess(time.monotonic() - started, 1.0)
        a.join_group(self.group, {"when": "now", "weight": 2}).get()
        with self.assertRaises(tooz.ToozError):
            a.update_capabilities(self.group, {"bytes": b"raw"}).get()
        self.assertEqual(a.get_member_capabilities(self.group, b"a").get(), {"when": "now", "weight": 2})

    def test_names_are_encoded_and_given_back(self) -> None:
        member = "Zoë".encode()
        a = self.coordinator(member)
        group = b"Group One"
        a.join_group_create(group)
        self.assertIn(group, a.get_groups().get())
        self.assertEqual(a.get_members(group).get(), {member})
        elected: List[Any] = []
        a.watch_elected_as_leader(group, elected.append)
        a.run_watchers()
        self.assertEqual(a.get_leader(group).get(), member)
        # Past forty characters a name is hashed, and still given back (issue 32).
        long_group = b"A Group Name Far Too Long For Forty Characters"
        a.create_group(long_group).get()
        self.assertIn(long_group, a.get_groups().get())
        lock = a.get_lock(b"\x00" * 20)
        self.assertTrue(lock.acquire(blocking=False))
        self.assertTrue(lock.release())

    def test_used_before_start_or_after_stop_is_a_tooz_error(self) -> None:
        a = self.coordinator(b"a", start=False)
        with self.assertRaises(tooz.ToozError):
            a.get_groups().get()
        with self.assertRaises(tooz.ToozError):
            a.get_lock(b"l").acquire()
        a.start()
        lock = a.get_lock(b"l")
        self.assertTrue(lock.acquire())
        a.stop()
        self.assertFalse(lock.valid())
        self.assertFalse(lock.release())
        with self.assertRaises(tooz.ToozError):
            a.get_groups().get()
        with self.assertRaises(tooz.ToozError):
            a.heartbeat()
        with self.assertRaises(tooz.ToozError):
            a.run_watchers()


if __name__ == "__main__":
    unittest.main()
