"""A failing disk, told from a failing target.

A run writes to its folder (the workers' journals, the SQLite store, the downstream's ledger). When
that disk fills or goes away, the failure is the infrastructure's, not the target's: a worker process
that meets it ends quietly with :data:`EXIT_DISK`, and the run names the disk as its cause in the
same words whichever write met it first. Both sides of the fork ask these questions, so they sit
apart from either.
"""

from __future__ import annotations

import errno
import os

# Errors that say the disk the run writes to is full or unusable: infrastructure, not the target.
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
EXIT_DISK = 75  # EX_TEMPFAIL: a worker that ended because the disk failed it


def disk_failed(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk failed: an OS error of :data:`DISK_ERRORS`, a file whose folder
    was removed, or SQLite's own words for it (it reports a full disk as an OperationalError, not
    an OSError)."""
    if isinstance(exc, FileNotFoundError) and exc.filename:
        # A file of the run's folder, and the folder is gone: removed under the run (a cleaner, a
        # user): the infrastructure's failure, which the harness names, not the target's.
        return not os.path.isdir(os.path.dirname(os.fsdecode(exc.filename)))
    if isinstance(exc, OSError):
        return exc.errno in DISK_ERRORS
    return type(exc).__module__ == "sqlite3" and ("disk is full" in str(exc) or "disk I/O" in str(exc))


def disk_failure(exc: BaseException) -> "str | None":
    """The words for how the disk failed, where ``exc`` (or an exception it was raised from) says
    it did: the OS's own (``No space left on device``), SQLite's full disk in the OS's words too, so
    that which write met the failure first (a worker's journal, the store, the harness's probe) does
    not change what the user reads. None for any other failure (a removed folder has its own words)."""
    seen: "BaseException | None" = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_ERRORS:
            return os.strerror(seen.errno)
        if type(seen).__module__ == "sqlite3":
            if "disk is full" in str(seen):
                return os.strerror(errno.ENOSPC)
            if "disk I/O" in str(seen):
                return os.strerror(errno.EIO)
        seen = seen.__cause__
    return None
