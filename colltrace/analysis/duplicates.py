"""Identical data where each rank should send its own (COLLTRACE_DIGEST).

With digests on, the input of every gather / all-gather / all-to-all carries a CRC-32 of its
bytes. When every sender of such a collective sent the very same bytes, call after call at the
same place, the ranks are almost certainly reading the same batches: a DataLoader without a
DistributedSampler, or one built before init_process_group. That is no hang, so it never
triggers COLLTRACE_ON_HANG; it is a finding because the run is silently wrong.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from colltrace.analysis.view import JobView
from colltrace.model.schema import COMPLETED

MIN_CALLS = 3          # identical calls at one place before it is called a pattern
MIN_SHARE = 0.9        # of the calls seen at that place
MIN_ELEMENTS = 16      # smaller inputs (a flag, a count) may well be equal on purpose


@dataclass
class Site:
    """One call site (group, op, user call chain) of digested collectives."""

    group: str
    op: str
    calls: int = 0
    identical: list = field(default_factory=list)   # (seq, {rank: record}) of the identical calls


def _elements(shapes) -> int:
    n = 0
    for s in shapes or ():
        k = 1
        for d in s:
            k *= int(d)
        n += k
    return n


def find(snap: JobView) -> list[Site]:
    """Call sites whose senders sent identical bytes in MIN_CALLS or more calls and in MIN_SHARE
    of the calls seen, most calls first."""
    by_coll: dict[tuple, dict[int, dict]] = {}
    for rank, view in snap.ranks.items():
        if not view.entry.get("digests"):
            continue   # the common case: digests off, nothing to read
        for r in view.records:
            if r.get("digest") is not None and r.get("state") == COMPLETED:
                by_coll.setdefault((r["group"], r["seq"]), {})[rank] = r
    sites: dict[tuple, Site] = {}
    for (group, seq), recs in sorted(by_coll.items()):
        sample = recs[min(recs)]
        root = sample.get("root")
        senders = {r: x for r, x in recs.items() if r != root}
        members = [m for m in snap.members(group) if m != root]
        if len(senders) < 2 or len(senders) < len(members):
            continue   # some sender's record is not in the window: cannot tell
        try:
            if _elements(sample.get("shapes")) < MIN_ELEMENTS:
                continue
        except (TypeError, ValueError):
            continue
        first = snap.ranks.get(min(recs))
        own = first.origins.user_frames if first is not None else (lambda fs: fs or [])
        chain = tuple((f.get("file"), f.get("line")) for f in own(sample.get("frames")))
        key = (group, str(sample.get("op")), chain)
        site = sites.get(key)
        if site is None:
            site = sites[key] = Site(group, str(sample.get("op")))
        site.calls += 1
        if len({x.get("digest") for x in senders.values()}) == 1:
            site.identical.append((seq, senders))
    out = [s for s in sites.values() if len(s.identical) >= MIN_CALLS and len(s.identical) >= MIN_SHARE * s.calls]
    out.sort(key=lambda s: (-len(s.identical), s.group, s.op))
    return out
