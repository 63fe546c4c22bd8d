"""Who makes everyone wait: per collective, each member's arrival lag (its entry time minus the
earliest member's), and per rank over the records: how often it came last, the time it made the
others wait, and that as a share of the time the records span. Facts only; a straggler is never a
finding (no exit code, no action).

Read from what the ranks already record (each record's `entered_at`): the hot path does nothing
more for it. Only collectives every member's record is there for are compared (a record window
that starts at different numbers on different ranks compares nothing it cannot), point-to-point
and untraced ones left out. The ranks' clocks are their hosts': on one host exact; across hosts
each host's offset to the leader's clock, measured through the exchange (host/clock.py: the
snapshot's "clocks"), is taken off its ranks' times, and a lag is counted only above NOISE_S plus
the two hosts' error bounds (half a ping's round trip each: well under a millisecond on a LAN).
Where no offset was measured (an older trace) the times are compared as recorded.

A rank stands out only when it came last far more often than chance (an even job on a loaded
machine has every rank last now and then), in enough collectives, and the wait it caused is a
share of the job's time worth naming. `where`: where the late rank was while the others waited,
from samples of its own stack (tracefile/samples.py: taken only while the watchdog asks, which it
does for a rank it judged late) that fall in its late windows, from the earliest member's entry to
its own; the user's innermost frame of each, with its share. Where it has no samples there, the
call site of its late collectives stands in (`where_from`: "samples" or "calls"). Garbage
collections in those windows are counted apart (`gc_s`): no sample sees them.
"""
from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field

from colltrace.model import schema
from colltrace.model.schema import is_clock
from colltrace.origins import for_roots, user_frames

NOISE_S = 0.002          # a last arrival this close to the first is nobody's delay
MIN_COLLECTIVES = 8      # late to at least this many before a rank is named
LATE_SHARE = 0.05        # ... and the time it made the others wait is at least this share of the span
MAX_WHERE = 5
Z = 3.5


def _last_share_needed(members: int, compared: int) -> float:
    """How often a rank must come last to stand out: well above chance (p = 1/members): by 0.2 and
    by Z standard deviations of how often chance puts it last in this many collectives (an even
    job of 2 ranks and 20 collectives has a rank last 14 times now and then). Not near 1: a rank
    late to one collective of each step (a teacher late to the scatter after its forward pass,
    first to the gather before it) comes last to half of them."""
    p = 1.0 / max(members, 1)
    return min(0.9, p + max(0.2, Z * math.sqrt(p * (1 - p) / max(compared, 1))))


@dataclass(frozen=True)
class Arrival:
    """One collective that every member of its group recorded entering: when each did."""
    group: str
    seq: int
    times: tuple[tuple[float, int], ...]   # (entered_at on the leader's clock, rank), earliest first
    frames: dict                           # rank -> its record's frames (its call site)
    shift: dict = field(default_factory=dict)   # rank -> its host's offset, taken off its time
    bound: dict = field(default_factory=dict)   # rank -> that offset's error bound
    roots: dict = field(default_factory=dict)   # rank -> its recorded roots (which frames are its own)
    # From a digest (model/arrivals.py: a large job): times holds the first and last member only
    members: tuple = ()
    waited: float | None = None
    err: float = 0.0

    @property
    def ranks(self) -> tuple:
        """Every member."""
        return self.members or tuple(r for _, r in self.times)

    @property
    def error_s(self) -> float:
        """How wrong lag_s may be: the last member's clock error bound, plus the largest of all
        (any member, its time off by its bound, may be the true first)."""
        if self.members:
            return 2 * self.err
        return self.bound.get(self.times[-1][1], 0.0) + max(self.bound.values(), default=0.0)

    def own_time(self, rank: int, t: float) -> float:
        """A time on the leader's clock, on `rank`'s own (its samples are stamped so)."""
        return t + self.shift.get(rank, 0.0)

    @property
    def last(self) -> int:
        return self.times[-1][1]

    @property
    def lag_s(self) -> float:
        """The last member's lag behind the first."""
        return self.times[-1][0] - self.times[0][0]

    @property
    def waited_s(self) -> float:
        """The wait the last member caused: its lag behind each other member, summed."""
        if self.waited is not None:
            return self.waited
        t_last = self.times[-1][0]
        return sum(t_last - t for t, _ in self.times[:-1])

    def lags(self) -> dict[int, float]:
        """Each member's arrival lag behind the earliest member (from a digest: the first's and
        the last's only)."""
        first = self.times[0][0]
        return {rank: t - first for t, rank in self.times}


