"""Silent desyncs: the ranks of one group reached the same collective number from different places.

When the collective numbered N on a group is entered by some ranks in one function of the user's
code and by others in another, the ranks are out of step: it matched this time only because the
ops happened to agree (two all_reduces of the same size). Such a job does not hang today and may
tomorrow, so these are warnings, not findings: `colltrace analyze` lists them and keeps its exit
code. A "place" is the innermost frame of the user's code (file and function), so a helper that
both sides of a root / non-root branch call (a gather with and without a list) is one place.
"""
from __future__ import annotations

from collections.abc import Callable

from colltrace.analysis.view import Snapshot, to_int, without_gc
from colltrace.model.schema import COMPLETED
from colltrace.words import frame_text, rank_word

MAX_WARNINGS = 20


def _place(rec: dict, own):
    frames = own(rec.get("frames"))
    if not frames:
        return None
    f = frames[-1]
    return str(f.get("file")), str(f.get("func")), f


def find(snap: Snapshot) -> list[dict]:
    """One warning per (group, set of places), the first collective number where it was seen."""
    by_coll: dict[tuple, dict[int, dict]] = {}
    own_frames: dict[int, Callable] = {}
    for rank, view in sorted(snap.ranks.items()):
        own_frames[rank] = view.origins.user_frames   # classified by the rank's recorded roots
        for r in view.records:
            try:
                if r.get("p2p") or r.get("op") == "untraced" or r.get("state") != COMPLETED:
                    continue
                by_coll.setdefault((str(r["group"]), to_int(r["seq"])), {})[rank] = r
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
    out: dict[tuple, dict] = {}
    for (group, seq), recs in sorted(by_coll.items()):
        if len(recs) < 2:
            continue
        places: dict[tuple, list] = {}
        for rank, r in recs.items():
            p = _place(r, own_frames[rank])
            if p is None:
                places = {}
                break   # a rank with no user frame: cannot tell
            places.setdefault(p[:2], []).append((rank, r, p[2]))
        if len(places) < 2:
            continue
        key = (group, tuple(sorted(places)))
        w = out.get(key)
        if w is None:
            if len(out) >= MAX_WARNINGS:
                continue
            g = snap.group(group)
            sides = []
            for _, members in sorted(places.items(), key=lambda kv: min(m[0] for m in kv[1])):
                rank, rec, frame = members[0]
                chain = " → ".join(frame_text(x) for x in own_frames[rank](rec.get("frames")))
                sides.append({"ranks": sorted(m[0] for m in members), "op": rec.get("op"), "file": frame.get("file"),
                              "line": frame.get("line"), "func": frame.get("func"), "chain": chain})
            text = "; ".join(f"{rank_word(s['ranks'])} in {s['op']} at {s['chain']}" for s in sides)
            w = out[key] = {
                "kind": "desync", "group": {"name": g["name"], "desc": g["desc"], "ranks": g["ranks"]},
                "seq": seq, "seqs": [], "places": sides,
                "message": (f"Collective #{seq} on group {group} ({g['desc'] or 'no description'}) was reached from "
                            f"different places: {text}. It matched this time; the ranks are out of step there, and "
                            f"the next change to either path can hang the job."),
            }
        w["seqs"].append(seq)
    return list(out.values())


def of_snapshot(snap: dict) -> list[dict]:
    """Silent desyncs of a whole snapshot: warnings, never a reason to fail (nor to fail a report)."""
    try:
        with without_gc():
            return find(Snapshot(snap))
    except (TypeError, ValueError, KeyError, AttributeError):
        return []

