"""Issue 32: every name OpenStack services give Tooz works on every store the Tenure driver serves.

A corpus of real names, each with where its pattern comes from, run on the file store, etcd,
ZooKeeper and Kubernetes (`tenure apiserver`): exact round trips (get_members, get_leader,
get_groups, capabilities give back the caller's bytes), different names never share a store
object (names that differ only in case or encoding, safe names that look encoded or hashed),
Tooz's own rejections and the driver's one limit. Skipped without tooz; a store that cannot run
here skips (fails with CI=true).
"""

import unittest
import uuid
from typing import Any, List, Tuple

import stores

try:
    import tooz
    import tooz.coordination
    from tenure import tooz_driver
except ImportError:  # tooz is an optional dependency
    tooz = None  # type: ignore[assignment]

TIMEOUT = 4  # seconds: the session TTL of the coordinators here

_VOLUME = str(uuid.UUID("5a7d8f3e-1c2b-4d6e-9f80-a1b2c3d4e5f6"))
_NODE = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123"

#: Member ids, with where their pattern comes from.
MEMBERS: List[Tuple[bytes, str]] = [
    # cinder/coordination.py: Coordinator(prefix='cinder-'), member id prefix + agent_id (a uuid4).
    (b"cinder-" + _VOLUME.encode(), "cinder/coordination.py"),
    # Cinder's volume service host@backend (issue 32: `host1@lvm`), with a pool and an FQDN.
    (b"host1@lvm", "cinder host@backend (issue 32)"),
    (b"controller-0.localdomain@tripleo_ceph#pool0", "cinder host@backend#pool"),
    # designate/coordination.py: ':'.join([CONF.host, uuidutils.generate_uuid()]).encode().
    (b"ns1.example.org:" + _NODE.encode(), "designate/coordination.py"),
    # ironic_inspector/common/coordination.py: '.'.join(['ironic_inspector', prefix, CONF.host]).
    (b"ironic_inspector.conductor.controller-0.localdomain", "ironic_inspector/common/coordination.py"),
    # networking-ansible (ml2 driver): '{}-{}'.format(CONF.host, os.getpid()).
    (b"compute-1.example.com-12345", "networking-ansible ml2 driver"),
    # st2common/services/coordination.py: '%s_%d' % (hostname, pid).
    (b"st2-node1_4242", "st2common/services/coordination.py"),
    # delfin/coordination.py: agent_id=CONF.host, no prefix; upper case as hostnames come.
    (b"CONTROLLER-0", "delfin/coordination.py (CONF.host)"),
    # A host name of the longest FQDN length (253), as CONF.host may be.
    (b".".join([b"a" * 63, b"b" * 63, b"c" * 63, b"d" * 61]), "FQDN of 253 characters"),
    # Names that differ from others only in case or in encoding, and safe names that look like
    # the driver's own encoded or hashed forms.
    (b"Host1@lvm", "case twin of host1@lvm"),
    ("é".encode("utf-8"), "UTF-8"),
    ("é".encode("latin-1"), "Latin-1 twin"),
    (b"x-00", "looks hex-encoded"),
    (b"h-" + b"a" * 38, "looks hashed"),
]

#: Group ids.
GROUPS: List[Tuple[bytes, str]] = [
    # Heat: 57 bytes (issue 32).
    (b"heat-engine-listener-" + _VOLUME.encode(), "heat (issue 32)"),
    # ironic_inspector/common/coordination.py: '.'.join(['ironic_inspector', 'service_group']).
    (b"ironic_inspector.service_group", "ironic_inspector/common/coordination.py"),
    # delfin/coordination.py: ConsistentHashing.GROUP_NAME.
    (b"partitioner_group", "delfin/coordination.py"),
    # gnocchi/cli/metricd.py: GROUP_ID, bytes.
    (b"gnocchi-processing", "gnocchi/cli/metricd.py"),
    # ceilometer/notification.py: NOTIFICATION_NAMESPACE partitioned group.
    (b"ceilometer.notification.v2", "ceilometer/notification.py"),
    # designate/coordination.py: the service name, e.g. the producer.
    (b"designate.producer", "designate/coordination.py"),
    # Upper case, and its twin.
    (b"Central-Global", "case twin"),
    (b"central-global", "ceilometer polling source group"),
]

#: Lock names.
LOCKS: List[Tuple[bytes, str]] = [
    # cinder/coordination.py (prefix 'cinder-') + cinder/volume/manager.py
    # @coordination.synchronized('{volume.id}-{f_name}') on delete_volume.
    (b"cinder-" + _VOLUME.encode() + b"-delete_volume", "cinder/volume/manager.py"),
    (b"cinder-" + _VOLUME.upper().encode() + b"-delete_volume", "case twin"),
    # Octavia (issue 32).
    (b"octavia:amphora-health", "octavia (issue 32)"),
    # Designate (issue 32).
    (b"designate.zone." + _NODE.encode(), "designate (issue 32)"),
    # Ironic (issue 32).
    (b"ironic-conductor_node-42", "ironic (issue 32)"),
    # ironic_inspector/common/coordination.py: lock_prefix 'ironic_inspector.' + node uuid.
    (b"ironic_inspector." + _NODE.encode(), "ironic_inspector/common/coordination.py"),
    # delfin/coordination.py: prefix 'delfin-'.
    (b"delfin-storage-" + _NODE.encode(), "delfin/coordination.py"),
    # Binary, with a slash and a NUL: no store path may split on it.
    (b"a/b\x00c\xff", "binary"),
    # Long: past a file name (255 bytes) and a Kubernetes name (253).
    (b"lock-" + b"z" * 1000, "1,005 bytes"),
]

