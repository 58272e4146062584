"""Throwaway etcd and ZooKeeper servers on free loopback ports, and their request counters.

etcd: /usr/bin/etcd. ZooKeeper: the Debian jars in /usr/share/java (libzookeeper-java), started
with ``ZooKeeperServerMain`` and a config that whitelists the four-letter words (``mntr``).
Both are stopped by ``stop()`` (the callers use ``with``), and by an atexit hook.
"""

import atexit
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

JAVA_DIR = "/usr/share/java"
ZK_JARS = ["zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-nop.jar"]
_LIVE = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cleanup():
    for server in list(_LIVE):
        server.stop()


atexit.register(_cleanup)


class Server:
    def __init__(self):
        self.proc = None
        self.dir = tempfile.mkdtemp(prefix=f"tooz-{self.kind}-")
        self.port = free_port()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def _wait(self, ready, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}; see {self.dir}/server.log")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.kind} not ready in {timeout} s; see {self.dir}/server.log")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self in _LIVE:
            _LIVE.remove(self)
        shutil.rmtree(os.path.join(self.dir, "data"), ignore_errors=True)


class Etcd(Server):
    kind = "etcd"

    def start(self):
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{free_port()}"
        log = open(os.path.join(self.dir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "bench", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"bench={peer}", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _LIVE.append(self)
        self._wait(lambda: b'"health":"true"' in urllib.request.urlopen(f"{client}/health", timeout=2).read(), 30)

    def counters(self):
        """Sums of etcd's gRPC counters (the v3 gateway and gRPC clients both end up there)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        sums = {"grpc_server_handled_total": 0.0, "grpc_server_msg_received_total": 0.0,
                "etcd_server_proposals_committed_total": 0.0}
        by_method = {}
        for line in text.splitlines():
            for name in sums:
                if line.startswith(name + "{") or line.startswith(name + " "):
                    value = float(line.rsplit(" ", 1)[1])
                    sums[name] += value
                    if name == "grpc_server_msg_received_total" and "grpc_method=" in line:
                        method = re.search(r'grpc_method="([^"]+)"', line).group(1)
                        by_method[method] = by_method.get(method, 0.0) + value
        sums["by_method"] = by_method
        return sums


def four_letter_word(port, word, timeout=3):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeper(Server):
    kind = "zookeeper"

    def start(self):
        for jar in ZK_JARS:
            if not os.path.exists(os.path.join(JAVA_DIR, jar)):
                raise RuntimeError(f"{JAVA_DIR}/{jar} is missing (Debian package libzookeeper-java)")
        config = os.path.join(self.dir, "zoo.cfg")
        with open(config, "w") as f:
            f.write(f"tickTime=500\ndataDir={self.dir}/data\nclientPort={self.port}\n"
                    "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=*\n"
                    "minSessionTimeout=1000\nmaxSessionTimeout=60000\nmaxClientCnxns=0\n")
        log = open(os.path.join(self.dir, "server.log"), "wb")
        classpath = ":".join(os.path.join(JAVA_DIR, j) for j in ZK_JARS)
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath,
             "org.apache.zookeeper.server.ZooKeeperServerMain", config],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _LIVE.append(self)
        self._wait(lambda: "Mode:" in four_letter_word(self.port, "srvr"), 60)

    def counters(self):
        text = four_letter_word(self.port, "mntr")
        values = {}
        for line in text.splitlines():
            parts = line.split("\t")
            if len(parts) == 2:
                try:
                    values[parts[0]] = float(parts[1])
                except ValueError:
                    pass
        # every write transaction (and session creation/close) takes the next zxid
        zxid = re.search(r"Zxid: 0x([0-9a-fA-F]+)", four_letter_word(self.port, "srvr"))
        return {"zk_zxid": float(int(zxid.group(1), 16) & 0xFFFFFFFF) if zxid else 0.0,
                "zk_packets_received": values.get("zk_packets_received", 0.0),
                "zk_packets_sent": values.get("zk_packets_sent", 0.0),
                "zk_num_alive_connections": values.get("zk_num_alive_connections", 0.0)}
