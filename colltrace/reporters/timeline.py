"""Chrome trace event JSON (opens in ui.perfetto.dev and chrome://tracing) of a snapshot and its
findings: one process per rank, one thread track per traced thread, each collective a slice.

Pure: plain data in, a dict out. Times are whole microseconds from the first record (`otherData.t0`
holds that unix time). Slices on one track must nest, so ops that overlap without nesting (async
ops) go to extra tracks of the same thread ("main ·2"); work queued until the end nests.
A collective that never finished is drawn to the moment the snapshot describes, named
"… (never completed)" and marked `args.unfinished`. Findings are instant events: one on the
whole trace, one on each rank it involves, one more on each culprit. A collective every member
recorded carries each one's arrival lag (`args.lag_ms`, `args.last_to_arrive`), also drawn as an
"arrival lag (ms)" counter on each rank: a straggler's track stands out.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from colltrace.analysis.stragglers import arrivals
from colltrace.model import schema
from colltrace.model.finding import Finding
from colltrace.model.schema import COMPLETED, FAILED, IN_FLIGHT, WAITING
from colltrace.reporters import native

PENDING = (WAITING, IN_FLIGHT, "queued")


def _end(r: dict, taken_at: float) -> tuple[float, bool]:
    """(when the slice ends, whether it never did)."""
    for key in ("completed_at", "returned_at") if r.get("state") in (COMPLETED, FAILED) else ("completed_at",):
        t = r.get(key)
        if isinstance(t, (int, float)) and t:
            return float(t), False
    if r.get("state") in PENDING:
        return max(taken_at, float(r.get("entered_at") or 0.0)), True
    return float(r.get("entered_at") or 0.0), False


def _name(r: dict) -> str:
    if r.get("op") == "untraced":
        return f"untraced x{r.get('count', 1)}"
    if r.get("p2p"):
        return f"{r.get('op')} peer {r.get('peer')}"
    return f"{r.get('op')} #{r.get('seq')}"


def _native_args(e: Mapping[str, Any]) -> dict:
    """A rank's native frames (innermost first) and C++ exception, as an event's args show them."""
    out: dict = {}
    frames = native.valid(e.get("native_frames"))
    if frames:
        out["native_frames"] = [native.frame_text(fr, offset=True) for fr in frames]
    exc = native.exception_text(e.get("native_exception"))
    if exc:
        out["exception"] = exc
    return out


def build(snap: schema.Snapshot, findings: list[Finding], culprits: list[int] | None = None) -> dict:
    taken_at = float(snap.get("taken_at") or 0.0)
    ranks = {int(k): v for k, v in (snap.get("ranks") or {}).items() if isinstance(v, dict)}
    times = [float(r["entered_at"]) for e in ranks.values() for r in e.get("records") or ()
             if isinstance(r, dict) and isinstance(r.get("entered_at"), (int, float))]
    t0 = min(times) if times else taken_at

    def us(t: float) -> int:
        # whole microseconds: a slice's end (ts + dur) is then exact, and nested ones stay nested
        return int(round((t - t0) * 1e6))

    events: list[dict] = []
    culprits = sorted(culprits or [])
    # Each member's arrival lag behind the first, where every member recorded the collective
    # (analysis/stragglers.py): on the slice, and as a counter track per rank.
    lags: dict[tuple, float] = {}
    last: set[tuple] = set()
    for a in arrivals(snap):
        for rank, lag in a.lags().items():
            lags[(rank, a.group, a.seq)] = lag
        if a.lag_s > 0:
            last.add((a.last, a.group, a.seq))
    for rank in sorted(ranks):
        entry = ranks[rank]
        label = f"rank {rank}" + (" (culprit)" if rank in culprits else "")
        if entry.get("status") not in (None, "unknown"):
            label += f" [{entry['status']}]"
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        lanes: dict[str, list[list[float]]] = {}   # thread -> per track, the ends of its open slices
        tids: dict[tuple[str, int], int] = {}
        for r in sorted((r for r in entry.get("records") or () if isinstance(r, dict)),
                        key=lambda r: (float(r.get("entered_at") or 0.0), str(r.get("id")))):
            start = float(r.get("entered_at") or 0.0)
            end, open_ = _end(r, taken_at)
            end = max(end, start)
            thread = str(r.get("thread") or "main")
            stacks = lanes.setdefault(thread, [])
            lane = None
            for i, open_ends in enumerate(stacks):
                while open_ends and open_ends[-1] <= start:
                    open_ends.pop()
                if not open_ends or end <= open_ends[-1]:   # after the last slice, or nested in it
                    lane = i
                    break
            if lane is None:
                lane = len(stacks)
                stacks.append([])
            stacks[lane].append(end)
            tid = tids.get((thread, lane))
            if tid is None:
                tid = tids[(thread, lane)] = len(tids) + 1
                tname = thread if lane == 0 else f"{thread} ·{lane + 1}"
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": tname}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                               "args": {"sort_index": tid}})
            args = {"group": r.get("group"), "seq": r.get("seq"), "state": r.get("state"),
                    "shapes": r.get("shapes"), "dtypes": r.get("dtypes")}
            if r.get("p2p"):
                args["peer"] = r.get("peer")
            frames = r.get("frames") or []
            if frames:
                args["where"] = " <- ".join(f"{f.get('file')}:{f.get('line')} ({f.get('func')})"
                                            for f in reversed(frames[-6:]))
            if open_:
                args["unfinished"] = True
            if r.get("error"):
                args["error"] = r["error"]
            key = (rank, str(r.get("group")), r.get("seq"))
            if key in lags:
                args["lag_ms"] = round(1000 * lags[key], 3)
                if key in last:
                    args["last_to_arrive"] = True
                events.append({"ph": "C", "name": "arrival lag (ms)", "pid": rank, "tid": 0, "ts": us(start),
                               "args": {"lag": args["lag_ms"]}})
            events.append({"ph": "X", "name": _name(r) + (" (never completed)" if open_ else ""),
                           "cat": "collective" + (",unfinished" if open_ else ""), "pid": rank, "tid": tid,
                           "ts": us(start), "dur": us(end) - us(start), "args": args})
        if not tids:   # a rank with no record still gets its track
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 1, "args": {"name": "main"}})
        ex = entry.get("exit")
        # how it died: its signal, where, in native code
        if entry.get("status") == "dead" and isinstance(ex, dict) and ex.get("signal"):
            died = entry.get("died_at")
            args = {"signal": ex["signal"], **_native_args(entry)}
            stack = entry.get("stack") or []
            if stack:
                args["where"] = " <- ".join(f"{f.get('file')}:{f.get('line')} ({f.get('func')})"
                                            for f in reversed(stack[-6:]) if isinstance(f, dict))
            events.append({"ph": "i", "s": "p", "name": f"died of {ex['signal']}", "cat": "death", "pid": rank,
                           "tid": 0, "ts": us(float(died) if isinstance(died, (int, float)) else taken_at),
                           "args": args})
    for _i, f in enumerate(findings):
        t = us(float(f.detected_at or taken_at))
        name = f"{f.kind}: group {f.group.get('name')} #{f.seq}"
        args = {"summary": f.summary, "missing_ranks": f.missing_ranks, "key": f.key}
        events.append({"ph": "i", "s": "g", "name": name, "cat": "finding", "pid": 0, "tid": 0, "ts": t, "args": args})
        for who in sorted({int(x) for x in f.ranks} & set(ranks)):
            e = f.ranks.get(str(who))
            events.append({"ph": "i", "s": "p", "name": name, "cat": "finding", "pid": who, "tid": 0, "ts": t,
                           "args": {"key": f.key, **(_native_args(e) if isinstance(e, dict) else {})}})
    for who in culprits:
        if who in ranks:
            events.append({"ph": "i", "s": "p", "name": "culprit", "cat": "finding", "pid": who, "tid": 0,
                           "ts": us(taken_at), "args": {"rank": who}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"t0": t0, "taken_at": taken_at, "culprits": culprits,
                          "source": (snap.get("source") or {}).get("kind", "colltrace")}}
