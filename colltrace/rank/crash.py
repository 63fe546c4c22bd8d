"""A rank's native frames (colltrace/rank/_crash.c, built at install where a C compiler is found):
installs the handler that writes them when the rank takes a fatal signal, the C++ terminate
handler that writes the uncaught exception behind an abort, and the stack signal's handler that
writes them while the rank lives. Nothing runs per collective.

Installed once per process, after faulthandler (whose handler it chains to, as to any handler
the program installed before it); a later faulthandler.enable() or signal.signal() on the same
signal replaces it, and then that signal's native frames are not kept (nothing else changes).
"""
from __future__ import annotations

import os
import signal
import sys

try:
    from colltrace.rank import _crash  # type: ignore[attr-defined]  # a C extension: no types mypy can read
except ImportError:   # not built (no C compiler at install): signals and Python frames only
    _crash = None

from colltrace.tracefile import native

FATAL = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
LIVE_WAIT_S = 0.25     # a signal reaches a thread blocked in a system call at once; a busy machine may
                       # schedule it late (the answer returns as soon as it is there: only a poller waits)

_state: dict = {}      # this process's open files: pid -> (native file's path, its fd, the maps' fd); "stack"


def own_handlers() -> list[str]:
    """The fatal signals a handler of the program's (or a library's) already catches, before
    faulthandler's: one of them may let the rank live on, so its native report alone does not
    mean the rank died (tracefile/reader.py waits for the process to go)."""
    import faulthandler

    if _crash is None or faulthandler.is_enabled():
        return []   # what lies under faulthandler cannot be told from here
    return _others()


def taken_over() -> list[str]:
    """The fatal signals whose handler, once colltrace's, is now another's: a program (or library)
    that set its own after colltrace's recorder started at the interpreter's start (rank/early.py)."""
    if _crash is None or os.getpid() not in _state:
        return []
    return _others()


def _others() -> list[str]:
    """The fatal signals whose handler is neither the default, ignored, nor colltrace's own
    (signal.getsignal sees only Python's)."""
    out = []
    for name in FATAL:
        try:
            if _crash.disposition(int(getattr(signal, name))) == 2:
                out.append(name)
        except (AttributeError, ValueError, OSError):
            continue
    return out


def install(directory: str, rank: int, handlers: list[str]) -> dict:
    """After faulthandler.enable(): the fatal signals' handler and the C++ terminate handler.
    Returns the record for the rank's definitions file ({"k": "native", ...})."""
    rec: dict = {"k": "native", "crash": False, "terminate": False, "own_handlers": handlers}
    if _crash is None:
        rec["note"] = "native frames not kept: colltrace's _crash module was not built at install"
        return rec
    if sys.platform != "linux":
        rec["note"] = "native frames not kept: Linux only"
        return rec
    try:
        path = native.native_path(directory, rank)
        old = _state.get(os.getpid())
        if old is None or old[0] != path:   # a process's first recorder, or one writing elsewhere
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
            fd = os.open(path, flags, 0o644)
            maps = old[2] if old is not None else os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
            _state[os.getpid()] = (path, fd, maps)
        _, fd, maps = _state[os.getpid()]
        sigs = tuple(int(getattr(signal, s)) for s in FATAL if hasattr(signal, s))
        _crash.install(fd, maps, sigs)
        rec["crash"] = True
        rec["terminate"] = bool(_crash.install_terminate(fd))
        if old is not None and old[0] != path:
            os.close(old[1])   # the handlers write to the new file from now on
    except (OSError, ValueError) as exc:
        rec["note"] = f"native frames not kept: {exc}"
    return rec


def install_stack(directory: str, rank: int, sig: int | None) -> dict:
    """On colltrace's stack signal (faulthandler's registration, colltrace/tracefile/asks.py),
    the main thread's native frames beside faulthandler's dump. Only where unwinding takes no lock of the
    loader's (glibc >= 2.35): a live rank interrupted while holding it must never wait for it."""
    if _crash is None or not sig or os.getpid() not in _state:
        return {}
    if not _crash.lock_free_unwind():
        return {"native_stack": False, "native_stack_note": "glibc < 2.35: unwinding a live rank could wait on the "
                                                             "loader's lock the rank holds"}
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
        fd = os.open(native.native_stack_path(directory, rank), flags, 0o644)
        _crash.install_stack(int(sig), fd)
    except (OSError, ValueError) as exc:
        return {"native_stack": False, "native_stack_note": str(exc)}
    old = _state.get("stack")
    if isinstance(old, int) and old != fd:
        os.close(old)
    _state["stack"] = fd
    return {"native_stack": True}


def main_stack(ident: int) -> list[dict] | None:
    """The native frames of thread `ident` (the main thread), asked from the rank's own poller
    thread: raw frames ({"address", "pc", "offset", "inode", "path"}), innermost first, named by
    the watchdog; None where it cannot be had."""
    if _crash is None or _state.get("stack") is None:
        return None
    try:
        addrs = _crash.main_stack(int(ident), LIVE_WAIT_S)
    except (OSError, ValueError, OverflowError):
        return None
    if not addrs:
        return None
    rows = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 5:
                    continue
                start, end = (int(x, 16) for x in parts[0].split("-"))
                rows.append((start, end, int(parts[2], 16), int(parts[4]), parts[5].strip() if len(parts) > 5 else ""))
    except (OSError, ValueError):
        return None
    out = []
    for i, a in enumerate(addrs):
        hit = next((r for r in rows if r[0] <= a < r[1]), None)
        out.append({"address": a, "pc": i == 0, "offset": a - hit[0] + hit[2] if hit else None,
                    "inode": hit[3] if hit else None, "path": (hit[4] or None) if hit else None})
    return out
