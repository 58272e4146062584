"""`tenure member` through the Python package, with the real binary on a file group."""

import os
import tempfile
import unittest

import tenure

PARTITIONS = 8


class MemberTest(unittest.TestCase):
    def setUp(self) -> None:
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        self.lock = "file://" + directory.name

    def start(self, identity: str, drain_timeout: str = "30s") -> "tenure.Process[tenure.Member]":
        extra = ["--partitions", str(PARTITIONS), "--drain-timeout", drain_timeout]
        process = tenure.member("python-test", lock=self.lock, identity=identity, ttl="2s", extra=extra)
        self.addCleanup(process.kill)
        return process

    @staticmethod
    def until(events, wanted):
        for assignment in events:
            if wanted(assignment):
                return assignment
        raise AssertionError("the event stream ended")

    def test_a_joining_member_gets_a_partition_only_after_the_owner_released_it(self) -> None:
        a = self.start("a")
        a_events = a.client.events()
        alone = self.until(a_events, lambda s: len(s.in_state(tenure.OWNED)) == PARTITIONS)
        self.assertEqual(alone.members, ["a"])

        b = self.start("b")
        revoked = self.until(a_events, lambda s: s.in_state(tenure.DRAINING))
        partition, term = next(iter(revoked.in_state(tenure.DRAINING).items()))
        # Draining: a's work may still run, so b must not have it yet.
        self.assertNotIn(partition, b.client.assignment().in_state(tenure.OWNED))
        with self.assertRaises(tenure.StillAssigned):
            owned = next(iter(revoked.in_state(tenure.OWNED).items()))
            a.client.release(*owned)

        self.assertTrue(a.client.release(partition, term))
        self.assertFalse(a.client.release(partition, term), "a second release is harmless")
        b_events = b.client.events()
        moved = self.until(b_events, lambda s: partition in s.in_state(tenure.OWNED))
        self.assertEqual(moved.members, ["a", "b"])
        for owner in (a, b):
            key_owned = [owner.client.owns(f"key-{i}") for i in range(32)]
            self.assertTrue(all(o.partition < PARTITIONS for o in key_owned))
        both = [a.client.owns(f"key-{i}").owns + b.client.owns(f"key-{i}").owns for i in range(32)]
        self.assertTrue(all(count <= 1 for count in both), "a key owned by both members at once")
        a_events.close()
        b_events.close()

    def test_bad_input_gets_a_clear_error(self) -> None:
        a = self.start("a")
        with self.assertRaises(tenure.SidecarError):
            a.client.endpoint.json("POST", "/release?partition=x")
        self.assertFalse(a.client.release(PARTITIONS + 5, 1), "nothing to release")


if __name__ == "__main__":
    unittest.main()
