"""HTTP and Server-Sent Events with the standard library only (``http.client``).

Why our own: the sidecars speak plain HTTP/1.1 on loopback, and a dependency-free package installs
anywhere Python does; ``urllib.request`` would do for single requests but cannot follow a stream
line by line with an idle timeout, which is what an application that must stop work on a frozen
sidecar needs.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any, Iterator, Optional, Tuple

from ._errors import TenureError


class SidecarError(TenureError, OSError):
    """The sidecar could not be reached, went silent, or answered something unexpected."""


class BadAddress(TenureError, ValueError):
    """A sidecar address that is not ``http://host:port``."""


class Endpoint:
    """One sidecar's address (``http://host:port``), and the requests made to it."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme != "http" or not parsed.hostname:
            raise BadAddress(f"a sidecar address is http://host:port, not {url!r}")
        try:
            port = parsed.port or 80
        except ValueError as error:
            raise BadAddress(f"a sidecar address is http://host:port, not {url!r}: {error}") from None
        self.host: str = parsed.hostname
        self.port: int = port
        self.timeout = timeout
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}"

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout if timeout is None else timeout)

    def request(
        self, method: str, path: str, timeout: Optional[float] = None, body: Optional[bytes] = None
    ) -> Tuple[int, bytes]:
        """The status and body of one request (``body``, if any, is sent as JSON)."""
        connection = self._connect(timeout)
        try:
            if body is None:
                connection.request(method, path)
            else:
                connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as error:
            raise SidecarError(f"{method} {self.url}{path}: {error}") from error
        finally:
            connection.close()

    def json(self, method: str, path: str, timeout: Optional[float] = None, ok: Tuple[int, ...] = (200,)) -> Any:
        """The JSON body of a request that must answer one of ``ok``."""
        status, body = self.request(method, path, timeout)
        if status not in ok:
            text = body.decode("utf-8", "replace").strip()
            raise SidecarError(f"{method} {self.url}{path} answered {status}: {text}")
        try:
            return json.loads(body)
        except ValueError as error:
            raise SidecarError(f"{method} {self.url}{path} answered malformed JSON: {error}") from None

    def open_stream(self, path: str, idle_timeout: float) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A streaming ``GET`` whose reads fail after ``idle_timeout`` seconds of silence."""
        connection = self._connect(idle_timeout)
        try:
            connection.request("GET", path, headers={"Accept": "text/event-stream"})
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise SidecarError(f"GET {self.url}{path}: {error}") from error
        if response.status != 200:
            text = response.read().decode("utf-8", "replace").strip()
            connection.close()
            raise SidecarError(f"GET {self.url}{path} answered {response.status}: {text}")
        return connection, response

    def events(self, path: str, idle_timeout: float) -> Iterator[Any]:
        """The JSON data of each Server-Sent Event on ``path``. Raises :class:`SidecarError` when
        the stream ends or stays silent for ``idle_timeout`` (the sidecars send a comment line
        every 15 s, so a longer silence means a sidecar that is gone or frozen)."""
        connection, response = self.open_stream(path, idle_timeout)
        try:
            data = []
            while True:
                try:
                    line = response.readline()
                except (OSError, http.client.HTTPException) as error:
                    raise SidecarError(f"the event stream of {self.url}{path} broke: {error}") from error
                if not line:
                    raise SidecarError(f"the event stream of {self.url}{path} closed")
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                if text.startswith("data:"):
                    data.append(text[5:].lstrip())
                elif text == "" and data:
                    try:
                        yield json.loads("\n".join(data))
                    except ValueError as error:
                        raise SidecarError(f"malformed event from {self.url}{path}: {error}") from None
                    data = []
        finally:
            connection.close()


class Client:
    """What both sidecar clients share: the address, and the requests made to it."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        #: Where requests go; ``timeout`` bounds each one.
        self.endpoint = Endpoint(url, timeout)

    @property
    def url(self) -> str:
        """The sidecar's address."""
        return self.endpoint.url
