"""Snapshots: the analyzer's plain-data input, merged from per-node summaries.

No torch import. A node summary is {"host", "t", "groups", "ranks": {rank: entry}}; the
snapshot format is described in docs/design.md.
"""
from __future__ import annotations

from colltrace.analysis import origins

SUSPECT_AFTER_S = 0.5   # others have waited this long: fetch the missing rank's live stack
RECENT_COMPLETED = 4    # completed records per rank sent through the store (pending ones always)
FRAMES_NEAR_USER = 12   # frames kept around the innermost user frame when compacting


def merge(summaries: list[dict], now: float) -> dict:
    snap = {"version": 1, "taken_at": now, "groups": {}, "ranks": {}}
    for s in summaries:
        snap["groups"].update(s.get("groups") or {})
        snap["ranks"].update(s.get("ranks") or {})
    return snap


def compact_frames(frames: list[dict], roots: dict | None = None) -> list[dict]:
    """Keep the innermost frames and those around the innermost user frame: what reports show.
    `roots`: the rank's, which tell its own code from torch's and the frameworks'."""
    if len(frames) <= FRAMES_NEAR_USER + 4:
        return frames
    classify = origins.for_roots(roots).classify
    user = next((i for i in range(len(frames) - 1, -1, -1)
                 if classify(frames[i].get("file", ""))[0] == origins.USER), None)
    keep = set(range(len(frames) - 4, len(frames)))
    if user is not None:
        keep.update(range(max(0, user - FRAMES_NEAR_USER + 1), min(len(frames), user + 2)))   # and the call it makes
    return [frames[i] for i in sorted(keep)]


def compact_entry(entry: dict) -> dict:
    """A rank entry small enough to travel through the store once per PUBLISH_S."""
    e = dict(entry)
    recs = e.get("records") or []
    pending = [r for r in recs if r.get("state") in ("waiting", "in_flight")]
    done = [r for r in recs if r.get("state") not in ("waiting", "in_flight")][-RECENT_COMPLETED:]
    keep = sorted(pending + done, key=lambda r: (r.get("entered_at") or 0, r.get("id") or 0))
    roots = e.get("roots")
    e["records"] = [dict(r, frames=compact_frames(r.get("frames") or [], roots)) for r in keep]
    if e.get("stack"):
        e["stack"] = compact_frames(e["stack"], roots)
    return e


def suspects(snap: dict, now: float) -> set[int]:
    """Ranks others have waited for a while that are in no collective: their live stack will
    be needed to say where they are instead."""
    out = set()
    groups = snap["groups"]
    ranks = snap["ranks"]
    for entry in ranks.values():
        for r in entry.get("records") or []:
            if r.get("state") not in ("waiting", "in_flight") or r.get("p2p") and r.get("peer") is None:
                continue
            if now - (r.get("entered_at") or now) < SUSPECT_AFTER_S:
                continue
            if r.get("p2p"):
                members = [r["peer"]]
            else:
                members = groups.get(r.get("group"), {}).get("ranks", [])
            for m in members:
                other = ranks.get(str(m))
                if other is None or other.get("status") not in ("alive", "unknown"):
                    continue
                if not r.get("p2p") and (other.get("progress") or {}).get(r["group"], {}).get("entered", 0) >= r["seq"]:
                    continue
                if not any(x.get("state") == "waiting" for x in other.get("records") or []):
                    out.add(int(m))
    return out
