"""Where a rank is and whether it moves: its live stack by three routes, none needing ptrace
first, and CPU/stack samples over a stall that tell a slow rank from a hung one.

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
classify() is plain data in, plain data out.
"""
from __future__ import annotations

import json
import os
import re
import time

from colltrace.tracefile.asks import stack_answer_path, stack_request_path, stack_signal_path
from colltrace.model.schema import WAITING

INPROC_WAIT_S = 0.4          # the poller wakes every poll period (0.1 s): a free GIL answers well within
SIGNAL_WAIT_S = 0.5          # faulthandler writes in microseconds once the signal is delivered
MIN_WINDOW_S = 0.5           # samples must span this long before a rank is called frozen or busy
BUSY_FRACTION = 0.10         # CPU time / wall time above this: computing (colltrace's own thread uses < 1 %)
IO_MOVING_BYTES = 1 << 20    # bytes read or written over the window that mean I/O is flowing
MAX_SAMPLES = 64

# Innermost frames that wait for data from elsewhere: the module or the function, or a source
# line that calls one (a C call such as sock.recv() shows as the caller's line).
IO_FILES = {"socket.py", "selectors.py", "ssl.py", "subprocess.py", "connection.py", "client.py", "socketserver.py",
            "request.py", "queues.py"}
IO_FUNCS = {"recv", "recv_into", "recvfrom", "recvmsg", "read", "readinto", "readline", "readlines", "accept",
            "select", "poll", "communicate", "urlopen", "getaddrinfo", "create_connection", "_recv", "_recv_bytes",
            "_poll", "input"}
IO_LINE = re.compile(r"\.(recv\w*|read\w*|accept|select|poll|communicate|urlopen|getresponse)\s*\(|"
                     r"\b(select\.select|input|urlopen)\s*\(")


# -- watchdog side: the routes -------------------------------------------------------------------
def ask(directory: str, rank: int) -> None:
    path = stack_request_path(directory, rank)
    with open(path, "a"):
        pass
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


def _send_signal(directory: str, rank: int, pid: int, meta: dict) -> str | None:
    """Ask by signal; None if sent, else why not."""
    sig = meta.get("stack_signal")
    if not sig:
        return meta.get("stack_signal_note") or "no stack signal registered"
    try:
        os.truncate(stack_signal_path(directory, rank), 0)   # the rank appends (O_APPEND): its next dump starts the file
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
            if size and size == sizes.get(rank):   # written, and no longer growing
                frames = _read_signal(directory, rank, ranks[rank][1])
                if frames is not None:
                    out[rank] = (frames, None)
                    sent.remove(rank)
            sizes[rank] = size
    for rank in sent:
        frames = _read_signal(directory, rank, ranks[rank][1])
        out[rank] = (frames, None) if frames is not None else (
            None, "signal: no answer (the signal is blocked, or the rank is stuck in the kernel)")
    return out


def live_stacks(directory: str, due: dict[int, tuple[int, dict]], py_spy_ok: bool = True) -> dict[int, tuple]:
    """{rank: (pid, meta)} -> {rank: (frames or None, route, [why other routes failed])}.
    Every rank is asked in-process first, all at once; the rest by signal, then py-spy."""
    from colltrace.host import stacks

    out: dict[int, tuple] = {}
    for rank in due:
        try:
            ask(directory, rank)
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
                    out[rank] = (frames, "in-process", [])
                    pending.discard(rank)
    signalled = by_signal(directory, {r: due[r] for r in sorted(pending)})
    for rank in sorted(pending):
        pid, meta = due[rank]
        why = ["in-process: no answer in %.1f s (the GIL is held)" % INPROC_WAIT_S]
        frames, err = signalled[rank]
        if frames is not None:
            out[rank] = (frames, "signal", why)
            continue
        why.append(err)
        if py_spy_ok:
            threads = stacks.dump(pid, timeout=5)
            if threads.get("_main") is not None:
                out[rank] = (threads["_main"], "py-spy", why)
                continue
            why.append("py-spy: " + str(threads.get("_error")))
        out[rank] = (None, None, why)
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


# -- watchdog side: progress over time --------------------------------------------------------------
def sample_process(pid: int) -> dict | None:
    """CPU seconds, bytes read+written (any file or socket) and the process state, or None."""
    import psutil

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            cpu = p.cpu_times()
            state = p.status()
            try:
                io = p.io_counters()
                io_bytes = getattr(io, "read_chars", io.read_bytes) + getattr(io, "write_chars", io.write_bytes)
            except (psutil.AccessDenied, AttributeError, NotImplementedError):
                io_bytes = None
    except psutil.Error:
        return None
    return {"t": time.time(), "cpu": cpu.user + cpu.system, "io": io_bytes, "state": state}


def _user_frame(frames: list[dict]) -> dict | None:
    from colltrace.origins import user_frames

    users = user_frames(frames)
    named = [f for f in users if not str(f.get("func")).startswith("<") or f.get("func") == "<module>"]
    if named or users:
        return (named or users)[-1]   # the function, not its generator expression
    return frames[-1] if frames else None


def waits_for_io(frames: list[dict] | None) -> bool:
    """The innermost frame waits for data from elsewhere (see IO_FILES, IO_FUNCS, IO_LINE)."""
    if not frames:
        return False
    f = frames[-1]
    if os.path.basename(str(f.get("file"))) in IO_FILES or f.get("func") in IO_FUNCS:
        return True
    try:
        import linecache

        line = linecache.getline(str(f.get("file")), int(f.get("line") or 0))
    except (OSError, ValueError, TypeError):
        return False
    return bool(IO_LINE.search(line))


