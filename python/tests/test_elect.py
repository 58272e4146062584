"""`tenure elect` through the Python package, with the real binary on a file lock."""

import os
import signal
import tempfile
import threading
import time
import unittest

import tenure

TTL = "2s"  # lease 2 s, renew deadline 1 s, retry 500 ms


class ElectTest(unittest.TestCase):
    def setUp(self) -> None:
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        self.lock = "file://" + os.path.join(directory.name, "leader.json")

    def start(self, identity: str) -> "tenure.Process[tenure.Sidecar]":
        process = tenure.elect("python-test", lock=self.lock, identity=identity, ttl=TTL)
        self.addCleanup(process.kill)
        return process

    def test_a_graceful_stop_waits_for_the_held_work_then_hands_over(self) -> None:
        a = self.start("a")
        tenure_a = a.client.lead(timeout=10)
        self.assertTrue(tenure_a.valid())
        b = self.start("b")
        self.assertFalse(b.client.status().is_leader)

        stopping = threading.Thread(target=a.stop)
        stopping.start()
        self.assertTrue(tenure_a.wait(timeout=5), "SIGTERM ends the held tenure at once")
        self.assertFalse(tenure_a.valid())
        # The work is still stopping: the lock is not released, so b does not lead meanwhile.
        status = b.client.status()
        self.assertFalse(status.is_leader)
        unchanged = b.client.status(since=status.version, wait=0.8)
        self.assertFalse(unchanged.is_leader, "b led while a's work still held the tenure")

        tenure_a.close()
        tenure_b = b.client.lead(timeout=5)
        self.assertGreater(tenure_b.term, tenure_a.term)
        stopping.join(10)
        self.assertEqual(a.popen.returncode, 0, a.log_tail())
        tenure_b.close()

    def test_a_frozen_sidecar_ends_the_tenure_on_the_local_clock(self) -> None:
        a = self.start("a")
        held = a.client.lead(timeout=10)
        status = a.client.status()
        b = self.start("b")
        a.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        self.assertTrue(held.wait(timeout=5), "the tenure outlived a frozen sidecar")
        ended_after = time.monotonic() - frozen_at
        # Judged on this host's clock: at the latest one renew deadline after the last renew the
        # sidecar reported (the margin is only for a loaded machine's thread wake-up).
        self.assertLessEqual(ended_after, status.renew_deadline + 1.0, "ended later than the renew deadline")
        self.assertFalse(held.valid())

        tenure_b = b.client.lead(timeout=10)
        self.assertGreater(tenure_b.term, held.term)
        a.signal(signal.SIGCONT)
        # The first answer after the thaw never claims the old tenure.
        thawed = a.client.status()
        self.assertFalse(thawed.is_leader and thawed.term == held.term, thawed)
        held.close()
        tenure_b.close()

    def test_events_push_the_next_leader_after_a_step_down(self) -> None:
        a = self.start("a")
        first = a.client.lead(timeout=10)
        b = self.start("b")
        events = b.client.events()
        current = next(events)
        self.assertIn(current.role, ("follower",))
        first.close()
        a.step_down()
        for change in events:
            if change.role == "leader":
                self.assertEqual(change.leader, "b")
                self.assertGreater(change.term, first.term)
                break
        events.close()
        self.assertTrue(b.client.status().is_leader)

    def test_bad_input_gets_a_clear_error(self) -> None:
        with self.assertRaises(ValueError):
            tenure.Sidecar("ftp://127.0.0.1:1")
        with self.assertRaises(tenure.SidecarError):
            tenure.Sidecar("http://127.0.0.1:1").status()
        with self.assertRaises(tenure.StartError) as failed:
            tenure.elect("bad/name", lock=self.lock)
        self.assertIn("bad/name", str(failed.exception))

        a = self.start("a")
        held = a.client.lead(timeout=10)
        stale = tenure.Status(**{**a.client.status().__dict__, "term": held.term + 1})
        with self.assertRaises(tenure.NotLeading):
            a.client.hold(stale)
        held.close()


if __name__ == "__main__":
    unittest.main()


class FencedWriteAndProgressTest(unittest.TestCase):
    """What the leader writes is fenced by the lock; what it does proves progress to its sidecar."""

    def setUp(self) -> None:
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        self.directory = directory.name
        self.lock = "file://" + os.path.join(directory.name, "leader.json")

    def test_a_fenced_write_lands_while_leading_and_is_refused_once_deposed(self) -> None:
        a = tenure.elect("python-fenced", lock=self.lock, identity="a", ttl=TTL)
        self.addCleanup(a.kill)
        held = a.client.lead(timeout=10)
        target = os.path.join(self.directory, "state.json")
        tenure.write_fenced(target, b'{"allocated": 1}', election="python-fenced", term=held.term, lock=self.lock)
        with open(target, "rb") as written:
            self.assertEqual(written.read(), b'{"allocated": 1}')
        held.close()
        self.assertEqual(a.stop(), 0, a.log_tail())  # releases the lock: the tenure is over
        with self.assertRaises(tenure.Deposed) as refused:
            tenure.write_fenced(target, b"late", election="python-fenced", term=held.term, lock=self.lock)
        self.assertIn("deposed", str(refused.exception))
        with open(target, "rb") as unchanged:
            self.assertEqual(unchanged.read(), b'{"allocated": 1}')

    def test_progress_is_noted_while_leading_and_needs_the_flag(self) -> None:
        watched = tenure.elect(
            "python-progress", lock=self.lock, identity="a", ttl=TTL, extra=["--progress-timeout", "5s"]
        )
        self.addCleanup(watched.kill)
        held = watched.client.lead(timeout=10)
        held.progress()
        self.assertTrue(held.valid())
        held.close()
        self.assertEqual(watched.stop(), 0, watched.log_tail())

        other = "file://" + os.path.join(self.directory, "other.json")
        plain = tenure.elect("python-progress", lock=other, identity="b", ttl=TTL)
        self.addCleanup(plain.kill)
        held = plain.client.lead(timeout=10)
        with self.assertRaises(tenure.SidecarError):
            held.progress()
        held.close()
