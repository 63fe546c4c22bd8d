"""The evidence a finding carries: each rank's entry (its state, its current record, its frames
marked with their origin, what the watchdog's probes saw), the finding's common fields, and the
patterns that tell which ranks to look at first (a call the others make routinely, a group's odd
one out). Facts only, as analysis/findings.py's verdicts put them together.
"""
from __future__ import annotations

from typing import TypeVar, cast

from colltrace.analysis.view import PENDING, JobView, RankView, Rec
from colltrace.model.finding import Finding
from colltrace.model.parts import GroupRef, LookFirst, RankPart, UntracedNote
from colltrace.model.schema import IN_FLIGHT, NOT_IN_COLLECTIVE, UNKNOWN, UNREADABLE, WAITING, Exit, Record

F = TypeVar("F", bound=Finding)

ROUTINE_SAMPLE = 8      # waiters per key sampled to tell routine calls from odd ones
ROUTINE_WINDOW = 64     # recent records per rank searched for the same call
QUEUED_SHOWN = 4        # calls queued behind a rank's pending one, described in its entry


def compact_record(raw: dict | None) -> Record | None:
    if not isinstance(raw, dict):
        return None
    return cast(Record, {k: raw.get(k) for k in ("op", "backend_op", "group", "seq", "state", "entered_at", "frames",
                                                 "p2p", "peer")
                         if k in raw})


UNTRACED_SITE = ("untraced",)


def call_site_of(view: RankView | None, raw) -> tuple:
    """A call site: the op and the chain of the rank's own frames (file, line) that made it."""
    if not isinstance(raw, dict):
        return ("?",)
    if raw.get("op") == "untraced" or raw.get("untraced"):
        return UNTRACED_SITE   # torch's own C++ collectives (DDP's all-reduces): one routine site
    frames = view.origins.user_frames(raw.get("frames")) if view is not None else []
    return (raw.get("op"),) + tuple((f.get("file"), f.get("line")) for f in frames)


def probe_fields(e: RankPart, entry: dict) -> None:
    """What the watchdog's probes saw of a rank in no collective: which route gave its stack,
    its activity over the wait (progressing / frozen / blocked_io), threads that died."""
    for k in ("stack_via", "stack_errors", "activity", "thread_exceptions"):
        if entry.get(k):
            e[k] = entry[k]


