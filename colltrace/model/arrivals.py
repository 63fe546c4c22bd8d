"""Arrival digests: who came first and last to each recent collective, in a few numbers, so that
stragglers are found live on a job whose ranks' records do not travel (more than
host/tree.py's DETAIL_ALL_RANKS ranks: only vitals go up the tree).

Each host digests its own ranks' records: per collective (group and number) that all of its members
of that group entered, [members counted, the sum of their entry times, the first time, its rank,
the last time, its rank, the clocks' error bound]. A parent unites its children's digests with its
own, each child's times first put on the parent's clock (the child's measured offset taken off, its
bound added: host/clock.py); at the root a digest that counts every member of its group is one
collective's arrivals, which analysis/stragglers.py judges as it judges records: the last member's
lag behind the first, and the wait it caused (members x last - the sum). Only each group's
collectives of the last DIGEST_S travel (at most DIGEST_KEEP): every host's window then overlaps
what the root reads of the others, and a collective some host no longer holds is left out, never
miscounted.
"""
from __future__ import annotations

from colltrace.model.schema import is_clock

DIGEST_S = 2.0       # a host sends the collectives of each group entered this recently (before its newest)...
DIGEST_KEEP = 64     # ... at most this many: its parent's reads, one round to a level, fall well inside

N, SUM, FIRST, FIRST_RANK, LAST, LAST_RANK, ERR = range(7)


def digest(ranks: dict, groups: dict, keep: int = DIGEST_KEEP, within_s: float = DIGEST_S) -> dict:
    """{"<group>#<seq>": [n, sum, first, first_rank, last, last_rank, 0.0]} over the collectives
    these entries' records show every one of their members of that group entering (point-to-point
    and untraced ones left out): of each group, those entered within `within_s` of its newest,
    at most the `keep` most recent."""
    local: dict[str, int] = {}   # group -> how many of these ranks are its members (their progress names it)
    seen: dict[tuple[str, int], list] = {}
    for key, entry in ranks.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("records"), list):
            continue
        rank = entry.get("rank", key)
        if not str(rank).isdigit():
            continue
        rank = int(rank)
        progress = entry.get("progress")
        mine = (set(map(str, progress)) if isinstance(progress, dict) and progress
                else {str(r.get("group")) for r in entry["records"] if isinstance(r, dict)})
        for g in mine:
            local[g] = local.get(g, 0) + 1
        for r in entry["records"]:
            if not isinstance(r, dict) or r.get("p2p") or r.get("op") == "untraced":
                continue
            t, seq = r.get("entered_at"), r.get("seq")
            if not isinstance(t, (int, float)) or isinstance(t, bool) or type(seq) is not int:
                continue
            t = float(t)
            g = str(r.get("group"))
            d = seen.get((g, seq))
            if d is None:
                seen[(g, seq)] = [1, t, t, rank, t, rank, 0.0]
            else:
                _add(d, [1, t, t, rank, t, rank, 0.0])
    by_group: dict[str, list] = {}
    for (g, seq), d in seen.items():
        # every member here entered it (else: left out). Membership from the ranks' own progress:
        # a world group's member list is the whole job, too long to walk every round.
        if g in groups and d[N] == local.get(g):
            by_group.setdefault(g, []).append((seq, d))
    out = {}
    for g, got in by_group.items():
        got.sort(key=lambda x: x[0])
        newest = max(d[FIRST] for _, d in got)
        for seq, d in got[-keep:]:
            if d[FIRST] >= newest - within_s:
                out[f"{g}#{seq}"] = d
    return out


def _add(d: list, other: list) -> None:
    d[N] += other[N]
    d[SUM] += other[SUM]
    if other[FIRST] < d[FIRST]:
        d[FIRST], d[FIRST_RANK] = other[FIRST], other[FIRST_RANK]
    if other[LAST] > d[LAST]:
        d[LAST], d[LAST_RANK] = other[LAST], other[LAST_RANK]
    d[ERR] = max(d[ERR], other[ERR])


def _valid(d) -> bool:
    return (isinstance(d, list) and len(d) == 7 and all(type(x) in (int, float) for x in d)
            and type(d[FIRST_RANK]) is int and type(d[LAST_RANK]) is int and d[N] > 0)


def unite(own: dict | None, children: list[dict]) -> dict:
    """This host's digests and its children's ("arrivals" of each summary), on this host's clock:
    each child's times less its offset ("clock": [offset, bound]), its bound added to theirs. A
    child whose clock was not measured is taken as it is."""
    out = {k: list(d) for k, d in (own or {}).items() if _valid(d)}
    for s in children:
        got = s.get("arrivals")
        if not isinstance(got, dict):
            continue
        c = s.get("clock")
        shift, bound = (float(c[0]), float(c[1])) if is_clock(c) else (0.0, 0.0)
        for k, d in got.items():
            if not _valid(d):
                continue
            moved = [d[N], d[SUM] - d[N] * shift, d[FIRST] - shift, d[FIRST_RANK], d[LAST] - shift, d[LAST_RANK],
                     d[ERR] + bound]
            have = out.get(k)
            if have is None:
                out[k] = moved
            else:
                _add(have, moved)
    return out
