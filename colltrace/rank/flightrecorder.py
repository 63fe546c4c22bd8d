"""PyTorch's Flight Recorder, on demand: names for the collectives colltrace cannot see.

DDP's gradient all-reduces (run by its C++ Reducer), direct `pg.allreduce(...)` calls and
compiled code issue collectives that no Python wrapper sees: the trace counts them from the
backend's sequence number but cannot say what they were. The Flight Recorder (on by default,
gloo included, in recent torch) records every one of them. Dumping it costs milliseconds with
the GIL held, so a rank does it only when its watchdog asks: the watchdog touches
`rank-N.fr-request` for a rank others wait for while it is in no traced collective, the rank's
poller thread (which wakes every poll period anyway) answers with `rank-N.fr.json`.

This is the rank's half. The file names, the watchdog's request and the reader's half
(`untraced_since`, plain data) are colltrace/tracefile/asks.py's: the watchdog and the trace
reader never import rank/.
"""
from __future__ import annotations

import json
import sys
import time

from colltrace.tracefile import asks

KEEP_PER_GROUP = 8   # newest entries per group written on request


class Responder(asks.Responder):
    """Rank side: answers the watchdog's request with the newest Flight Recorder entries."""

    def __init__(self, directory: str, rank: int, names=None):
        """names() -> {(group name, backend): lane name}: the groups of several backends
        (Recorder.fr_names), whose backends' recorders name the same group."""
        super().__init__(asks.fr_request_path(directory, rank), asks.fr_dump_path(directory, rank))
        self._names = names

    def answer(self) -> dict:
        data = {"t": time.time(), "entries": [], "error": None}
        try:
            names = self._names() if self._names is not None else {}
            data["entries"] = _newest(_dump(), names)
        except Exception as exc:   # an older torch, the recorder off: say so, never raise
            data["error"] = f"{type(exc).__name__}: {exc}"
        return data


# Each backend's recorder: NCCL's holds CUDA events (FlightRecorder<CUDAEvent>), gloo's c10::Events;
# a hooked backend (nccl2, torch >= 2.15) records into a recorder of its own, read by name.
SOURCES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("nccl", "_dump_nccl_trace_json", {}), ("nccl2", "_dump_fr_trace_json", {"backend": "nccl2"}),
    ("gloo", "_dump_fr_trace_json", {}))


def _dump(c10d=None) -> list[dict]:
    """Every recorder's entries, each tagged with its backend ("_source"); raises only where no
    recorder could be read (the first reason)."""
    if c10d is None:
        # never imported here: a rank seen before it imports torch (rank/early.py) has no recorder
        # of torch's to read, and importing it from this thread would change what the program does
        c10d = sys.modules.get("torch._C._distributed_c10d")
        if c10d is None:
            raise RuntimeError("torch.distributed is not imported in this rank yet")
    out: list[dict] = []
    errors = []
    read = 0
    for source, name, extra in SOURCES:
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            entries = json.loads(fn(includeCollectives=True, onlyActive=False, **extra)).get("entries") or []
        except TypeError:   # no such argument in this torch: no such recorder
            continue
        except Exception as exc:   # torch's dump errors (C++, any type): said with the other sources'
            errors.append(f"{source}: {type(exc).__name__}: {exc}")
            continue
        read += 1
        out.extend(dict(e, _source=source) for e in entries if isinstance(e, dict))
    if not read:
        raise RuntimeError(errors[0] if errors else "this torch has no Flight Recorder dump (torch >= 2.6 has it)")
    return out


def _newest(entries: list[dict], names: dict | None = None) -> list[dict]:
    names = names or {}
    out: dict[str, list] = {}
    for e in entries:
        pg = e.get("process_group") or ["?", ""]
        name = str(pg[0])
        source = e.get("_source")
        name = names.get((name, source)) or (source == "nccl2" and names.get((name, "nccl"))) or name
        op = str(e.get("profiling_name") or "?").split(":", 1)[-1]
        out.setdefault(name, []).append({
            "group": name, "seq": int(e.get("collective_seq_id") or 0), "p2p": bool(e.get("is_p2p")),
            "op": op.lstrip("_"), "backend_op": op.replace("_", ""),
            "shapes": e.get("input_sizes") or [],
            "dtypes": [asks.DTYPES.get(d, str(d).lower()) for d in e.get("input_dtypes") or []],
            "state": e.get("state"), "t": (e.get("time_created_ns") or 0) / 1e9})
    # several recorders may name one group (a hooked backend beside gloo's): oldest first, by time
    return [x for group in out.values() for x in sorted(group, key=lambda x: x["t"])[-KEEP_PER_GROUP:]]
