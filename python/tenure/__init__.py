"""Tenure for Python: leader election and Active/Active work sharing through the ``tenure``
sidecar, with the standard library only.

The wheel puts the ``tenure`` command on the virtualenv's ``PATH``; this package is the client an
application writes by hand otherwise:

* :class:`Sidecar` (``tenure elect --http``): who leads, pushed changes, and :meth:`Sidecar.lead`,
  a :class:`Tenure` held while the leader works (self-fencing on this host's clock; a graceful
  release waits until the work has stopped);
* :class:`Member` (``tenure member --http``): which keys this replica owns, pushed assignment
  changes, and the release of a draining partition;
* :func:`elect` and :func:`member`: the sidecar as a child process of the application;
* :func:`write_fenced`: a write the file lock refuses once the writer's tenure is over.

Every exception the package defines derives from :class:`TenureError`.
"""

from ._errors import TenureError
from ._http import BadAddress, SidecarError
from .elect import Leadership, LeadTimeout, NotLeading, Sidecar, Status, Tenure
from .member import DRAINING, LOST, OWNED, Assignment, Member, Owns, Partition, StillAssigned
from .process import BinaryNotFound, Deposed, Process, StartError, WriteFailed, binary, elect, member, write_fenced

__all__ = [
    "DRAINING",
    "LOST",
    "OWNED",
    "Assignment",
    "BadAddress",
    "BinaryNotFound",
    "Deposed",
    "LeadTimeout",
    "Leadership",
    "Member",
    "NotLeading",
    "Owns",
    "Partition",
    "Process",
    "Sidecar",
    "SidecarError",
    "StartError",
    "Status",
    "StillAssigned",
    "Tenure",
    "TenureError",
    "WriteFailed",
    "binary",
    "elect",
    "member",
    "write_fenced",
]
