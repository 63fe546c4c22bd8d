"""Questions from the watchdog to a rank through the trace folder, answered off the hot path.

The watchdog touches a request file; the rank's poller thread (which wakes every poll period
anyway) sees its mtime change and replaces the answer file atomically. Nothing here imports torch.

Both sides of the two questions meet here, never in each other's packages (docs/design.md,
"Dependency order": rank/ and host/ are peers):
  - every thread's stack: `rank-N.stack-request` -> `rank-N.stack.json` (StackResponder, rank
    side; colltrace/host/probes.py asks), and faulthandler's dump on colltrace's signal into
    `rank-N.stack-signal.txt` (install_signal, rank side);
  - the rank's Flight Recorder: `rank-N.fr-request` -> `rank-N.fr.json` (answered by
    colltrace/rank/flightrecorder.py; request_fr and fr_answered are the watchdog's, and
    untraced_since the reader's half).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from colltrace import origins
from colltrace.tracefile import layout

SIGNAL_OFFSET = 7            # SIGRTMIN+7: a real-time signal programs seldom use
NATIVE_ASK = "native"        # a stack request whose text is this asks for native frames too
# Flight Recorder's dtype names -> torch's short names, as the trace records them
DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
          "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
          "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


class Responder:
    """Rank side: `poll()` from the recorder's poller thread; subclasses say what to answer."""

    def __init__(self, request_path: str, answer_path: str):
        self.req = request_path
        self.out = answer_path
        self.answered = 0

    def answer(self) -> dict:
        raise NotImplementedError

    def poll(self) -> None:
        try:
            asked = os.stat(self.req).st_mtime_ns
        except FileNotFoundError:
            return
        if asked == self.answered:
            return
        self.answered = asked
        data = self.answer()
        tmp = self.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.out)


def _touch(path: str) -> None:
    """Ask: the request file's mtime is the question."""
    with open(path, "a"):
        pass
    os.utime(path, None)


# -- every thread's stack ------------------------------------------------------------------------
def stack_signal() -> int | None:
    try:
        return signal.SIGRTMIN + SIGNAL_OFFSET
    except AttributeError:   # no real-time signals (macOS)
        return None


def stack_request_path(directory: str, rank: int) -> str:
    return layout.rank_file(directory, rank, "stack-request")


def stack_answer_path(directory: str, rank: int) -> str:
    return layout.rank_file(directory, rank, "stack.json")


def stack_signal_path(directory: str, rank: int) -> str:
    return layout.rank_file(directory, rank, "stack-signal.txt")


def install_signal(directory: str, rank: int) -> tuple[dict, object]:
    """Rank side: register faulthandler on colltrace's signal, from the main thread only
    (registering from another thread crashes CPython 3.11 when the signal comes). Left alone where the program
    installed a handler there. chain=False: there is nothing to chain to (we only take a signal
    nobody handles, and chaining to its default action would end the rank), and without chain
    faulthandler sets SA_RESTART, so a system call the signal interrupts is resumed.
    Returns (what goes into the rank's meta line, the open file to keep)."""
    import faulthandler

    sig = stack_signal()
    if sig is None:
        return {"stack_signal": None, "stack_signal_note": "no real-time signals on this platform"}, None
    if threading.current_thread() is not threading.main_thread():
        return {"stack_signal": None, "stack_signal_note": "tracing started outside the main thread"}, None
    try:
        # ignored is not handled: a process whose parent retired the signal at its exit
        # (retire_signal) inherits SIG_IGN, as a child keeps every ignored signal across exec
        if signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN):
            return {"stack_signal": None, "stack_signal_note": f"the program handles signal {sig} itself"}, None
        f = open(stack_signal_path(directory, rank), "a")   # noqa: SIM115 - kept open: faulthandler writes to it
        faulthandler.register(sig, file=f, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError) as exc:
        return {"stack_signal": None, "stack_signal_note": f"not registered: {exc}"}, None
    return {"stack_signal": int(sig), "main_thread": threading.main_thread().ident}, f