def arrivals(snap: schema.Snapshot) -> list[Arrival]:
    """The collectives of a snapshot that every member recorded entering (point-to-point and
    untraced ones left out), in no particular order. A large job's live snapshot carries arrival
    digests instead of records ("arrivals": model/arrivals.py): those, where it has them."""
    groups = snap.get("groups") or {}
    if isinstance(snap.get("arrivals"), dict):
        return _digested(snap["arrivals"], groups, snap.get("ranks") or {})
    got_clocks = snap.get("clocks")
    clocks: dict = got_clocks if isinstance(got_clocks, dict) else {}
    seen: dict[tuple[str, int], dict[int, tuple[float, list]]] = {}
    shift: dict[int, float] = {}
    bound: dict[int, float] = {}
    roots: dict[int, dict] = {}
    for key, entry in (snap.get("ranks") or {}).items():
        if not isinstance(entry, dict):
            continue
        rank = entry.get("rank", key)
        rank = int(rank) if str(rank).isdigit() else None
        if rank is not None and isinstance(entry.get("roots"), dict):
            roots[rank] = entry["roots"]
        offset = clocks.get(str(entry.get("host")))
        if rank is not None and is_clock(offset) and (offset[0] or offset[1]):
            shift[rank], bound[rank] = float(offset[0]), float(offset[1])
        for r in entry.get("records") or ():
            if rank is None or not isinstance(r, dict) or r.get("p2p") or r.get("op") == "untraced":
                continue
            t, seq = r.get("entered_at"), r.get("seq")
            if not isinstance(t, (int, float)) or isinstance(t, bool) or type(seq) is not int:
                continue
            seen.setdefault((str(r.get("group")), seq), {})[rank] = (float(t) - shift.get(rank, 0.0),
                                                                      r.get("frames") or [])
    out = []
    for (group, seq), got in seen.items():
        members = [m for m in (groups.get(group) or {}).get("ranks") or () if type(m) is int]
        if len(members) < 2 or len(got) != len(members) or set(got) != set(members):
            continue
        out.append(Arrival(group, seq, tuple(sorted((t, rank) for rank, (t, _) in got.items())),
                           {rank: frames for rank, (_, frames) in got.items()},
                           {m: shift[m] for m in members if m in shift}, {m: bound[m] for m in members if m in bound},
                           roots))
    return out


def _digested(digests: dict, groups: dict, ranks: dict) -> list[Arrival]:
    """The digests that count every member of their group, as arrivals (on the leader's clock).
    The last member's frames where its entry came in full (a straggler's does once it is asked to
    sample itself: host/tree.py's slim)."""
    calls: dict[int, dict] = {}

    roots: dict[int, dict] = {}

    def frames_of(rank, group: str, seq: int) -> list:
        if rank not in calls:
            e = ranks.get(str(rank))
            if isinstance(e, dict) and isinstance(e.get("roots"), dict):
                roots[rank] = e["roots"]
            calls[rank] = {(str(r.get("group")), r.get("seq")): r.get("frames") or []
                           for r in (e.get("records") or () if isinstance(e, dict) else ()) if isinstance(r, dict)}
        return calls[rank].get((group, seq)) or []

    out = []
    for key, d in digests.items():
        group, _, seq = str(key).rpartition("#")
        members = (groups.get(group) or {}).get("ranks") if isinstance(groups.get(group), dict) else None
        if not (isinstance(d, list) and len(d) == 7 and isinstance(members, list) and seq.isdigit()):
            continue
        n, total, first, first_rank, last, last_rank, err = d
        if n != len(members) or len(members) < 2 or not all(type(x) in (int, float) for x in (total, first, last, err)):
            continue
        out.append(Arrival(group, int(seq), ((float(first), first_rank), (float(last), last_rank)),
                           {last_rank: frames_of(last_rank, group, int(seq))}, roots=roots,
                           members=tuple(m for m in members if type(m) is int),
                           waited=max(0.0, n * float(last) - float(total)), err=float(err)))
    return out


def _user_frames(frames: list, roots) -> list:
    """The user's frames of a call site, by their marked origin, else by the rank's roots."""
    if frames and type(frames[-1]) is dict and "origin" not in frames[-1]:
        return for_roots(roots).user_frames(frames)
    return user_frames(frames)


@dataclass
class Sampled:
    """One rank's stack samples (its own clock), oldest first, with their frames' origins, and its
    garbage collections."""
    times: list[float] = field(default_factory=list)
    frames: list[list[dict]] = field(default_factory=list)
    gcs: list[tuple[float, float]] = field(default_factory=list)

    def add(self, t: float, frames: list[dict]) -> None:
        i = bisect.bisect_left(self.times, t)
        if i < len(self.times) and self.times[i] == t:
            return   # seen in an earlier round
        self.times.insert(i, t)
        self.frames.insert(i, frames)

    def add_gc(self, t0: float, t1: float) -> None:
        if (t0, t1) not in self.gcs:
            self.gcs.append((t0, t1))

    def forget_before(self, t: float) -> None:
        i = bisect.bisect_left(self.times, t)
        del self.times[:i], self.frames[:i]
        self.gcs = [g for g in self.gcs if g[1] >= t]

    def within(self, t0: float, t1: float) -> list[list[dict]]:
        return self.frames[bisect.bisect_left(self.times, t0):bisect.bisect_right(self.times, t1)]

    def gc_within(self, t0: float, t1: float) -> float:
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in self.gcs)


