"""PyTorch's Flight Recorder, on demand: names for the collectives colltrace cannot see.

DDP's gradient all-reduces (run by its C++ Reducer), direct `pg.allreduce(...)` calls and
compiled code issue collectives that no Python wrapper sees: the trace counts them from the
backend's sequence number but cannot say what they were. The Flight Recorder (on by default,
gloo included, in recent torch) records every one of them. Dumping it costs milliseconds with
the GIL held, so a rank does it only when its watchdog asks: the watchdog touches
`rank-N.fr-request` for a rank others wait for while it is in no traced collective, the rank's
poller thread (which wakes every poll period anyway) answers with `rank-N.fr.json`.

The reader half (`untraced_since`) is plain data: no torch.
"""
from __future__ import annotations

import json
import os
import time

from colltrace.tracefile import asks

KEEP_PER_GROUP = 8   # newest entries per group written on request
# FR's dtype names -> torch's short names, as the trace records them
DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
          "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
          "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


def request_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank:05d}.fr-request")


def dump_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank:05d}.fr.json")


def request(directory: str, rank: int) -> None:
    """Ask a rank for a dump (watchdog side): the request file's mtime is the question."""
    path = request_path(directory, rank)
    with open(path, "a"):
        pass
    os.utime(path, None)


def answered(directory: str, rank: int) -> bool:
    """Whether the rank's dump is at least as new as the watchdog's last request."""
    try:
        return os.stat(dump_path(directory, rank)).st_mtime_ns >= os.stat(request_path(directory, rank)).st_mtime_ns
    except OSError:
        return False


class Responder(asks.Responder):
    """Rank side: answers the watchdog's request with the newest Flight Recorder entries."""

    def __init__(self, directory: str, rank: int):
        super().__init__(request_path(directory, rank), dump_path(directory, rank))

    def answer(self) -> dict:
        data = {"t": time.time(), "entries": [], "error": None}
        try:
            data["entries"] = _newest(_dump())
        except Exception as exc:   # an older torch, the recorder off: say so, never raise
            data["error"] = f"{type(exc).__name__}: {exc}"
        return data

def _dump() -> list[dict]:
    import torch

    c = torch._C._distributed_c10d
    fn = getattr(c, "_dump_fr_trace_json", None)
    if fn is None:
        raise RuntimeError("this torch has no Flight Recorder dump (torch >= 2.6 has it)")
    return json.loads(fn(includeCollectives=True, onlyActive=False)).get("entries") or []


def _newest(entries: list[dict]) -> list[dict]:
    out: dict[str, list] = {}
    for e in entries:
        pg = e.get("process_group") or ["?", ""]
        name = str(pg[0])
        op = str(e.get("profiling_name") or "?").split(":", 1)[-1]
        out.setdefault(name, []).append({
            "group": name, "seq": int(e.get("collective_seq_id") or 0), "p2p": bool(e.get("is_p2p")),
            "op": op.lstrip("_"), "backend_op": op.replace("_", ""),
            "shapes": e.get("input_sizes") or [], "dtypes": [DTYPES.get(d, str(d).lower()) for d in e.get("input_dtypes") or []],
            "state": e.get("state"), "t": (e.get("time_created_ns") or 0) / 1e9})
    return [x for group in out.values() for x in group[-KEEP_PER_GROUP:]]


def untraced_since(data: dict | None, progress: dict) -> list[dict]:
    """The recorded collectives past the last number the trace saw on their group: what the rank
    entered without colltrace seeing it (newest last). Point-to-point ops are left out."""
    if not isinstance(data, dict):
        return []
    out = []
    for e in data.get("entries") or []:
        try:
            if e.get("p2p"):
                continue
            seen = int((progress.get(str(e["group"])) or {}).get("entered", 0))
            if int(e["seq"]) > seen:
                out.append(dict(e))
        except (KeyError, TypeError, ValueError):
            continue
    out.sort(key=lambda e: (e.get("t") or 0, e["seq"]))
    return out