#: Capabilities as services publish them.
CAPABILITIES: Any = {"host": "controller-0", "backend": "lvm", "pools": ["pool0"], "note": "é", "weight": 1}


def _store_test(store: str) -> Any:
    @unittest.skipIf(tooz is None, "tooz is not installed (pip install tenure[tooz])")
    class NamesOnStore(unittest.TestCase):
        url = ""

        @classmethod
        def setUpClass(cls) -> None:
            cls.url = stores.fresh_url(store, TIMEOUT)

        def coordinator(self, member: bytes) -> Any:
            coordinator = tooz.coordination.get_coordinator(self.url, member)
            coordinator.start()
            self.addCleanup(coordinator.stop)
            return coordinator

        def test_member_ids_round_trip_with_capabilities_and_as_leader(self) -> None:
            group = GROUPS[0][0]
            coordinators = [(member, self.coordinator(member)) for member, _ in MEMBERS]
            coordinators[0][1].create_group(group).get()
            for member, coordinator in coordinators:
                coordinator.join_group(group, {**CAPABILITIES, "member": member.hex()}).get()
            reader = coordinators[0][1]
            self.assertEqual(reader.get_members(group).get(), {member for member, _ in MEMBERS})
            for member, _ in MEMBERS:
                self.assertEqual(reader.get_member_capabilities(group, member).get(), {**CAPABILITIES, "member": member.hex()})
            # Each member leads an election of its own; another coordinator reads the leader.
            for index, (member, coordinator) in enumerate(coordinators):
                election = b"election-" + str(index).encode()
                elected: List[Any] = []
                coordinator.watch_elected_as_leader(election, elected.append)
                coordinator.run_watchers()
                self.assertEqual([(e.group_id, e.member_id) for e in elected], [(election, member)])
                self.assertEqual(reader.get_leader(election).get(), member, member)
                coordinator.unwatch_elected_as_leader(election, elected.append)
            for member, coordinator in coordinators:
                coordinator.leave_group(group).get()
            self.assertEqual(reader.get_members(group).get(), set())

        def test_group_ids_round_trip_and_twins_are_two_groups(self) -> None:
            coordinator = self.coordinator(b"host1@lvm")
            for group, _ in GROUPS:
                coordinator.create_group(group).get()
            self.assertEqual(set(coordinator.get_groups().get()) & {g for g, _ in GROUPS}, {g for g, _ in GROUPS})
            coordinator.join_group(GROUPS[-2][0]).get()
            self.assertEqual(coordinator.get_members(GROUPS[-2][0]).get(), {b"host1@lvm"})
            self.assertEqual(coordinator.get_members(GROUPS[-1][0]).get(), set())
            with self.assertRaises(tooz.coordination.GroupAlreadyExist):
                coordinator.create_group(GROUPS[0][0]).get()
            coordinator.leave_group(GROUPS[-2][0]).get()
            for group, _ in GROUPS:
                coordinator.delete_group(group).get()

        def test_lock_names_are_distinct_locks(self) -> None:
            first, second = self.coordinator(b"host1@lvm"), self.coordinator(b"Host1@lvm")
            held = []
            for name, source in LOCKS:
                lock = first.get_lock(name)
                self.assertTrue(lock.acquire(blocking=False), source)
                held.append(lock)
                self.assertFalse(second.get_lock(name).acquire(blocking=False), source)
            # Each name is a lock of its own (twins included: each was free when the first
            # coordinator took it); the second coordinator takes each once the first released it.
            for lock in held:
                self.assertTrue(lock.release())
            for name, source in LOCKS:
                lock = second.get_lock(name)
                self.assertTrue(lock.acquire(blocking=False), source)
                self.assertTrue(lock.release())

        def test_what_tooz_rejects_and_the_member_id_limit(self) -> None:
            with self.assertRaises(TypeError):
                tooz.coordination.get_coordinator(self.url, b"m").get_lock(42)  # type: ignore[arg-type]
            with self.assertRaises(tooz.ToozError) as raised:
                tooz.coordination.get_coordinator(self.url, b"m" * (tooz_driver.MAX_MEMBER_ID + 1))
            self.assertIn(str(tooz_driver.MAX_MEMBER_ID), str(raised.exception))
            with self.assertRaises(tooz.ToozError):
                self.coordinator(b"empty-group").create_group(b"").get()

    NamesOnStore.__name__ = NamesOnStore.__qualname__ = f"NamesOn{store.capitalize()}"
    return NamesOnStore


NamesOnFile = _store_test("file")
NamesOnEtcd = _store_test("etcd")
NamesOnZookeeper = _store_test("zookeeper")
NamesOnKubernetes = _store_test("kubernetes")
