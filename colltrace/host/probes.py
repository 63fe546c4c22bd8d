"""Where a rank is and whether it moves: its live stack by three routes, none needing ptrace
first (its samples over a stall: host/activity.py; what abort may end: host/actions.py).

The routes, tried in turn (the one that answered is said in the report):
  1. "in-process": the rank's own colltrace poller thread answers a request file with every
     thread's stack (sys._current_frames). Needs the GIL to be free at some point (a rank
     sleeping, waiting in I/O or in a C call that released it).
  2. "signal": faulthandler, registered on a real-time signal colltrace owns, writes every
     thread's stack from C when the watchdog sends it. Needs no GIL; needs the watchdog to be
     allowed to signal the rank (same user) and the program not to use that signal itself.
  3. "py-spy": reads the stack from outside. Needs ptrace (same user and ptrace_scope 0, or
     root/CAP_SYS_PTRACE; SYS_PTRACE in Docker/Kubernetes).

The rank side of the first two (StackResponder, install_signal) runs in the traced process and
lives with the request files in colltrace/tracefile/asks.py; this is the watchdog's side.
"""
from __future__ import annotations

import json
import os
import time

from colltrace.tracefile import native
from colltrace.tracefile.asks import NATIVE_ASK, stack_answer_path, stack_request_path, stack_signal_path

INPROC_WAIT_S = 0.4          # the poller wakes every poll period (0.1 s): a free GIL answers well within
SIGNAL_WAIT_S = 0.5          # faulthandler writes in microseconds once the signal is delivered


# -- watchdog side: the routes -------------------------------------------------------------------
def ask(directory: str, rank: int, with_native: bool = False) -> None:
    """with_native: the main thread's native frames too (the rank signals its own main thread:
    asked only of a rank a stall is about to be reported on; colltrace/rank/crash.py)."""
    path = stack_request_path(directory, rank)
    with open(path, "w") as f:
        f.write(NATIVE_ASK if with_native else "")
    os.utime(path, None)