class Evidence:
    """What Analysis writes into findings about ranks, groups and calls, from one snapshot at `now`."""

    def __init__(self, snap: JobView, now: float):
        self.snap = snap
        self.now = now
        self._annotated: dict = {}   # id(frames list) -> (list, its copy with origins)

    def group_info(self, name) -> GroupRef:
        if name is None:
            return {"name": None, "desc": "", "ranks": []}
        g = self.snap.group(str(name))
        return {"name": g["name"], "desc": g["desc"], "ranks": g["ranks"]}

    def current(self, view: RankView) -> Rec | None:
        """Where a rank is: its newest blocking call, else (without a live stack to show, or the
        stack it crashed at) its newest async op."""
        for r in reversed(view.pending):
            if r.state == WAITING:
                return r
        # a rank that crashed of its own (not ended by its backend in a wait) died at its stack:
        # async work it had issued just before (DDP's, not yet seen to complete) is not where it was
        crashed = view.fatal and view.ended_by is None
        if view.pending and not (view.stack and (not view.dead or crashed)):
            return view.pending[-1]
        return None

    def entry(self, rank: int, rec=None, where: bool = False) -> RankPart:
        """The finding's view of one rank: the record it is in, or where it is instead."""
        v = self.snap.ranks.get(rank)
        if v is None:
            if rank in self.snap.unreadable:
                return {"state": UNREADABLE, "status": UNREADABLE, "error": self.snap.unreadable[rank]}
            return {"state": UNKNOWN, "status": UNKNOWN, "error": "no trace of this rank in the snapshot"}
        if rec is None and where:
            rec = self.current(v)
        if rec is not None:
            if isinstance(rec, Rec):
                # the record as recorded (a C-speed copy: 16k ranks wait in one finding)
                e = cast(RankPart, dict(rec.raw))
                if rec.p2p:
                    e["p2p"] = True
                    e["peer"] = rec.peer
                if rec.state in PENDING:
                    e["waited_s"] = round(self.now - rec.entered_at, 3)
                if rec.queued:   # the CPU ran ahead: later calls on the group wait behind this one
                    e["queued"] = [{"op": q.op, "seq": q.seq, "state": q.state, "frames": q.raw.get("frames") or []}
                                   for q in rec.queued[-QUEUED_SHOWN:]]
                    e["queued_count"] = len(rec.queued)
                if rec.parked_at is not None and rec.parked_at is not rec.raw.get("frames"):
                    e["parked"] = {"since": rec.parked, "frames": rec.parked_at}   # where it waits for it
                e.pop("wait", None)
                if rec.ended:
                    e["ended"] = rec.ended   # the backend's timeout (or NCCL's abort) ended this wait
                k = rec.key if where else None
                if k is not None and k.waits_for_ranks and k.targets():
                    e["waiting_for"] = k.targets()
            else:
                e = cast(RankPart, dict(rec))
            e["state"] = str(e.get("state"))
        else:
            e = {"state": NOT_IN_COLLECTIVE, "frames": v.stack or []}
            if v.native:
                e["native_frames"] = v.native
            if v.stack:
                e["stack_at"] = v.entry.get("stack_at")
            else:
                e["note"] = "no live stack available"
            probe_fields(e, v.entry)
            flight = [compact_record(r.raw) for r in v.pending if r.state == IN_FLIGHT]
            if flight:
                e["in_flight"] = flight[-3:]   # async work it issued and that has not completed
            last = compact_record(v.last_record())
            if last:
                e["last"] = last
        e["status"] = v.status
        if v.host is not None:
            e["host"] = v.host
        if v.pid is not None:
            e["pid"] = v.pid
        if v.dead:
            e["state"] = v.status
            e["exit"] = cast("Exit | None", v.exit)
            e["died_at"] = v.entry.get("died_at")
            if v.stack:
                e["stack"] = v.stack
                if rec is None:
                    e["frames"] = v.stack
            if v.native:
                e["native_frames"] = v.native
            if v.native_exception:
                e["native_exception"] = v.native_exception
            if v.native and v.native_other_thread:
                e["native_other_thread"] = True
        self.mark_origins(v, cast(dict, e))   # rewrites its frames' keys in place
        return e

    def annotated_frames(self, v: RankView, frames):
        """The frames with their origin marked (shared by the records of one stack)."""
        if not isinstance(frames, list):
            return frames
        hit = self._annotated.get(id(frames))
        if hit is None or hit[0] is not frames:
            hit = self._annotated[id(frames)] = (frames, v.origins.annotate(frames))
        return hit[1]

    def mark_origins(self, v: RankView, e: dict) -> None:
        for key in ("frames", "stack"):
            if key in e:
                e[key] = self.annotated_frames(v, e[key])
        for key in ("last",):
            if isinstance(e.get(key), dict) and "frames" in e[key]:
                e[key] = dict(e[key], frames=self.annotated_frames(v, e[key]["frames"]))
        if isinstance(e.get("parked"), dict):
            e["parked"] = dict(e["parked"], frames=self.annotated_frames(v, e["parked"].get("frames")))
        if isinstance(e.get("queued"), list):
            e["queued"] = [dict(q, frames=self.annotated_frames(v, q.get("frames"))) for q in e["queued"]]
        if isinstance(e.get("in_flight"), list):
            e["in_flight"] = [dict(x, frames=self.annotated_frames(v, x.get("frames"))) if isinstance(x, dict) else x
                              for x in e["in_flight"]]

    def pattern(self, rank: int, raw) -> str | None:
        """Whether a rank's call here follows its own history: "same" (it made this very call at
        this point before, or makes it routinely), "left" (at this point it always made another
        call), "new" (a call it never made, with history to compare), None (no history).
        The point is the collective just before on the group: what the rank called after it in
        earlier iterations."""
        v = self.snap.ranks.get(rank)
        if v is None or not isinstance(raw, dict):
            return None
        group, seq = raw["group"], raw["seq"]   # a record the view checked (view._record)
        cur = call_site_of(v, raw)
        prev = v.record_before(str(group), seq) if seq > 1 else None
        here = call_site_of(v, prev) if prev is not None else None
        chain = []
        for r in v.records[-ROUTINE_WINDOW:]:
            if r is raw or r is prev or r.get("p2p") or r["group"] != group:
                continue
            if r.get("seq_end", r["seq"]) >= (seq - 1 if prev is not None else seq):
                continue   # not earlier than this point
            chain.append(r)
        same = other = 0
        sites = [call_site_of(v, r) for r in chain]
        for a, b in zip(sites, sites[1:] + ([here] if here is not None else []), strict=False):
            if here is not None and a == here:
                if b == cur:
                    same += 1
                else:
                    other += 1
        seen = sum(1 for x in sites if x == cur)
        if here == UNTRACED_SITE:
            # torch's own collectives in a row (DDP's all-reduces, step after step): each one
            # followed by another is an earlier iteration at this point
            runs = self.untraced_runs(v, str(group), seq, chain + ([prev] if prev is not None else []))
            if cur == UNTRACED_SITE:
                same += runs
                seen += runs
            else:
                other += runs
        if same:
            return "same"
        if other:
            return "left"
        if seen:
            return "same"
        return "new" if len(chain) >= 2 else None

    def group_pattern(self, raw) -> str | None:
        """pattern() for the group's ops: after the op at the number just before this one, which
        op came next in earlier iterations. Marks as in pattern()."""
        group, seq, op = raw["group"], raw["seq"], str(raw.get("op"))
        ops = self.group_ops(group, seq)
        here = ops.get(seq - 1)
        if here is None:
            return None
        same = other = 0
        for p, o in ops.items():
            nxt = ops.get(p + 1)
            if o == here and nxt is not None and p + 1 < seq:
                if nxt == op:
                    same += 1
                else:
                    other += 1
        if same:
            return "same"
        if other:
            return "left"
        return "new" if sum(1 for o in ops.values() if o == op) == 0 and len(ops) >= 2 else None

    def group_ops(self, group: str, seq: int) -> dict[int, str]:
        """Number -> op for the group's collectives before `seq`, from any member that knows."""
        key = (group, seq)
        cache = self.__dict__.setdefault("_ops_cache", {})
        if key in cache:
            return cache[key]
        ops: dict[int, str] = {}
        for m in self.snap.members(group)[:ROUTINE_SAMPLE]:
            v = self.snap.ranks.get(m)
            if v is None:
                continue
            for r in v.records[-ROUTINE_WINDOW:]:
                if r["group"] != group or r.get("p2p") or r.get("op") == "untraced":
                    continue
                s0, s1 = r["seq"], r.get("seq_end", r["seq"])
                if s0 == s1 and s0 < seq:
                    ops.setdefault(s0, str(r.get("op")))
            for u in v.untraced:
                if u["group"] == group and u["seq"] < seq:
                    ops.setdefault(u["seq"], str(u.get("op")))
        cache[key] = ops
        return ops

    @staticmethod
    def untraced_runs(v: RankView, group: str, seq: int, recs) -> int:
        """How many times, before number `seq`, an untraced collective on the group was followed
        by another: within the untraced blocks of the records and the Flight Recorder's list."""
        n = 0
        for r in recs:
            if r.get("op") == "untraced" and not r.get("untraced"):
                n += max(0, min(r.get("seq_end", r["seq"]), seq - 1) - r["seq"])
        fr = {u["seq"] for u in v.untraced if u["group"] == group and u["seq"] < seq}
        return n + sum(1 for s in fr if s + 1 in fr)

    def odd_ones(self, classes: list[tuple[list[int], dict]]) -> tuple[int | None, str]:
        """Which class of ranks left its established pattern: (index, reason). Reasons: "left"
        (it made another call at this point before), "new" (a call it never made), "minority"
        (no history tells; the fewest ranks), "undecided" (neither history nor numbers tell)."""
        marks = [self.pattern(rs[0], raw) for rs, raw in classes]
        # Each rank's own call sites first; then the group's ops, which every member shared up to
        # this point (any member's records, or its Flight Recorder, tell what all of them did).
        for ms in (marks, [self.group_pattern(raw) for _, raw in classes]):
            for strong in ("left", "new"):
                odd = [i for i, m in enumerate(ms) if m == strong]
                if len(odd) == 1 and any(m == "same" for m in ms):
                    return odd[0], strong
        sizes = sorted(len(rs) for rs, _ in classes)
        if len(sizes) > 1 and sizes[0] < sizes[1]:
            return min(range(len(classes)), key=lambda i: len(classes[i][0])), "minority"
        return None, "undecided"

    def base(self, cls: type[F], key: str, name, seq, missing, ranks: dict[str, RankPart], **fields) -> F:
        """A finding of kind `cls` on group `name` with the fields every finding has, and this
        kind's `fields` (which may give `group` and `groups` as the ranks described them)."""
        if "groups" not in fields:
            names = {str(name)} if name is not None else set()
            for e in ranks.values():
                if e.get("group") is not None:
                    names.add(str(e["group"]))
                last = e.get("last")
                if isinstance(last, dict) and last.get("group") is not None:
                    names.add(str(last["group"]))
            fields["groups"] = {n: self.group_info(n) for n in sorted(names)}
        if "group" not in fields:
            fields["group"] = self.group_info(name)
        return cls(key=key, detected_at=self.now, seq=seq, missing_ranks=sorted(missing), ranks=ranks, **fields)

    def untraced_before(self, group: str, seq: int, ranks) -> list[UntracedNote]:
        """Counted-but-unseen collectives right before `seq`, for the first rank of each class."""
        out: list[UntracedNote] = []
        for rank in ranks:
            v = self.snap.ranks.get(rank)
            prev = v.record_before(group, seq) if v else None
            if isinstance(prev, dict) and prev.get("op") == "untraced":
                out.append({"group": group, "ranks": [rank], "count": prev.get("count", 1)})
        return out

    @staticmethod
    def rank_sorted_entries(pairs) -> dict[str, RankPart]:
        return {str(r): e for r, e in sorted(pairs, key=lambda x: x[0])}

    @staticmethod
    def first_class(table: dict[str, RankPart], ranks) -> list[int]:
        """The first of `ranks` and those doing the same thing at the same place (in a finding's
        rank table)."""
        rs = sorted(ranks)

        def key(e):
            fr = e.get("frames") or []
            return (e.get("state"), e.get("op"), e.get("group"), e.get("seq"),
                    tuple((x.get("file"), x.get("line")) for x in fr[-8:] if isinstance(x, dict)))
        k0 = key(table.get(str(rs[0])) or {})
        return [r for r in rs if key(table.get(str(r)) or {}) == k0]

    @staticmethod
    def look(why: str, classes: list[list[int]], odd: int | None) -> LookFirst:
        if odd is None:
            return {"ranks": sorted(r for rs in classes for r in rs), "rank": None, "reason": why,
                    "sides": [{"ranks": rs, "rank": rs[0]} for rs in classes]}
        others = [r for i, rs in enumerate(classes) if i != odd for r in rs]
        return {"ranks": classes[odd], "rank": classes[odd][0], "reason": why, "versus": sorted(others)}
