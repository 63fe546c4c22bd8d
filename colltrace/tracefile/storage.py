"""Writes to the trace folder that may fail (a full disk, a quota): preallocation, and the one
warning line that says colltrace stepped aside.

A shared file mapping over a sparse file faults (SIGBUS) when a page cannot be allocated, so
every mapped file is fully allocated before it is mapped. Any other write that fails is
caught by its caller and reported once through `warn_once`; none is fatal to the program.
"""
from __future__ import annotations

import errno
import os
import sys
import threading

_CHUNK = 1 << 20
_warned: set[str] = set()
_lock = threading.Lock()


class StorageError(OSError):
    """The trace folder cannot hold what colltrace must write; str() is the user's line."""


def preallocate(fd: int, size: int) -> None:
    """Give the file `size` bytes of real blocks (not a hole); raises OSError (ENOSPC, EDQUOT)."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except AttributeError:   # not on this platform
        pass
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    # The file system cannot fallocate: write the zeros (allocation failures surface here as ENOSPC).
    zeros = bytes(min(_CHUNK, size))
    done = 0
    while done < size:
        done += os.pwrite(fd, zeros[:min(_CHUNK, size - done)], done)


def describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return repr(exc)


def warn_once(key: str, text: str, stream=None) -> bool:
    """Write `colltrace: warning: text` once per key in this process; True if it was written."""
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
    try:
        (stream or sys.stderr).write(f"colltrace: warning: {text}\n")
        (stream or sys.stderr).flush()
    except Exception:   # a closed or broken stderr: the warning is lost, never the caller
        pass
    return True
