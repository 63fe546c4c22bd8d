"""Where a rank is while the others wait for it: samples of its main thread's stack, taken by its
own sampler thread (colltrace/rank/sampler.py) only while the watchdog asks, read back here. No
ptrace: the rank samples itself. Nothing here imports torch.

    rank-N.sample-request   the watchdog's question: its mtime asks, its text is for how many seconds
    rank-N.samples.jsonl    the rank's answer, appended, one JSON value a line:
        {"s": ID, "f": [[file, line, func], ...]}   a stack (innermost last), defined once
        [T, ID]                                     at time T the main thread was in stack ID
        {"gc": [T0, T1]}                            a garbage collection held the interpreter
        {"cpu": [WALL_S, CPU_S]}                    a burst of sampling ended: its length, its CPU

The rank's clock is its own host's; a sample is compared only with that rank's own entry times.
"""
from __future__ import annotations

import json
import os
from collections import deque

from colltrace.tracefile import layout

SAMPLE_HZ = 50              # samples a second while asked: a 40 ms delay gets two
ASK_FOR_S = 10.0            # one request's worth of sampling; the watchdog asks again while it wants more
MAX_FILE_BYTES = 8 << 20    # the rank stops writing here (about an hour of sampling)
KEEP_SAMPLES = 60 * SAMPLE_HZ   # what a reader keeps: the straggler window's minute
SEND_S = 5.0                # what travels to the leader each round: the newest seconds (it keeps the rest)


def request_path(directory: str, rank: int) -> str:
    return layout.rank_file(directory, rank, "sample-request")


def samples_path(directory: str, rank: int) -> str:
    return layout.rank_file(directory, rank, "samples.jsonl")


def ask(directory: str, rank: int, seconds: float = ASK_FOR_S) -> None:
    """Watchdog side: sample for `seconds` from now (written aside, then renamed: a new mtime)."""
    path = request_path(directory, rank)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{seconds:g}")
    os.replace(tmp, path)


def asked(directory: str, rank: int) -> tuple[int, float] | None:
    """Rank side: (the request's mtime, the seconds asked), or None where nobody asked."""
    path = request_path(directory, rank)
    try:
        mtime = os.stat(path).st_mtime_ns
        with open(path) as f:
            seconds = float(f.read().strip() or ASK_FOR_S)
    except (OSError, ValueError):
        return None
    return mtime, min(max(seconds, 0.0), 10 * ASK_FOR_S)


class SampleLog:
    """Reader side: a rank's samples file, read incrementally; malformed lines are skipped."""

    def __init__(self, path: str, keep: int = KEEP_SAMPLES):
        self.path = path
        self._offset = 0
        self._rest = b""
        self.stacks: dict[int, list[dict]] = {}
        self.samples: deque = deque(maxlen=keep)      # (t, stack id), oldest first
        self.gcs: deque = deque(maxlen=keep)          # (t0, t1)
        self.cpu = [0.0, 0.0]                         # sampling's wall seconds and CPU seconds, in all

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        if not data:
            return
        self._offset += len(data)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()   # a line not finished yet
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        try:
            v = json.loads(line)
        except ValueError:
            return
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], (int, float)) and v[1] in self.stacks:
            self.samples.append((float(v[0]), v[1]))
        elif isinstance(v, dict) and isinstance(v.get("s"), int) and isinstance(v.get("f"), list):
            self.stacks[v["s"]] = [{"file": str(f[0]), "line": int(f[1]), "func": str(f[2])}
                                   for f in v["f"] if isinstance(f, list) and len(f) == 3 and isinstance(f[1], int)]
        elif isinstance(v, dict) and _pair(v.get("gc")):
            self.gcs.append((float(v["gc"][0]), float(v["gc"][1])))
        elif isinstance(v, dict) and _pair(v.get("cpu")):
            self.cpu[0] += float(v["cpu"][0])
            self.cpu[1] += float(v["cpu"][1])

    def entry(self, since: float | None = None) -> dict | None:
        """The samples (from `since` on) for a snapshot entry: {"stacks": {id: frames}, "at":
        [[t, id], ...], "gc": [[t0, t1], ...]}; None where there are none."""
        at = [[t, s] for t, s in self.samples if since is None or t >= since]
        gc = [[a, b] for a, b in self.gcs if since is None or b >= since]
        if not at and not gc:
            return None
        used = {s for _, s in at}
        return {"stacks": {str(s): self.stacks[s] for s in sorted(used)}, "at": at, "gc": gc,
                "cpu": [round(x, 4) for x in self.cpu]}


def _pair(v) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)
