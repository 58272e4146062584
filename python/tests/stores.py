"""Real stores for the tests that must run on all four (file, etcd, ZooKeeper, Kubernetes).

Why here: the names corpus of issue 32 must pass on every store the Tooz driver serves, so the
tests start etcd and ZooKeeper from Debian's packages and the project's own Kubernetes API server
(`tenure apiserver`) on free loopback ports, once per test run, and stop them at exit. Outside CI
a missing server skips its store; with CI=true it is a failure.
"""

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from typing import Callable, Dict, List, Optional

_servers: List["subprocess.Popen[bytes]"] = []
_scratch = tempfile.mkdtemp(prefix="tenure-stores-")
_urls: Dict[str, Optional[str]] = {}
_why: Dict[str, str] = {}


def _stop() -> None:
    for server in _servers:
        server.kill()
        server.wait()
    shutil.rmtree(_scratch, ignore_errors=True)


atexit.register(_stop)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(ready: Callable[[], bool], server: "subprocess.Popen[bytes]", what: str, timeout: float = 60.0) -> None:
    """Polls ``ready`` until it holds (a server starting up has no other signal)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        if server.poll() is not None:
            raise RuntimeError(f"{what} exited with {server.returncode} while starting")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not serve within {timeout} s")
        time.sleep(0.1)


def _start(arguments: List[str], log: str) -> "subprocess.Popen[bytes]":
    with open(os.path.join(_scratch, log), "wb") as out:
        server = subprocess.Popen(arguments, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    _servers.append(server)
    return server


def _etcd() -> str:
    if not os.path.exists("/usr/bin/etcd"):
        raise RuntimeError("/usr/bin/etcd is not installed (apt-get install etcd-server)")
    port, peer = _free_port(), _free_port()
    server = _start(
        [
            "/usr/bin/etcd", "--data-dir", os.path.join(_scratch, "etcd"), "--name", "tests",
            "--listen-client-urls", f"http://127.0.0.1:{port}", "--advertise-client-urls", f"http://127.0.0.1:{port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"tests=http://127.0.0.1:{peer}",
        ],
        "etcd.log",
    )  # fmt: skip
    _wait(lambda: b"true" in urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read(), server, "etcd")
    return f"tenure+etcd://127.0.0.1:{port}/tooz"


def _zookeeper() -> str:
    jars = ["zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-nop.jar"]
    paths = [os.path.join("/usr/share/java", jar) for jar in jars]
    if shutil.which("java") is None or not all(os.path.exists(p) for p in paths[:2]):
        raise RuntimeError("ZooKeeper is not installed (apt-get install libzookeeper-java openjdk-17-jdk-headless)")
    port = _free_port()
    data = os.path.join(_scratch, "zk", "data")
    os.makedirs(data)
    config = os.path.join(_scratch, "zk", "zoo.cfg")
    with open(config, "w") as f:
        f.write(
            f"tickTime=100\ndataDir={data}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n4lw.commands.whitelist=srvr\nminSessionTimeout=200\n"
            "maxSessionTimeout=30000\nmaxClientCnxns=0\n"
        )
    server = _start(
        ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", ":".join(paths),
         "org.apache.zookeeper.server.ZooKeeperServerMain", config],
        "zk.log",
    )  # fmt: skip

    def ready() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"srvr")
            return b"Mode:" in s.makefile("rb").read()

    _wait(ready, server, "ZooKeeper")
    return f"tenure+zookeeper://127.0.0.1:{port}/tooz"


def _kubernetes() -> str:
    import tenure

    kubeconfig = os.path.join(_scratch, "kubeconfig")
    server = _start([tenure.binary(), "apiserver", "--listen", "127.0.0.1:0", "--kubeconfig", kubeconfig], "apiserver.log")
    _wait(lambda: os.path.exists(kubeconfig) and os.path.getsize(kubeconfig) > 0, server, "tenure apiserver")
    os.environ["KUBECONFIG"] = kubeconfig  # the coordinate children read it
    return "tenure+kubernetes://default/tooz"


def _file() -> str:
    directory = os.path.join(_scratch, "file")
    os.makedirs(directory, exist_ok=True)
    return f"tenure+file://{directory}"


_STARTERS: Dict[str, Callable[[], str]] = {"file": _file, "etcd": _etcd, "zookeeper": _zookeeper, "kubernetes": _kubernetes}
#: The stores the Tooz driver serves.
STORES = tuple(_STARTERS)


def url(store: str) -> Optional[str]:
    """The Tooz URL (without options) of a running ``store``, started on first use; None when it
    cannot run here (then :func:`why` says why). With CI=true, a store that cannot start raises."""
    if store not in _urls:
        try:
            _urls[store] = _STARTERS[store]()
        except RuntimeError as error:
            if os.environ.get("CI") == "true":
                raise
            _urls[store], _why[store] = None, str(error)
    return _urls[store]


def why(store: str) -> str:
    """Why ``store`` could not start."""
    return _why.get(store, "")


def fresh_url(store: str, timeout: float) -> str:
    """A Tooz URL on ``store`` that no other test uses (a directory or prefix of its own), with
    the session ``timeout``; skips the calling test when the store cannot run here."""
    import unittest
    import uuid

    base = url(store)
    if base is None:
        raise unittest.SkipTest(f"{store} cannot run here: {why(store)}")
    separator = "/" if store == "file" else "-"
    return f"{base}{separator}{uuid.uuid4().hex[:8]}?timeout={timeout}"
