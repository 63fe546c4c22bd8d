"""Which ranks colltrace itself ended, why and when: `ended-<host>.json` in the trace folder,
one per host (each host's watchdog ends its own ranks). Written just before the ranks are
killed, so that every later reader (analyze, the dashboard, report.txt) tells the ending as it
happened: "ended by colltrace (abort: deadlock) at 14:37:17", never "vanished".

    {"by": "colltrace", "action": "abort", "why": "deadlock", "finding": "deadlock:0#3,2#1",
     "at": 1732278000.5, "host": "node1", "ranks": {"0": 1234, "1": 1235}}
"""
from __future__ import annotations

import json
import os
import time

PREFIX = "ended-"


def path(directory: str, host: str | None) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(host or "host"))[:100]
    return os.path.join(directory, f"{PREFIX}{safe}.json")


def write(directory: str, host: str | None, why: str, finding: str | None, ranks: dict[int, int],
          at: float | None = None) -> dict:
    """Record the ending (replaced whole: written aside, then renamed). Raises OSError (a full
    folder): the caller ends the ranks all the same."""
    record = {"by": "colltrace", "action": "abort", "why": why, "finding": finding,
              "at": time.time() if at is None else at, "host": host,
              "ranks": {str(r): pid for r, pid in sorted(ranks.items())}}
    target = path(directory, host)
    tmp = os.path.join(directory, f".{os.path.basename(target)}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, target)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return record


def read(directory: str) -> dict[int, dict]:
    """{rank: {"why", "finding", "at", "pid"}} for every rank a watchdog ended in DIR; a file
    that cannot be read or parsed is skipped (the ending then reads as before: no exit record)."""
    out: dict[int, dict] = {}
    try:
        names = [n for n in os.listdir(directory) if n.startswith(PREFIX) and n.endswith(".json")]
    except OSError:
        return out
    for name in sorted(names):
        try:
            with open(os.path.join(directory, name)) as f:
                rec = json.load(f)
            ranks = rec["ranks"]
            why, at = str(rec["why"]), float(rec["at"])
            for r, pid in ranks.items():
                out[int(r)] = {"why": why, "finding": rec.get("finding"), "at": at,
                               "pid": int(pid) if pid is not None else None}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


_cache: dict[str, tuple[int, dict[int, dict]]] = {}


def cached(directory: str) -> dict[int, dict]:
    """read(), again only when the folder changed (a file was added or replaced): the watchdog
    asks for every rank on every round."""
    try:
        stamp = os.stat(directory).st_mtime_ns
    except OSError:
        return {}
    hit = _cache.get(directory)
    if hit is None or hit[0] != stamp:
        hit = _cache[directory] = (stamp, read(directory))
    return hit[1]


def exit_info(ending: dict) -> dict:
    """A rank's exit as the snapshot carries it: killed from outside (no signal of its own, so
    never a crash in the analysis), by colltrace, with why and when."""
    return {"signal": None, "ended_by": "colltrace", "why": ending["why"], "at": ending["at"],
            "finding": ending.get("finding")}
