"""The Tooz driver's URL grammar (``tenure+KIND://...`` to the child's lock URL, and the options):
the Python counterpart of the CLI's lock URLs, apart from the driver so that it is read and tested
without Tooz (it does not import it). The driver raises its :class:`BadURL` as ``tooz.ToozError``."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

from .._errors import TenureError

#: ``timeout`` (seconds) when the URL gives none: the session's TTL in the child.
DEFAULT_TIMEOUT = 10.0


class BadURL(TenureError, ValueError):
    """A Tooz URL or option the driver cannot use."""


def store_url(parsed_url: Any) -> Tuple[str, bool]:
    """The child's ``--lock`` base URL for a Tooz URL (``tenure+KIND://...``, as Tooz parsed it),
    and whether the store is shared across hosts."""
    scheme = str(parsed_url.scheme)
    kind = scheme.split("+", 1)[1] if "+" in scheme else ""
    netloc = str(parsed_url.netloc or "")
    path = str(parsed_url.path or "")
    if kind == "file":
        if netloc not in ("", "localhost") or not path.startswith("/"):
            raise BadURL(f"a {scheme} URL is {scheme}:///absolute/directory, not {parsed_url.geturl()!r}")
        return "file://" + path, False
    if kind in ("etcd", "zookeeper"):
        if not netloc:
            raise BadURL(f"a {scheme} URL is {scheme}://host:port[,host:port]/prefix, not {parsed_url.geturl()!r}")
        prefix = path.rstrip("/") or "/tooz"
        return ("etcd://" if kind == "etcd" else "zk://") + netloc + prefix, True
    if kind == "kubernetes":
        prefix = path.strip("/")
        if not netloc or not prefix or "/" in prefix:
            raise BadURL(f"a {scheme} URL is {scheme}://NAMESPACE/PREFIX, not {parsed_url.geturl()!r}")
        return f"kube://{netloc}/leases/{prefix}", True
    raise BadURL(f"unknown tenure backend {scheme!r}: tenure+file, tenure+etcd, tenure+zookeeper or tenure+kubernetes")


def _option(options: Mapping[str, Any], name: str) -> Optional[str]:
    """The option ``name`` as text, the last if given more than once."""
    value = options.get(name)
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else None
    return None if value is None else str(value)


def session_timeout(options: Mapping[str, Any]) -> float:
    """The ``timeout`` option (seconds, the last if given more than once; default
    :data:`DEFAULT_TIMEOUT`): the session's TTL."""
    timeout = _option(options, "timeout")
    if timeout is None:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(timeout)
    except ValueError:
        raise BadURL(f"timeout is a number of seconds, not {timeout!r}") from None
    if not seconds > 0:
        raise BadURL(f"timeout must be positive, not {timeout!r}")
    return seconds


def coordination(options: Mapping[str, Any]) -> List[str]:
    """The child's flags for Kubernetes' Coordinated Leader Election of the elections (not the
    locks): ``coordinated=1`` (or ``true``), with ``binary_version`` and ``emulation_version``
    (``MAJOR.MINOR[.PATCH]``, checked by the child); during a rolling upgrade the API server's
    coordinator keeps leadership on the oldest version."""
    flag = (_option(options, "coordinated") or "").lower()
    versions = [(name, _option(options, name)) for name in ("binary_version", "emulation_version")]
    if flag in ("", "0", "false", "no"):
        if any(value is not None for _, value in versions):
            raise BadURL("binary_version and emulation_version need coordinated=1")
        return []
    if flag not in ("1", "true", "yes"):
        raise BadURL(f"coordinated is 1 or 0, not {flag!r}")
    flags = ["--coordinated"]
    for name, value in versions:
        if value is not None:
            flags += ["--" + name.replace("_", "-"), value]
    return flags


def duration(seconds: float) -> str:
    """``seconds`` as a CLI duration (``10s``, ``1500ms``)."""
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{int(round(seconds * 1000))}ms"