class Activity:
    """One rank's samples while others wait for it (reset when it does something traced)."""

    def __init__(self, since: float):
        self.since = since
        self.procs: list[dict] = []
        self.stacks: list[tuple[float, tuple, list]] = []

    def add_process(self, s: dict | None) -> None:
        if s is not None:
            self.procs.append(s)
            del self.procs[1:-MAX_SAMPLES]

    def add_stack(self, t: float, frames: list[dict] | None) -> None:
        if frames is not None:
            key = tuple((f.get("file"), f.get("line"), f.get("func")) for f in frames)
            self.stacks.append((t, key, frames))
            del self.stacks[1:-MAX_SAMPLES]

    def classify(self) -> dict:
        return classify(self.procs, self.stacks)


def classify(procs: list[dict], stacks: list[tuple]) -> dict:
    """progressing (CPU time or the stack moves), blocked_io (neither, waiting for data: in an
    I/O call, in the kernel's disk wait, or bytes still flowing), frozen (none of these), or
    unknown (samples span less than MIN_WINDOW_S)."""
    out: dict = {"state": "unknown", "samples": len(procs), "stack_samples": len(stacks)}
    frames = stacks[-1][2] if stacks else None
    if frames:
        at = _user_frame(frames)
        if at:
            out["at"] = dict(at)
    if len(procs) < 2:
        return out
    first, last = procs[0], procs[-1]
    window = last["t"] - first["t"]
    cpu = max(0.0, last["cpu"] - first["cpu"])
    out.update(window_s=round(window, 2), cpu_s=round(cpu, 2), since=first["t"], t=last["t"],
               proc_state=last.get("state"))
    if first.get("io") is not None and last.get("io") is not None:
        out["io_bytes"] = max(0, last["io"] - first["io"])
    distinct = len({k for _, k, _ in stacks})
    out["stack_moved"] = distinct > 1
    out["stacks_seen"] = distinct
    if window < MIN_WINDOW_S:
        return out
    if cpu >= BUSY_FRACTION * window:
        out["state"], out["how"] = "progressing", "busy"
    elif distinct > 1:
        out["state"], out["how"] = "progressing", "moving"
    elif (any(p.get("state") == "disk-sleep" for p in procs) or (out.get("io_bytes") or 0) >= IO_MOVING_BYTES
          or waits_for_io(frames)):
        out["state"] = "blocked_io"
    else:
        out["state"] = "frozen"
    return out


# -- what COLLTRACE_ON_HANG=abort may end -----------------------------------------------------------
def _waited_for(finding: dict) -> list[int]:
    """The ranks a stall (or an unmatched p2p op) waits for: judged by their activity."""
    if finding.get("kind") == "unmatched_p2p":
        return [int(r) for r in finding.get("missing_ranks") or []]
    if finding.get("kind") == "stall" and not finding.get("p2p"):
        return sorted({int(r) for r in (finding.get("missing_ranks") or []) + (finding.get("unknown_ranks") or [])})
    return []


def missing_states(finding: dict) -> dict:
    """{rank: its activity state} for the ranks a stall waits for ({} for other findings)."""
    table = finding.get("ranks") or {}
    out = {}
    for r in _waited_for(finding):
        a = (table.get(str(r)) or {}).get("activity")
        out[str(r)] = a.get("state") if isinstance(a, dict) else None
    return out


def act_on(finding: dict, on_hang: str, abort_stall_s: float = 0.0) -> tuple[bool, str]:
    """Whether COLLTRACE_ON_HANG acts on this finding now, and why. warn and dump act on every
    hang; abort acts on certain ones (mismatch, deadlock, dead rank, a collective every member
    entered) at once, and on a stall only when every rank it waits for is frozen (none moves, none
    waits for I/O), or once it has lasted COLLTRACE_ABORT_STALL_S (when set). A rank that cannot
    be observed at all (another host without a watchdog, no trace) counts as frozen, as before.
    A rank that died at interpreter exit, after its program finished, is reported and never acted
    on while no rank waits for it (the other ranks are finishing too). A stall whose missing rank
    just entered a collective elsewhere is not acted on: it is about to become certain or end."""
    kind = str(finding.get("kind") or "hang")
    if kind == "dead_rank" and (finding.get("exit") or {}).get("at_exit") and not finding.get("waiting") \
            and not finding.get("failed"):
        return False, kind   # it died as its interpreter ended, its program done: no one is kept waiting
    states = missing_states(finding)
    if on_hang != "abort" or not states:
        return True, kind
    table = finding.get("ranks") or {}
    if any((table.get(r) or {}).get("state") == WAITING for r in states):
        # A rank the stall waits for has just entered another collective: within a moment the
        # wait settles into something certain (a cycle, a mismatch) or ends. Not frozen.
        return False, kind
    waited = finding.get("waited_s") or 0.0
    if abort_stall_s and waited >= abort_stall_s:
        return True, f"{kind} for {waited:.0f} s >= COLLTRACE_ABORT_STALL_S"
    if all(s in ("frozen", None) for s in states.values()):
        frozen = sorted(int(r) for r, s in states.items() if s == "frozen")
        return True, f"{kind}: rank{'s' if len(frozen) != 1 else ''} {','.join(map(str, frozen))} frozen" if frozen else kind
    return False, kind
