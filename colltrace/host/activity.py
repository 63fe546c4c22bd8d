"""Whether a rank others wait for moves: its CPU time, I/O and live stacks sampled over the wait
(host/probes.py takes the stacks), classified as progressing, blocked in I/O or frozen: what tells
a slow rank from a hung one. classify() is plain data in, plain data out.
"""
from __future__ import annotations

import os
import re
import time

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
# Innermost frames that wait for the device (NCCL: the CPU ran ahead of its collectives and parks
# here). CUDA's default wait spins a core, so CPU time does not tell it from computing: a stack
# that does not move at one of these is blocked. torch.cuda's own synchronize functions, or a
# source line calling a C method that syncs (loss.item(), t.cpu(), torch.cuda.synchronize()).
DEVICE_FILES = ("torch/cuda/__init__.py", "torch/cuda/streams.py", "torch/cuda/graphs.py")
DEVICE_FUNCS = {"synchronize", "wait_event", "wait_stream", "query"}
DEVICE_LINE = re.compile(r"\.(item|cpu|tolist|numpy|synchronize)\s*\(\s*\)|\bcuda\.synchronize\s*\(")


def sample_process(pid: int | None) -> dict | None:
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


def waits_for_device(frames: list[dict] | None) -> bool:
    """The innermost frame waits for the device to finish (see DEVICE_FILES, DEVICE_LINE)."""
    if not frames:
        return False
    f = frames[-1]
    path = str(f.get("file")).replace(os.sep, "/")
    if path.endswith(DEVICE_FILES) and f.get("func") in DEVICE_FUNCS:
        return True
    try:
        import linecache

        line = linecache.getline(str(f.get("file")), int(f.get("line") or 0))
    except (OSError, ValueError, TypeError):
        return False
    return bool(DEVICE_LINE.search(line))


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
    I/O call, in the kernel's disk wait, or bytes still flowing), frozen (none of these, or the
    same stack parked in a device sync however busy the CPU: how "device_sync"), or unknown
    (samples span less than MIN_WINDOW_S)."""
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
    if distinct == 1 and len(stacks) > 1 and waits_for_device(frames):
        out["state"], out["how"] = "frozen", "device_sync"   # spinning in a sync is waiting, not computing
    elif cpu >= BUSY_FRACTION * window:
        out["state"], out["how"] = "progressing", "busy"
    elif distinct > 1:
        out["state"], out["how"] = "progressing", "moving"
    elif (any(p.get("state") == "disk-sleep" for p in procs) or (out.get("io_bytes") or 0) >= IO_MOVING_BYTES
          or waits_for_io(frames)):
        out["state"] = "blocked_io"
    else:
        out["state"] = "frozen"
    return out
