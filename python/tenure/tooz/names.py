"""The Tooz driver's name codec: every name Tooz accepts, as a Tenure safe name and back.

Why a module of its own: the mapping must be injective and is what every store object of the
driver is named by, so it is written once, here, and tested without Tooz (it does not import it).

Every name Tooz accepts (group ids, member ids, lock names: bytes, or str taken as UTF-8) works on
every store, and comes back as the caller's bytes. Why an encoding at all: store objects are named
by "safe names" (``[a-z0-9]([a-z0-9-]*[a-z0-9])?``, at most 40 characters, so that a Kubernetes
object name with its prefix stays within 63 characters and a file name within 255 bytes), and Tooz
names are any bytes (``cinder-<uuid>-delete_volume``, ``host1@lvm``, upper case).
:func:`encode_name` is the one place that maps a name to its safe name, injectively:

- a name that is a safe name already is used as is (unless it looks like one of the two forms
  below: then it is encoded too, so that decoding stays unambiguous);
- else ``"x-" + hex`` of its bytes when that fits (names up to 19 bytes);
- else ``"h-"`` and 38 base32 characters of its SHA-256 (190 bits). The full name travels with
  it (:func:`full_form`) and is checked where it is read back (:func:`full_name`): a member's in
  its record (next to its capabilities), a group's in the group's record, a leader's as the holder
  of the election (``--holder``, the member id's ``x-`` hex form, which has no length limit but
  :data:`MAX_MEMBER_ID`). A lock name is never read back: two lock names share a lock only if
  their SHA-256 share 190 bits.

Names that differ only in case or in encoding are different bytes, hence different objects. A name
that is not bytes or str raises TypeError, as Tooz's drivers do; an empty name, or a member id
longer than :data:`MAX_MEMBER_ID` bytes, :class:`BadName` (the driver raises it as
:class:`tooz.ToozError`).
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any, Optional, Union

from .._errors import TenureError

#: Tenure's safe names.
SAFE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")
_ENCODED = re.compile(r"x-((?:[0-9a-f]{2})+)\Z")
_HASHED = re.compile(r"h-[a-z2-7]{38}\Z")
#: The longest safe name ``tenure coordinate`` takes: a Kubernetes object name is at most 63
#: characters, and ``PREFIX-election-`` comes before it.
MAX_NAME = 40
#: The longest member id (bytes). Why a limit: the member id is the holder written in every
#: election and lock record and sent on the child's command line, in hex (``tenure coordinate
#: --holder`` takes 4,200 characters); Tooz's memcached driver takes 250-byte keys in all.
MAX_MEMBER_ID = 2048


class BadName(TenureError, ValueError):
    """A name Tenure cannot store: empty, a member id over :data:`MAX_MEMBER_ID` bytes, or a
    hashed name whose record does not carry it."""


def as_bytes(name: Union[bytes, str]) -> bytes:
    """A Tooz name as bytes; TypeError for what is neither bytes nor str, as Tooz's drivers
    raise (``bytes(5)`` would otherwise be five zero bytes)."""
    if isinstance(name, str):
        return name.encode("utf-8")
    if isinstance(name, (bytes, bytearray, memoryview)):
        return bytes(name)
    raise TypeError(f"a Tooz name is bytes or str, not {type(name).__name__}")


def _nonempty(name: Union[bytes, str], what: str) -> bytes:
    raw = as_bytes(name)
    if not raw:
        raise BadName(f"an empty {what} cannot be used with tenure")
    return raw


def _safe_as_is(raw: bytes) -> Optional[str]:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if SAFE_NAME.match(text) and not _ENCODED.match(text) and not _HASHED.match(text):
        return text
    return None


def full_form(name: Union[bytes, str]) -> str:
    """The ``x-`` hex form of a name, reversible at any length: how a hashed name's full name
    travels (read back by :func:`full_name`)."""
    return "x-" + as_bytes(name).hex()


def encode_name(name: Union[bytes, str], what: str = "name") -> str:
    """The safe name Tenure stores a Tooz ``name`` under (see the module's documentation);
    :class:`BadName` for an empty name."""
    raw = _nonempty(name, what)
    text = _safe_as_is(raw)
    if text is not None and len(text) <= MAX_NAME:
        return text
    encoded = full_form(raw)
    return encoded if len(encoded) <= MAX_NAME else hashed_name(raw)


def hashed_name(raw: bytes) -> str:
    """The ``h-`` form of a name too long for the others: 190 bits of its SHA-256."""
    digest = base64.b32encode(hashlib.sha256(raw).digest()).decode("ascii").lower()
    return "h-" + digest[:38]


def is_hashed(text: str) -> bool:
    """Whether a safe name is the hash of a name (whose full form travels apart)."""
    return bool(_HASHED.match(text))


def holder_name(name: Union[bytes, str]) -> str:
    """The reversible form of a member id, of any length up to :data:`MAX_MEMBER_ID` bytes:
    what elections report as their leader (``tenure coordinate --holder``)."""
    raw = _nonempty(name, "member id")
    if len(raw) > MAX_MEMBER_ID:
        raise BadName(
            f"the member id {raw[:40]!r}... is {len(raw)} bytes: tenure takes member ids of at most"
            f" {MAX_MEMBER_ID} bytes (the id is the holder written in every election and lock record)"
        )
    text = _safe_as_is(raw)
    return text if text is not None else full_form(raw)


def decode_name(text: str) -> bytes:
    """The Tooz name (bytes) behind a safe name or a holder Tenure reports. A hashed name has no
    decoding: its full form is read from where it travels (see the module's documentation)."""
    match = _ENCODED.match(text)
    if match:
        return bytes.fromhex(match.group(1))
    return text.encode("utf-8")


def full_name(text: str, full: Any, what: str) -> bytes:
    """The name behind the safe name ``text``, given the full form ``full`` that travelled with
    it (an ``x-`` hex string, or None): checked against ``text``, so that a record never answers
    for another name. :class:`BadName` when it does not match."""
    if not is_hashed(text):
        return decode_name(text)
    raw = decode_name(full) if isinstance(full, str) and _ENCODED.match(full) else None
    if raw is None or encode_name(raw) != text:
        raise BadName(f"the {what} stored as {text!r} does not carry its full name (found {full!r})")
    return raw
