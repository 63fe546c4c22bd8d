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
from dataclasses import dataclass, field

from colltrace.analysis.view import JobView, without_gc
from colltrace.model import schema
from colltrace.model.schema import COMPLETED

MAX_WARNINGS = 20


@dataclass(frozen=True)
class Place:
    """One side of a desync: the ranks that came from one place of the user's code."""
    ranks: list[int]
    op: str | None
    file: str | None
    line: int | None
    func: str | None
    frames: list[dict]     # the user's own frames of its first rank's call, outermost first


@dataclass
class Desync:
    """The ranks of `group` reached collective `seq` (and `seqs`, every number seen the same way)
    from different `places`. colltrace/reporters/warnings.py words it."""
    group: dict            # {"name", "desc", "ranks"}
    seq: int
    places: list[Place]
    seqs: list[int] = field(default_factory=list)


def _place(rec: dict, own):
    frames = own(rec.get("frames"))
    if not frames:
        return None
    f = frames[-1]
    return str(f.get("file")), str(f.get("func")), f


def find(snap: JobView) -> list[Desync]:
    """One warning per (group, set of places), the first collective number where it was seen."""
    by_coll: dict[tuple, dict[int, dict]] = {}
    own_frames: dict[int, Callable] = {}
    for rank, view in sorted(snap.ranks.items()):
        own_frames[rank] = view.origins.user_frames   # classified by the rank's recorded roots
        for r in view.records:
            if not (r.get("p2p") or r.get("op") == "untraced" or r.get("state") != COMPLETED):
                by_coll.setdefault((r["group"], r["seq"]), {})[rank] = r
    out: dict[tuple, Desync] = {}
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
                sides.append(Place(sorted(m[0] for m in members), rec.get("op"), frame.get("file"), frame.get("line"),
                                   frame.get("func"), own_frames[rank](rec.get("frames"))))
            w = out[key] = Desync({"name": g["name"], "desc": g["desc"], "ranks": g["ranks"]}, seq, sides)
        w.seqs.append(seq)
    return list(out.values())


def of_snapshot(snap: schema.Snapshot) -> list[Desync]:
    """Silent desyncs of a whole snapshot (its view checks what it reads: analysis/view.py)."""
    with without_gc():
        return find(JobView(snap))