def _unregister(ignore_after: bool) -> None:
    """faulthandler lets go of colltrace's signal (putting back what it found); then, if asked,
    the signal is ignored."""
    import faulthandler

    sig = stack_signal()
    if sig is None:
        return
    try:
        faulthandler.unregister(sig)
        if ignore_after:
            signal.signal(sig, signal.SIG_IGN)
    except (ValueError, RuntimeError, TypeError, OSError):
        pass


def retire_signal(f) -> None:
    """At the rank's exit, after its poller stopped: the signal is ignored from now on. Python's
    finalization would put back the action faulthandler found (the default one, which ends the
    process on a real-time signal), and the watchdog may still ask while the rank exits: a rank
    that ended cleanly would die of colltrace's question."""
    if f is None:
        return
    _unregister(ignore_after=True)
    try:
        f.close()
    except OSError:
        pass


def uninstall_signal(f) -> None:
    """Undo install_signal (a rank whose trace could not be started): unregister, close, remove."""
    if f is None:
        return
    _unregister(ignore_after=False)
    try:
        f.close()
        os.unlink(f.name)
    except OSError:
        pass


def _frames_of(frame, limit: int = 128) -> list[dict]:
    out = []
    while frame is not None and limit:
        code = frame.f_code
        out.append({"file": code.co_filename, "line": frame.f_lineno, "func": code.co_name,
                    **origins.code_traits(code)})
        frame = frame.f_back
        limit -= 1
    out.reverse()
    return out


def current_stacks(native=None) -> dict:
    """Every thread's stack (innermost last), but for the caller's own thread. native(ident):
    the main thread's native frames (colltrace/rank/crash.py's main_stack), or None."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        th = {"ident": ident, "name": names.get(ident, str(ident)), "main": ident == main, "frames": _frames_of(frame)}
        if native is not None and ident == main:
            raw = native(ident)
            if raw:
                th["native"] = raw   # raw addresses with their objects: the watchdog names them
        threads.append(th)
    return {"t": time.time(), "threads": threads}


def wants_native(path: str) -> bool:
    """Whether a stack request asks for the main thread's native frames too (its text says so)."""
    try:
        with open(path) as f:
            return f.read(16).startswith(NATIVE_ASK)
    except OSError:
        return False


class StackResponder(Responder):
    """Rank side: answers the watchdog's request with every thread's stack, and the main
    thread's native frames when the request asks for them (`native`: how to take them)."""

    def __init__(self, directory: str, rank: int, native=None):
        super().__init__(stack_request_path(directory, rank), stack_answer_path(directory, rank))
        self.native = native

    def answer(self) -> dict:
        return current_stacks(self.native if self.native is not None and wants_native(self.req) else None)


# -- the rank's Flight Recorder ------------------------------------------------------------------
def fr_request_path(directory: str, rank: int) -> str:
    return layout.rank_file(directory, rank, "fr-request")


def fr_dump_path(directory: str, rank: int) -> str:
    return layout.rank_file(directory, rank, "fr.json")


def request_fr(directory: str, rank: int) -> None:
    """Ask a rank for a dump (watchdog side): the request file's mtime is the question."""
    _touch(fr_request_path(directory, rank))


def fr_answered(directory: str, rank: int) -> bool:
    """Whether the rank's dump is at least as new as the watchdog's last request."""
    try:
        answered = os.stat(fr_dump_path(directory, rank)).st_mtime_ns
        return answered >= os.stat(fr_request_path(directory, rank)).st_mtime_ns
    except OSError:
        return False


def untraced_since(data: dict | None, progress: dict, before: float | None = None) -> list[dict]:
    """The recorded collectives past the last number the trace saw on their group: what the rank
    entered without colltrace seeing it (newest last). Point-to-point ops are left out, and those
    made at or after `before` (when the trace was last read: a traced call writes its record
    before torch's recorder has it, so one made since may be in the trace unread yet)."""
    if not isinstance(data, dict):
        return []
    out = []
    for e in data.get("entries") or []:
        try:
            if e.get("p2p"):
                continue
            if before is not None and e.get("t") and float(e["t"]) >= before:
                continue
            seen = int((progress.get(str(e["group"])) or {}).get("entered", 0))
            if int(e["seq"]) > seen:
                out.append(dict(e))
        except (KeyError, TypeError, ValueError):
            continue
    out.sort(key=lambda e: (e.get("t") or 0, e["seq"]))
    return out
