"""What keeps the daemon's secrets inside it: a non-dumpable process, a private state dir.

A leaf: stdlib only, so the store and the state-dir lock can use it.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_non_dumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``, as ssh-agent does: no process of the same user
    (a tool's child, for one) may then read ``/proc/<pid>/environ`` or ``mem``, attach
    with ptrace, or get a core dump; only a process with ``CAP_SYS_PTRACE`` can.
    Programs we start get a dumpable process again when they exec: only we are hidden.
    Returns False where that is not possible (not Linux, no libc prctl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            return False
        return bool(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def make_private(path: Path, mode: int) -> None:
    """Give an existing ``path`` exactly ``mode`` (a pre-existing dir or file keeps
    whatever the umask of its creator gave it otherwise). Missing paths are skipped."""
    try:
        if path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)
    except FileNotFoundError:
        return
    except PermissionError:
        log.warning("cannot make %s private (chmod %o): not its owner", path, mode)


def release_free_memory() -> bool:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim(0)``).

    After a flood of large request bodies the daemon's own objects are gone, but glibc
    keeps the freed arenas mapped, so the resident size stays up for good. Costs a few
    milliseconds: call it off the event loop, and only after such a peak. False where
    there is no glibc."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    return bool(trim(0))