def samples_of(snap: schema.Snapshot, into: dict[int, Sampled] | None = None) -> dict[int, Sampled]:
    """The stack samples the snapshot's entries carry, per rank (added to `into`: the live window
    keeps what earlier rounds brought). Each stack's frames are classified by the rank's own roots
    once; what is not a sample is left out."""
    out = into if into is not None else {}
    for key, entry in (snap.get("ranks") or {}).items():
        s = entry.get("samples") if isinstance(entry, dict) else None
        if not isinstance(s, dict) or not str(entry.get("rank", key)).isdigit():
            continue
        stacks = s.get("stacks")
        if not isinstance(stacks, dict):
            stacks = {}
        origins = for_roots(entry.get("roots"))
        classified = {k: origins.annotate(v) for k, v in stacks.items() if isinstance(v, list)}
        got = out.setdefault(int(entry.get("rank", key)), Sampled())
        for v in s.get("at") or ():
            if isinstance(v, list) and len(v) == 2 and isinstance(v[0], (int, float)) and str(v[1]) in classified:
                got.add(float(v[0]), classified[str(v[1])])
        for g in s.get("gc") or ():
            if isinstance(g, list) and len(g) == 2 and all(isinstance(x, (int, float)) for x in g):
                got.add_gc(float(g[0]), float(g[1]))
    return out


def find(snap: schema.Snapshot) -> list[dict]:
    """Stragglers of a snapshot (docs/design.md), most wait caused first; [] when nobody stands out.
    Each: {"rank", "waited_for_s", "late_share", "collectives", "of", "lag_s", "where": [{"file",
    "line", "func", "share"}]}: `waited_for_s` sums, over the collectives it came last to, its
    lag behind each other member; `late_share` its lag behind the first arrival, summed, over the
    time the compared collectives span; `collectives` how many it came last to, of `of` compared."""
    return judge(arrivals(snap), samples_of(snap))


def judge(found: list[Arrival], sampled: dict[int, Sampled] | None = None) -> list[dict]:
    """Stragglers among these collectives (find's result, from arrivals kept over a window), with
    where they were from their stack samples where they have some."""
    sampled = sampled or {}
    compared: Counter = Counter()
    late: dict[int, dict] = {}
    first_t, last_t = None, None
    size: dict[int, int] = {}
    for a in found:
        times = a.times
        first_t = times[0][0] if first_t is None else min(first_t, times[0][0])
        last_t = times[-1][0] if last_t is None else max(last_t, times[-1][0])
        members = a.ranks
        for rank in members:
            compared[rank] += 1
            size[rank] = max(size.get(rank, 0), len(members))
        lag = a.lag_s
        if lag < NOISE_S + a.error_s:
            continue
        who = a.last
        s = late.setdefault(who, {"n": 0, "waited": 0.0, "lag": 0.0, "where": Counter(), "seen": Counter(),
                                  "gc": 0.0})
        s["n"] += 1
        s["lag"] += lag
        s["waited"] += a.waited_s
        mine = _user_frames(a.frames.get(who) or [], a.roots.get(who))
        if mine:
            s["where"][_site(mine[-1])] += 1
        got = sampled.get(who)
        s["error"] = max(s.get("error", 0.0), a.error_s)
        if got is not None:   # its own clock: the window ends at its own entry
            t = a.own_time(who, a.times[-1][0])
            for frames in got.within(t - lag, t):
                inner = user_frames(frames)
                if inner:
                    s["seen"][_site(inner[-1])] += 1
            s["gc"] += got.gc_within(t - lag, t)
    span = (last_t - first_t) if first_t is not None and last_t is not None else 0.0
    out = []
    for rank, s in late.items():
        of = compared[rank]
        share = s["lag"] / span if span > 0 else 0.0
        if s["n"] < MIN_COLLECTIVES or s["n"] < _last_share_needed(size[rank], of) * of or share < LATE_SHARE:
            continue
        sites = s["seen"] or s["where"]
        total = sum(sites.values())
        where = [{"file": file, "line": line, "func": func, "share": round(n / total, 3)}
                 for (file, line, func), n in sites.most_common(MAX_WHERE)]
        out.append({"rank": rank, "waited_for_s": round(s["waited"], 3), "late_share": round(min(share, 1.0), 3),
                    "collectives": s["n"], "of": of, "lag_s": round(s["lag"] / s["n"], 4), "where": where,
                    "where_from": "samples" if s["seen"] else "calls", "samples": sum(s["seen"].values()),
                    "gc_s": round(s["gc"], 4), "clock_error_s": round(s.get("error", 0.0), 6)})
    out.sort(key=lambda x: (-x["waited_for_s"], x["rank"]))
    return out


def _site(f: dict) -> tuple[str, int, str]:
    return str(f.get("file")), int(f.get("line") or 0), str(f.get("func"))