def _answer(directory: str, rank: int) -> dict | None:
    """The in-process answer, if it answers the latest request."""
    try:
        answered = os.stat(stack_answer_path(directory, rank)).st_mtime_ns
        if answered < os.stat(stack_request_path(directory, rank)).st_mtime_ns:
            return None
        with open(stack_answer_path(directory, rank)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _main_frames(threads: list[dict]) -> list[dict] | None:
    for th in threads:
        if th.get("main"):
            return th.get("frames") or []
    return None


def _main_native(threads: list[dict]) -> list[dict] | None:
    """The main thread's native frames in an in-process answer, named here (not in the rank)."""
    for th in threads:
        if th.get("main") and isinstance(th.get("native"), list):
            try:
                return native.frames([f for f in th["native"] if isinstance(f, dict) and "address" in f]) or None
            except (KeyError, TypeError, ValueError):
                return None
    return None


def _native_text(directory: str, rank: int) -> str:
    try:
        with open(native.native_stack_path(directory, rank), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _read_native(directory: str, rank: int) -> list[dict] | None:
    """The main thread's native frames colltrace's handler wrote on the stack signal."""
    return native.stack(_native_text(directory, rank))


def _send_signal(directory: str, rank: int, pid: int, meta: dict) -> str | None:
    """Ask by signal; None if sent, else why not."""
    sig = meta.get("stack_signal")
    if not sig:
        return meta.get("stack_signal_note") or "no stack signal registered"
    try:
        # the rank appends (O_APPEND): its next dump starts the file
        os.truncate(stack_signal_path(directory, rank), 0)
        if meta.get("native_stack"):
            # colltrace's handler writes before faulthandler
            os.truncate(native.native_stack_path(directory, rank), 0)
        os.kill(pid, int(sig))
    except OSError as exc:
        return f"signal: {exc.strerror or exc}"
    return None


def _read_signal(directory: str, rank: int, meta: dict) -> list[dict] | None:
    """The main thread's frames from faulthandler's dump, once complete (None if none yet)."""
    from colltrace.tracefile.reader import parse_fault

    try:
        with open(stack_signal_path(directory, rank), errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    parsed = parse_fault(text + "\n")
    if not parsed or not parsed["threads"]:
        return None
    main = meta.get("main_thread")
    for th in parsed["threads"]:
        try:
            if main is not None and int(th["thread"], 16) == int(main):
                return th["frames"]
        except ValueError:
            continue
    return parsed["threads"][-1]["frames"]   # faulthandler lists the oldest thread (main) last


def by_signal(directory: str, ranks: dict[int, tuple[int, dict]]) -> dict[int, tuple]:
    """{rank: (pid, meta)} -> {rank: (frames, None) or (None, why not)}: all signalled first."""
    out: dict[int, tuple] = {}
    sent = []
    for rank, (pid, meta) in ranks.items():
        why = _send_signal(directory, rank, pid, meta)
        if why:
            out[rank] = (None, why)
        else:
            sent.append(rank)
    sizes: dict[int, int] = {}
    deadline = time.monotonic() + SIGNAL_WAIT_S
    while sent and time.monotonic() < deadline:
        time.sleep(0.02)
        for rank in list(sent):
            try:
                size = os.path.getsize(stack_signal_path(directory, rank))
            except OSError:
                size = 0
            written = size and size == sizes.get(rank)   # written, and no longer growing
            sizes[rank] = size
            frames = _read_signal(directory, rank, ranks[rank][1]) if written else None
            # the native frames are the main thread's to write: where the signal landed on another
            # thread, faulthandler's dump comes first, and they once the main thread runs
            if frames is None or (ranks[rank][1].get("native_stack")
                                  and not native.stack_written(_native_text(directory, rank))):
                continue
            out[rank] = (frames, None)
            sent.remove(rank)
    for rank in sent:
        frames = _read_signal(directory, rank, ranks[rank][1])
        out[rank] = (frames, None) if frames is not None else (
            None, "signal: no answer (the signal is blocked, or the rank is stuck in the kernel)")
    return out


def live_stacks(directory: str, due: dict[int, tuple[int, dict]], py_spy_ok: bool = True,
                with_native=()) -> dict[int, tuple]:
    """{rank: (pid, meta)} -> {rank: (frames or None, route, [why other routes failed], native
    frames or None)}. Every rank is asked in-process first, all at once; the rest by signal,
    then py-spy. with_native: the ranks whose main thread's native frames are wanted in-process
    too (the signal's handler writes them anyway, where the rank installed it)."""
    from colltrace.host import stacks

    out: dict[int, tuple] = {}
    for rank in due:
        try:
            ask(directory, rank, with_native=rank in with_native and bool(due[rank][1].get("native_stack")))
        except OSError:
            pass
    deadline = time.monotonic() + INPROC_WAIT_S
    pending = set(due)
    while pending and time.monotonic() < deadline:
        time.sleep(0.02)
        for rank in sorted(pending):
            data = _answer(directory, rank)
            if data is not None:
                frames = _main_frames(data.get("threads") or [])
                if frames is not None:
                    out[rank] = (frames, "in-process", [], _main_native(data.get("threads") or []))
                    pending.discard(rank)
    # the rank's poller waits only briefly for its main thread to take its native frames (a loaded
    # machine may schedule that thread late): the stack signal's handler then takes them instead
    # (signalled with the ranks that did not answer at all: one wait for both)
    late = sorted(r for r, got in out.items() if r in with_native and got[3] is None and due[r][1].get("native_stack"))
    signalled = by_signal(directory, {r: due[r] for r in sorted(pending) + late})
    for rank in late:   # where the signal went unanswered, the file holds an older question's
        out[rank] = out[rank][:3] + (_read_native(directory, rank) if signalled[rank][0] is not None else None,)
    for rank in sorted(pending):
        pid, meta = due[rank]
        why = [f"in-process: no answer in {INPROC_WAIT_S:.1f} s (the GIL is held)"]
        frames, err = signalled[rank]
        if frames is not None:
            out[rank] = (frames, "signal", why, _read_native(directory, rank) if meta.get("native_stack") else None)
            continue
        why.append(err)
        if py_spy_ok:
            threads = stacks.dump(pid, timeout=5)
            if threads.get("_main") is not None:
                out[rank] = (threads["_main"], "py-spy", why, None)
                continue
            why.append("py-spy: " + str(threads.get("_error")))
        out[rank] = (None, None, why, None)
    return out


def dump_text(directory: str, rank: int, pid: int, meta: dict, native: bool = True) -> str:
    """Every thread's stack as text for COLLTRACE_ON_HANG=dump/abort: py-spy (with native frames
    unless told otherwise: they take it ~0.6 s a rank) where it is permitted, else faulthandler's
    all-thread dump by signal, else the rank's own."""
    from colltrace.host import stacks

    threads = stacks.dump(pid, native=native)
    if "_error" not in threads:
        return f"(by py-spy{' --native' if native else ''})\n" + stacks.format_text(threads)
    why = threads["_error"]
    sig = meta.get("stack_signal")
    if sig and by_signal(directory, {rank: (pid, meta)})[rank][0] is not None:
        try:
            with open(stack_signal_path(directory, rank), errors="replace") as f:
                return f"(by faulthandler on signal {sig}; py-spy: {why})\n" + f.read()
        except OSError:
            pass
    try:
        ask(directory, rank)
        deadline = time.monotonic() + INPROC_WAIT_S
        while time.monotonic() < deadline:
            data = _answer(directory, rank)
            if data is not None:
                named = {f"{t.get('name')}{' (main)' if t.get('main') else ''}": t.get("frames") or []
                         for t in data.get("threads") or []}
                return f"(by the rank's own thread; py-spy: {why})\n" + stacks.format_text(named)
            time.sleep(0.02)
    except OSError:
        pass
    return stacks.format_text(threads)
