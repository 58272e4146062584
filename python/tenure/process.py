"""Run a ``tenure`` sidecar as a child of this Python process.

Why: an application that is not in a pod (no sidecar container) still wants the elector next to
it, started and stopped with it. :func:`elect` and :func:`member` start ``tenure elect`` or
``tenure member`` with ``--http`` on a free loopback port, wait until it serves, and give back a
:class:`Process` with the matching client; leaving the ``with`` block stops it gracefully
(SIGTERM: the lock is released, after any held :class:`~tenure.elect.Tenure` is closed).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from typing import Deque, Dict, Generic, List, Optional, Sequence, TypeVar, Union

from . import _http
from ._errors import TenureError
from .elect import Sidecar
from .member import Member

Client = TypeVar("Client", bound=_http.Client)

#: How long a sidecar may take to serve after it was started.
START_TIMEOUT = 30.0


class StartError(TenureError, RuntimeError):
    """The sidecar exited or did not serve in time; the message ends with its last log lines."""


class BinaryNotFound(TenureError, FileNotFoundError):
    """No ``tenure`` executable: neither ``$TENURE_BIN``, nor the wheel's, nor one on ``PATH``."""


class WriteFailed(TenureError, RuntimeError):
    """``tenure write`` failed otherwise than by refusing a deposed writer; nothing was written."""


class Deposed(TenureError, RuntimeError):
    """A write fenced by the lock was refused: the tenure of its term is over (another holder
    leads, or the lock was released). Nothing was written; do not retry under this term."""


#: The exit status of ``tenure write`` when the lock refused a deposed writer.
DEPOSED_EXIT = 3


def write_fenced(
    path: str, data: bytes, *, election: str, term: int, lock: Optional[str] = None, timeout: float = 30.0
) -> None:
    """Replaces the file ``path`` with ``data`` only while the lock of ``election`` still shows
    the tenure of ``term`` (``tenure write``): the lock itself refuses the write of a deposed
    leader, even one paused between its last check and this call. File, etcd and ZooKeeper locks
    (``lock`` is their URL, or the election's default file); on etcd ``path`` is a key, on
    ZooKeeper an absolute node path. Raises :class:`Deposed` when refused,
    :class:`WriteFailed` on any other failure; in both cases nothing was written."""
    command = [binary(), "write", "--election", election, "--term", str(term)]
    if lock is not None:
        command += ["--lock", lock]
    command += ["--", path]
    result = subprocess.run(command, input=data, capture_output=True, timeout=timeout, check=False)
    message = result.stderr.decode("utf-8", "replace").strip()
    if result.returncode == DEPOSED_EXIT:
        raise Deposed(message)
    if result.returncode != 0:
        raise WriteFailed(f"tenure write exited with {result.returncode}: {message}")


def binary() -> str:
    """The ``tenure`` executable: ``$TENURE_BIN``, else the one this package's wheel installed
    next to the interpreter, else the first on ``PATH``."""
    explicit = os.environ.get("TENURE_BIN")
    if explicit:
        return explicit
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(directory, "tenure")
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("tenure")
    if found is None:
        raise BinaryNotFound("no tenure executable: install the tenure wheel, or set TENURE_BIN")
    return found


class Process(Generic[Client]):
    """A running ``tenure`` sidecar and its client (:attr:`client`)."""

    def __init__(
        self,
        arguments: Sequence[str],
        client: "type[Client]",
        env: Optional[Dict[str, str]] = None,
        stdin_pipe: bool = False,
    ) -> None:
        """Starts ``tenure ARGUMENTS --http 127.0.0.1:0 --log-format json``. ``stdin_pipe``: the
        child's stdin is a pipe from this process that is never written, so that its end of file
        tells the child this process is gone (with ``--stdin-lifeline``, ``tenure coordinate``
        then releases everything and ``tenure member`` leaves its group)."""
        command = [binary(), *arguments, "--http", "127.0.0.1:0", "--log-format", "json"]
        environment = dict(os.environ if env is None else env)
        environment.setdefault("RUST_LOG", "info")
        self._log: Deque[str] = collections.deque(maxlen=200)
        self._address: Optional[str] = None
        self._serving = threading.Event()
        self.popen = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=environment,
        )
        threading.Thread(target=self._read_log, name="tenure-log", daemon=True).start()
        if not self._serving.wait(START_TIMEOUT) or self._address is None:
            self.kill()
            raise StartError(f"{' '.join(command)} did not serve HTTP: {self.log_tail()}")
        #: The client of the sidecar's HTTP API.
        self.client: Client = client(f"http://{self._address}")

    def _read_log(self) -> None:
        """Keeps the last log lines and finds the address the sidecar bound."""
        assert self.popen.stderr is not None
        for raw in self.popen.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._log.append(line)
            if self._address is None:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                message = str(event.get("message", "")) if isinstance(event, dict) else ""
                if "over HTTP" in message and event.get("address"):
                    self._address = str(event["address"])
                    self._serving.set()
        self.popen.stderr.close()
        self._serving.set()  # exited: whoever waits learns it at once

    @property
    def pid(self) -> int:
        """The sidecar's process id."""
        return self.popen.pid

    def log_tail(self, lines: int = 10) -> str:
        """The sidecar's last log lines (JSON, one per line)."""
        return "\n".join(list(self._log)[-lines:])

    def signal(self, number: Union[int, signal.Signals]) -> None:
        """Sends a signal if the sidecar is still running."""
        if self.popen.poll() is None:
            self.popen.send_signal(number)

    def step_down(self) -> None:
        """SIGUSR1: a leader releases the lock and stays a candidate; a follower ignores it."""
        self.signal(signal.SIGUSR1)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then waits: the sidecar releases what it holds and exits (SIGKILL after
        ``timeout``). Returns its exit status."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: nothing is released; the lease runs out by itself."""
        self.signal(signal.SIGKILL)
        self.popen.wait()
        self.close_stdin()

    def close_stdin(self) -> None:
        """Closes the child's stdin pipe (``stdin_pipe``): its end of file tells the child to stop."""
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()
            except OSError:
                pass

    def wait(self, timeout: float) -> int:
        """Waits for the child to exit (SIGKILL after ``timeout``); returns its exit status."""
        try:
            status = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            status = self.popen.wait()
        self.close_stdin()
        return status

    def __enter__(self) -> "Process[Client]":
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _options(lock: Optional[str], identity: Optional[str], ttl: Optional[str], extra: Sequence[str]) -> List[str]:
    options = []
    if lock is not None:
        options += ["--lock", lock]
    if identity is not None:
        options += ["--id", identity]
    if ttl is not None:
        options += ["--ttl", ttl]
    return options + list(extra)


def elect(
    election: str,
    lock: Optional[str] = None,
    identity: Optional[str] = None,
    ttl: Optional[str] = None,
    extra: Sequence[str] = (),
) -> Process[Sidecar]:
    """Starts ``tenure elect --election ELECTION`` (``lock`` a lock URL such as
    ``file:///run/app/leader.json`` or ``etcd://host:2379/name``; ``ttl`` such as ``"10s"``;
    ``extra`` more flags) and returns it once it serves."""
    return Process(["elect", "--election", election, *_options(lock, identity, ttl, extra)], Sidecar)


def member(
    group: str,
    lock: Optional[str] = None,
    identity: Optional[str] = None,
    ttl: Optional[str] = None,
    extra: Sequence[str] = (),
) -> Process[Member]:
    """Starts ``tenure member --group GROUP`` and returns it once it serves."""
    return Process(["member", "--group", group, *_options(lock, identity, ttl, extra)], Member)

