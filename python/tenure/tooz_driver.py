"""The Tooz driver's public names (optional: needs ``tooz``), where Tooz's entry points
(``tenure.tooz_driver:TenureDriver``) and applications have always found them.

Why only names: the driver is written by concern in :mod:`tenure.tooz` (the name codec, the URL
grammar, the driver, the lock, the partitioner); this module keeps ``tenure.tooz_driver`` working.
The codec's and the URL grammar's functions here raise :class:`tooz.ToozError`, as the driver does.
"""

from .tooz.driver import LONG_POLL, STOP_TIMEOUT, LeaderElected, Leadership, SessionExpired, TenureDriver
from .tooz.driver import encode_name, full_name, holder_name, store_url
from .tooz.lock import TenureLock
from .tooz.names import MAX_MEMBER_ID, MAX_NAME, SAFE_NAME, decode_name, hashed_name, is_hashed
from .tooz.partitioner import TenurePartitioner
from .tooz.url import DEFAULT_TIMEOUT

__all__ = [
    "DEFAULT_TIMEOUT", "LONG_POLL", "MAX_MEMBER_ID", "MAX_NAME", "SAFE_NAME", "STOP_TIMEOUT", "LeaderElected",
    "Leadership", "SessionExpired", "TenureDriver", "TenureLock", "TenurePartitioner", "decode_name",
    "encode_name", "full_name", "hashed_name", "holder_name", "is_hashed", "store_url",
]  # fmt: skip
