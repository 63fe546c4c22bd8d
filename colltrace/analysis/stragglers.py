"""Who makes everyone wait: per collective, each member's arrival lag (its entry time minus the
earliest member's), and per rank over the records: how often it came last, the time it made the
others wait, and that as a share of the time the records span. Facts only; a straggler is never a
finding (no exit code, no action).

Read from what the ranks already record (each record's `entered_at`): the hot path does nothing
more for it. Only collectives every member's record is there for are compared (a record window
that starts at different numbers on different ranks compares nothing it cannot), point-to-point
and untraced ones left out. The ranks' clocks are their hosts': on one host exact; across hosts
the lag carries the hosts' clock offset (NTP keeps it to about a millisecond; lags below NOISE_S
are nobody's).

A rank stands out only when it came last far more often than chance (an even job on a loaded
machine has every rank last now and then), in enough collectives, and the wait it caused is a
share of the job's time worth naming. `where`: the user's innermost frame of the late rank's call
of each collective it came late to (where it called from; where it was while the others waited
needs a sample of its stack, which these records do not hold), with each frame's share.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from colltrace.origins import user_frames

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
    times: tuple[tuple[float, int], ...]   # (entered_at, rank), earliest first
    frames: dict                           # rank -> its record's frames (its call site)

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
        t_last = self.times[-1][0]
        return sum(t_last - t for t, _ in self.times[:-1])

    def lags(self) -> dict[int, float]:
        """Each member's arrival lag behind the earliest member."""
        first = self.times[0][0]
        return {rank: t - first for t, rank in self.times}


def arrivals(snap: dict) -> list[Arrival]:
    """The collectives of a snapshot that every member recorded entering (point-to-point and
    untraced ones left out), in no particular order."""
    groups = snap.get("groups") or {}
    seen: dict[tuple[str, int], dict[int, tuple[float, list]]] = {}
    for key, entry in (snap.get("ranks") or {}).items():
        if not isinstance(entry, dict):
            continue
        rank = entry.get("rank", key)
        rank = int(rank) if str(rank).isdigit() else None
        for r in entry.get("records") or ():
            if rank is None or not isinstance(r, dict) or r.get("p2p") or r.get("op") == "untraced":
                continue
            t, seq = r.get("entered_at"), r.get("seq")
            if not isinstance(t, (int, float)) or isinstance(t, bool) or type(seq) is not int:
                continue
            seen.setdefault((str(r.get("group")), seq), {})[rank] = (float(t), r.get("frames") or [])
    out = []
    for (group, seq), got in seen.items():
        members = [m for m in (groups.get(group) or {}).get("ranks") or () if type(m) is int]
        if len(members) < 2 or len(got) != len(members) or set(got) != set(members):
            continue
        out.append(Arrival(group, seq, tuple(sorted((t, rank) for rank, (t, _) in got.items())),
                           {rank: frames for rank, (_, frames) in got.items()}))
    return out


def find(snap: dict) -> list[dict]:
    """Stragglers of a snapshot (docs/design.md), most wait caused first; [] when nobody stands out.
    Each: {"rank", "waited_for_s", "late_share", "collectives", "of", "lag_s", "where": [{"file",
    "line", "func", "share"}]}: `waited_for_s` sums, over the collectives it came last to, its
    lag behind each other member; `late_share` its lag behind the first arrival, summed, over the
    time the compared collectives span; `collectives` how many it came last to, of `of` compared."""
    return judge(arrivals(snap))


def judge(found: list[Arrival]) -> list[dict]:
    """Stragglers among these collectives (find's result, from arrivals kept over a window)."""
    compared: Counter = Counter()
    late: dict[int, dict] = {}
    first_t, last_t = None, None
    size: dict[int, int] = {}
    for a in found:
        times = a.times
        first_t = times[0][0] if first_t is None else min(first_t, times[0][0])
        last_t = times[-1][0] if last_t is None else max(last_t, times[-1][0])
        for _, rank in times:
            compared[rank] += 1
            size[rank] = max(size.get(rank, 0), len(times))
        lag = a.lag_s
        if lag < NOISE_S:
            continue
        who = a.last
        s = late.setdefault(who, {"n": 0, "waited": 0.0, "lag": 0.0, "where": Counter()})
        s["n"] += 1
        s["lag"] += lag
        s["waited"] += a.waited_s
        mine = user_frames(a.frames.get(who) or [])
        if mine:
            f = mine[-1]
            s["where"][(str(f.get("file")), int(f.get("line") or 0), str(f.get("func")))] += 1
    span = (last_t - first_t) if first_t is not None and last_t is not None else 0.0
    out = []
    for rank, s in late.items():
        of = compared[rank]
        share = s["lag"] / span if span > 0 else 0.0
        if s["n"] < MIN_COLLECTIVES or s["n"] < _last_share_needed(size[rank], of) * of or share < LATE_SHARE:
            continue
        total = sum(s["where"].values())
        where = [{"file": file, "line": line, "func": func, "share": round(n / total, 3)}
                 for (file, line, func), n in s["where"].most_common(MAX_WHERE)]
        out.append({"rank": rank, "waited_for_s": round(s["waited"], 3), "late_share": round(min(share, 1.0), 3),
                    "collectives": s["n"], "of": of, "lag_s": round(s["lag"] / s["n"], 4), "where": where})
    out.sort(key=lambda x: (-x["waited_for_s"], x["rank"]))
    return out
