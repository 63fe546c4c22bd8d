"""The verdicts: mismatches, dead ranks, deadlocks, stalls and unmatched p2p as finding dicts
(docs/findings.md), one finding per problem, reported where the problem starts.

Facts only, no English: who, where (frames marked with their origin: the user's, a framework's,
torch's), and which ranks to look at first and why (`look_first`). colltrace.reporters.text
turns them into the summary paragraph and the advice.

Priority when one situation could be read several ways: mismatch, dead_rank, deadlock, then
stall / unmatched_p2p. Ranks stuck only because of a reported problem are listed in its
`behind` field instead of getting findings of their own.
"""
from __future__ import annotations

from colltrace.analysis import batches, duplicates
from colltrace.analysis.matching import Mismatch, check_collective
from colltrace.analysis.view import PENDING, Rec, RankView, Snapshot, to_int
from colltrace.analysis.waitgraph import Key, WaitGraph, coll_name
from colltrace.model.schema import ALIVE, EXITED, IN_FLIGHT, NOT_IN_COLLECTIVE, UNKNOWN, UNREADABLE, WAITING

MAX_ALSO_MISSING = 64   # other absent members described in a dead_rank finding (all are listed)
MISMATCH_SETTLE_S = 0.3  # a mismatch waits this long after the last arrival for members still coming
DEATH_SETTLE_S = 0.3     # a rank dead with nobody seen waiting yet: its consequences show within this
ROUTINE_SAMPLE = 8      # waiters per key sampled to tell routine calls from odd ones
ROUTINE_WINDOW = 64     # recent records per rank searched for the same call
PRIORITY = {"mismatch": 0, "dead_rank": 1, "deadlock": 2, "stall": 3, "unmatched_p2p": 3, "duplicate_data": 5}
# Kinds that mean the job is stuck or broken now: COLLTRACE_ON_HANG acts on these alone.
HANG_KINDS = frozenset(("mismatch", "dead_rank", "deadlock", "stall", "unmatched_p2p"))


def _compact(raw: dict | None) -> dict | None:
    if not isinstance(raw, dict):
        return None
    return {k: raw.get(k) for k in ("op", "backend_op", "group", "seq", "state", "entered_at", "frames", "p2p", "peer")
            if k in raw}


UNTRACED_SITE = ("untraced",)


def _site(view: RankView | None, raw) -> tuple:
    """A call site: the op and the chain of the rank's own frames (file, line) that made it."""
    if not isinstance(raw, dict):
        return ("?",)
    if raw.get("op") == "untraced" or raw.get("untraced"):
        return UNTRACED_SITE   # torch's own C++ collectives (DDP's all-reduces): one routine site
    frames = view.origins.user_frames(raw.get("frames")) if view is not None else []
    return (raw.get("op"),) + tuple((f.get("file"), f.get("line")) for f in frames)


def _frame_refs(f: dict) -> None:
    """Point look_first at frames: the index, in its rank's `frames`, of the user's innermost own
    frame ("user_frame") and of the framework call it went through ("framework_frame"); None
    where there is none."""
    look = f.get("look_first")
    if not isinstance(look, dict) or look.get("rank") is None:
        return
    frames = ((f.get("ranks") or {}).get(str(look["rank"])) or {}).get("frames")
    frames = frames if isinstance(frames, list) else []
    i = next((n for n in range(len(frames) - 1, -1, -1)
              if isinstance(frames[n], dict) and frames[n].get("origin") == "user"), None)
    nxt = frames[i + 1] if i is not None and i + 1 < len(frames) else None
    look["user_frame"] = i
    look["framework_frame"] = i + 1 if i is not None and isinstance(nxt, dict) and nxt.get("origin") == "framework" else None


def _probe_fields(e: dict, entry: dict) -> None:
    """What the watchdog's probes saw of a rank in no collective: which route gave its stack,
    its activity over the wait (progressing / frozen / blocked_io), threads that died."""
    for k in ("stack_via", "stack_errors", "activity", "thread_exceptions"):
        if entry.get(k):
            e[k] = entry[k]



class Verdicts:
    def __init__(self, snap: Snapshot, stall_s: float, now: float):
        self.snap = snap
        self.stall_s = stall_s
        self.now = now
        self.graph = WaitGraph(snap, now, stall_s)
        self._annotated: dict = {}   # id(frames list) -> (list, its copy with origins)

    # -- the pass ----------------------------------------------------------------------------
    def run(self) -> list[dict]:
        g = self.graph
        mismatches = self._mismatches()
        g.build(set(mismatches))
        deadlocks, dead_causes, stall_roots = self._decide()
        made: list[tuple[dict, list[int], set[int]]] = []   # (finding, its graph nodes, its own ranks)
        for mm in mismatches.values():
            if self._settled(mm):   # unsettled ones still keep their key out of deadlocks and stalls
                made.append(self._mismatch(mm))
        dead = set(dead_causes)
        settling: set[int] = set()   # dead alone a moment ago: reported next round, with its consequences
        for rank, view in self.snap.ranks.items():
            if view.alone and rank not in dead:   # crashed or killed alone: worth a finding before anyone waits
                (settling if self._just_died(view) else dead).add(rank)
        dead.update(self._raised_first(dead | settling) - settling)
        if any(self.snap.ranks[r].fatal for r in dead | settling):
            # A rank that died of a signal is the first cause: a peer's exception at the same time
            # ("Connection closed by peer" from DDP's untraced all-reduce) is its consequence, even
            # when that exception is read before the crash is seen.
            dead = {r for r in dead if not (self.snap.ranks[r].status == EXITED
                                            and (self.snap.ranks[r].exit or {}).get("exception"))}
        for rank in sorted(dead):
            made.append(self._dead(rank))
        for comp in deadlocks:
            made.append(self._deadlock(comp))
        for k in stall_roots:
            made.append(self._stall(k))
        fed = batches.findings(self)   # what each rank fed its DDP/FSDP model
        for site in duplicates.find(self.snap):
            dup = self._duplicate(site)
            if not any(dup[2] <= own for _, _, own in fed):   # the same ranks' batches: one problem, named once
                made.append(dup)
        made.extend(fed)
        made.sort(key=lambda m: (PRIORITY.get(m[0]["kind"], 9), m[0]["key"]))
        # Who is stuck behind each problem: each rank credited once, to the first problem.
        seen = {n for _, nodes, _ in made for n in nodes}
        for f, nodes, own in made:
            behind = set(g.upstream(nodes, seen))
            for n in nodes:
                behind.update(self.extra_behind.get(n, ()))
            after = sorted(behind - own)
            if after:
                f["behind"] = after
        out = []
        for f, _, _ in made:
            _frame_refs(f)
            if self.snap.unreadable:
                f["unreadable_ranks"] = list(self.snap.unreadable)
                f["unreadable"] = {str(r): e for r, e in self.snap.unreadable.items()}
            out.append(f)
        return out

    def _just_died(self, view) -> bool:
        """Seen dead a moment ago with nobody waiting for it yet, while other ranks still run: their
        collectives with it fail, or they enter the next one, within milliseconds. The finding
        waits DEATH_SETTLE_S for them, so that it names who waits and whose collective failed,
        not "no rank waits". Once no other rank is alive (the launcher ended them, or the files
        are read after the job) there is nothing more to see: it is named at once."""
        if view.died_at is None or self.now - view.died_at >= DEATH_SETTLE_S:
            return False
        return any(v.status == ALIVE for r, v in self.snap.ranks.items() if r != view.rank)

    def _mismatches(self) -> dict[str, Mismatch]:
        """Mismatches among the collectives someone is pending in or that failed: the ones that
        hang or break a job. (Completed ones are not re-read on every round: too costly at scale.)"""
        candidates: dict[tuple, list[tuple[int, dict]]] = {}
        for k in self.graph.keys.values():
            if not k.p2p:
                candidates[(k.group, k.seq)] = [(w.rank, w.raw) for w in k.waiters]
        for rank, view in self.snap.ranks.items():
            for raw in view.failed:
                try:
                    if raw.get("p2p") or raw.get("backend_op") in ("send", "recv"):
                        continue
                    candidates.setdefault((str(raw["group"]), to_int(raw["seq"])), []).append((rank, raw))
                except (KeyError, TypeError, ValueError):
                    continue
        out = {}
        for (group, seq) in sorted(candidates):
            mm = check_collective(self.snap, group, seq, candidates[(group, seq)])
            if mm is not None:
                out[coll_name(group, seq)] = mm
        return out

    def _settled(self, mm: Mismatch) -> bool:
        """A mismatch is certain once two ranks disagree, but members still arriving a moment
        later belong in the same finding: wait MISMATCH_SETTLE_S after the last arrival unless
        every member is in."""
        if not mm.not_entered:
            return True
        times = []
        for raw in mm.records.values():
            try:
                times.append(float(raw.get("entered_at") or 0.0))
            except (AttributeError, TypeError, ValueError):
                continue
        return not times or self.now - max(times) >= MISMATCH_SETTLE_S

    def _decide(self):
        """One pass over the components, sinks first: a cycle is a deadlock; a dead rank someone
        waits for is a cause; a key old enough that nothing downstream explains is a stall."""
        g = self.graph
        comps = g.components()
        comp_of = [-1] * len(g.adj)
        cause_of: list[int | None] = []     # per component: the cause node that explains it
        deadlocks, dead_causes, stall_roots = [], [], []
        for ci, comp in enumerate(comps):
            for v in comp:
                comp_of[v] = ci
            downstream = None
            for v in comp:
                for w in g.adj[v]:
                    cw = comp_of[w]
                    if cw != ci and cause_of[cw] is not None:
                        downstream = cause_of[cw]
                        break
                if downstream is not None:
                    break
            here = False
            if len(comp) > 1:
                here = True
                if not any(g.is_key(v) and g.key_at(v).mismatch for v in comp):
                    deadlocks.append(comp)
            else:
                v = comp[0]
                if g.is_key(v):
                    k = g.key_at(v)
                    if k.mismatch:
                        here = True
                    elif downstream is None and g.age(k) >= self.stall_s:
                        here = True
                        stall_roots.append(k)
                else:
                    view = self.snap.ranks.get(g.rank_at(v))
                    if view is not None and view.cause and g.rev[v]:
                        here = True
                        dead_causes.append(g.rank_at(v))
            cause_of.append(comp[0] if here else downstream)
        # A collective every member entered that does not complete, on ranks stuck in a problem
        # explained elsewhere, is most likely a consequence of it (NCCL: kernels and syncs queue
        # behind the stuck one). It joins that problem instead of being one of its own.
        self.extra_behind: dict[int, set[int]] = {}
        kept = []
        for k in stall_roots:
            explained_by = None
            if not k.p2p and not k.targets():
                for w in k.waiters:
                    for k2 in g.out_keys.get(w.rank, ()):
                        c = cause_of[comp_of[k2.node]] if k2 is not k else None
                        if c is not None and c != k.node:
                            explained_by = c
                            break
                    if explained_by is not None:
                        break
            if explained_by is None:
                kept.append(k)
            else:
                self.extra_behind.setdefault(explained_by, set()).update(w.rank for w in k.waiters)
        stall_roots = kept
        return deadlocks, dead_causes, stall_roots

    # -- pieces of a finding ---------------------------------------------------------------------
    def group_info(self, name) -> dict:
        if name is None:
            return {"name": None, "desc": "", "ranks": []}
        g = self.snap.group(str(name))
        return {"name": g["name"], "desc": g["desc"], "ranks": g["ranks"]}

    def current(self, view: RankView) -> Rec | None:
        """Where a rank is: its newest blocking call, else (without a live stack to show) its
        newest async op."""
        for r in reversed(view.pending):
            if r.state == WAITING:
                return r
        if view.pending and not (view.stack and not view.dead):
            return view.pending[-1]
        return None

    def entry(self, rank: int, rec=None, where: bool = False) -> dict:
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
                e = dict(rec.raw)   # the record as recorded (a C-speed copy: 16k ranks wait in one finding)
                if rec.p2p:
                    e["p2p"] = True
                    e["peer"] = rec.peer
                if rec.state in PENDING:
                    e["waited_s"] = round(self.now - rec.entered_at, 3)
                k = rec.key if where else None
                if k is not None and k.waits_for_ranks and k.targets():
                    e["waiting_for"] = k.targets()
            else:
                e = dict(rec)
            e["state"] = str(e.get("state"))
        else:
            e = {"state": NOT_IN_COLLECTIVE, "frames": v.stack or []}
            if v.stack:
                e["stack_at"] = v.entry.get("stack_at")
            else:
                e["note"] = "no live stack available"
            _probe_fields(e, v.entry)
            flight = [_compact(r.raw) for r in v.pending if r.state == IN_FLIGHT]
            if flight:
                e["in_flight"] = flight[-3:]   # async work it issued and that has not completed
            last = _compact(v.last_record())
            if last:
                e["last"] = last
        e["status"] = v.status
        if v.host is not None:
            e["host"] = v.host
        if v.pid is not None:
            e["pid"] = v.pid
        if v.dead:
            e["state"] = v.status
            e["exit"] = v.exit
            e["died_at"] = v.entry.get("died_at")
            if v.stack:
                e["stack"] = v.stack
                if rec is None:
                    e["frames"] = v.stack
        self._mark_origins(v, e)
        return e

    def _frames(self, v: RankView, frames):
        """The frames with their origin marked (shared by the records of one stack)."""
        if not isinstance(frames, list):
            return frames
        hit = self._annotated.get(id(frames))
        if hit is None or hit[0] is not frames:
            hit = self._annotated[id(frames)] = (frames, v.origins.annotate(frames))
        return hit[1]

    def _mark_origins(self, v: RankView, e: dict) -> None:
        for key in ("frames", "stack"):
            if key in e:
                e[key] = self._frames(v, e[key])
        for key in ("last",):
            if isinstance(e.get(key), dict) and "frames" in e[key]:
                e[key] = dict(e[key], frames=self._frames(v, e[key]["frames"]))
        if isinstance(e.get("in_flight"), list):
            e["in_flight"] = [dict(x, frames=self._frames(v, x.get("frames"))) if isinstance(x, dict) else x
                              for x in e["in_flight"]]

    # -- the job's own history: what a rank did at this point before ------------------------------
    def pattern(self, rank: int, raw) -> str | None:
        """Whether a rank's call here follows its own history: "same" (it made this very call at
        this point before, or makes it routinely), "left" (at this point it always made another
        call), "new" (a call it never made, with history to compare), None (no history).
        The point is the collective just before on the group: what the rank called after it in
        earlier iterations."""
        v = self.snap.ranks.get(rank)
        if v is None or not isinstance(raw, dict):
            return None
        group = raw.get("group")
        cur = _site(v, raw)
        try:
            seq = to_int(raw.get("seq"))
        except (TypeError, ValueError):
            return None
        prev = v.record_before(str(group), seq) if seq > 1 else None
        here = _site(v, prev) if prev is not None else None
        chain = []
        for r in v.records[-ROUTINE_WINDOW:]:
            if r is raw or r is prev or not isinstance(r, dict) or r.get("p2p") or r.get("group") != group:
                continue
            try:
                if to_int(r.get("seq_end", r.get("seq"))) >= (seq - 1 if prev is not None else seq):
                    continue   # not earlier than this point
            except (TypeError, ValueError):
                continue
            chain.append(r)
        same = other = 0
        sites = [_site(v, r) for r in chain]
        for a, b in zip(sites, sites[1:] + ([here] if here is not None else [])):
            if here is not None and a == here:
                if b == cur:
                    same += 1
                else:
                    other += 1
        seen = sum(1 for x in sites if x == cur)
        if here == UNTRACED_SITE:
            # torch's own collectives in a row (DDP's all-reduces, step after step): each one
            # followed by another is an earlier iteration at this point
            runs = self._untraced_runs(v, str(group), seq, chain + ([prev] if prev is not None else []))
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
        try:
            group, seq, op = str(raw["group"]), to_int(raw["seq"]), str(raw.get("op"))
        except (KeyError, TypeError, ValueError):
            return None
        ops = self._group_ops(group, seq)
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

    def _group_ops(self, group: str, seq: int) -> dict[int, str]:
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
                try:
                    if r.get("group") != group or r.get("p2p") or r.get("op") == "untraced":
                        continue
                    s0, s1 = to_int(r["seq"]), to_int(r.get("seq_end", r["seq"]))
                except (AttributeError, KeyError, TypeError, ValueError):
                    continue
                if s0 == s1 and s0 < seq:
                    ops.setdefault(s0, str(r.get("op")))
            for u in v.untraced:
                try:
                    if str(u["group"]) == group and to_int(u["seq"]) < seq:
                        ops.setdefault(to_int(u["seq"]), str(u.get("op")))
                except (KeyError, TypeError, ValueError):
                    continue
        cache[key] = ops
        return ops

    @staticmethod
    def _untraced_runs(v: RankView, group: str, seq: int, recs) -> int:
        """How many times, before number `seq`, an untraced collective on the group was followed
        by another: within the untraced blocks of the records and the Flight Recorder's list."""
        n = 0
        for r in recs:
            if isinstance(r, dict) and r.get("op") == "untraced" and not r.get("untraced"):
                try:
                    n += max(0, min(to_int(r.get("seq_end", r["seq"])), seq - 1) - to_int(r["seq"]))
                except (KeyError, TypeError, ValueError):
                    continue
        fr = set()
        for u in v.untraced:
            try:
                if str(u["group"]) == group and to_int(u["seq"]) < seq:
                    fr.add(to_int(u["seq"]))
            except (KeyError, TypeError, ValueError):
                continue
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

    def _base(self, kind: str, key: str, group, seq, missing, ranks: dict) -> dict:
        f = {"kind": kind, "key": key, "detected_at": self.now, "summary": "", "advice": "",
             "group": self.group_info(group), "seq": seq, "missing_ranks": sorted(missing), "ranks": ranks}
        names = {str(group)} if group is not None else set()
        for e in ranks.values():
            if e.get("group") is not None:
                names.add(str(e["group"]))
            last = e.get("last")
            if isinstance(last, dict) and last.get("group") is not None:
                names.add(str(last["group"]))
        f["groups"] = {n: self.group_info(n) for n in sorted(names)}
        return f

    def _untraced_before(self, group: str, seq: int, ranks) -> list[dict]:
        """Counted-but-unseen collectives right before `seq`, for the first rank of each class."""
        out = []
        for rank in ranks:
            v = self.snap.ranks.get(rank)
            prev = v.record_before(group, seq) if v else None
            if isinstance(prev, dict) and prev.get("op") == "untraced":
                out.append({"group": group, "ranks": [rank], "count": prev.get("count", 1)})
        return out

    @staticmethod
    def _rank_sorted_entries(pairs) -> dict:
        return {str(r): e for r, e in sorted(pairs, key=lambda x: x[0])}

    # -- the verdicts ------------------------------------------------------------------------------
    def _mismatch(self, mm: Mismatch):
        ranks = self._rank_sorted_entries((r, self.entry(r, raw)) for r, raw in mm.records.items())
        f = self._base("mismatch", f"mismatch:{mm.group}:{mm.seq}", mm.group, mm.seq, mm.not_entered, ranks)
        f["differs"] = mm.differs
        f["classes"] = mm.classes
        notes = self._untraced_before(mm.group, mm.seq, [c["ranks"][0] for c in mm.classes])
        if notes:
            f["untraced_before"] = notes
        cs = [(sorted(c["ranks"]), mm.records[sorted(c["ranks"])[0]]) for c in mm.classes]
        odd, why = self.odd_ones(cs)
        f["look_first"] = self._look(why, [rs for rs, _ in cs], odd)
        nodes = []
        k = self.graph.keys.get(coll_name(mm.group, mm.seq))
        if k is not None:
            nodes.append(k.node)
        return f, nodes, set(mm.records) | set(mm.not_entered)

    def _dead(self, rank: int):
        g = self.graph
        v = self.snap.ranks[rank]
        node = g.node_rank.get(rank)
        keys = [g.key_at(u) for u in (g.rev[node] if node is not None else []) if g.is_key(u)]
        keys.sort(key=lambda k: (-len(k.waiters), k.name))
        pairs = [(rank, self.entry(rank, where=True))]
        waiting: list[dict] = []
        own = {rank}
        for k in keys:
            rs = sorted({w.rank for w in k.waiters})
            waiting.append({"key": k.name, "group": k.group, "seq": k.seq, "op": k.waiters[0].op, "p2p": k.p2p,
                            "ranks": rs, "waited_s": round(g.age(k), 3)})
            for w in k.waiters:
                if w.rank not in own:
                    own.add(w.rank)
                    pairs.append((w.rank, self.entry(w.rank, w)))
        # Other members those collectives still miss: where they are tells whether they would
        # have come (busy elsewhere) or are stuck too (DDP's untraced all-reduce with the dead rank).
        also = sorted({m for k in keys for m in k.targets() if m not in own})
        for m in also[:MAX_ALSO_MISSING]:
            own.add(m)
            pairs.append((m, self.entry(m, where=True)))
        failed = self._failed_because(rank)
        for item in failed:
            for r in item["ranks"]:
                if r not in own:
                    own.add(r)
                    pairs.append((r, self.entry(r, item["records"][r])))
            del item["records"]
        last = v.last_record()
        group: str | None
        seq: int | None
        if keys:
            group, seq, missing = keys[0].group, keys[0].seq, [rank] if rank in keys[0].missing else []
        elif failed:
            group, seq, missing = failed[0]["group"], failed[0]["seq"], [rank] if failed[0]["missing"] else []
        else:
            group = last.get("group") if isinstance(last, dict) else None
            seq = last.get("seq") if isinstance(last, dict) else None
            missing = []
        pid = v.entry.get("pid")
        f = self._base("dead_rank", f"dead_rank:{rank}" + (f":{pid}" if pid else ""), group, seq, missing,
                       self._rank_sorted_entries(pairs))
        f["rank"] = rank
        f["exit"] = v.exit
        f["died_at"] = v.entry.get("died_at")
        f["last_collective"] = _compact(last)
        if f["last_collective"] and "frames" in f["last_collective"]:
            f["last_collective"]["frames"] = self._frames(v, f["last_collective"]["frames"])
        f["waiting"] = waiting
        f["failed"] = failed
        if also:
            f["also_missing"] = also
        if waiting:
            f["waited_s"] = max(w["waited_s"] for w in waiting)
        exc = (v.exit or {}).get("exception")
        why = ("error" if exc else "stack" if v.stack else "signal" if (v.exit or {}).get("signal") else "vanished")
        f["look_first"] = {"ranks": [rank], "rank": rank, "reason": why}
        return f, ([node] if node is not None else []), own

    def _raised_first(self, dead: set[int]) -> set[int]:
        """Ranks that exited with an exception while others were in a collective with them: the
        others' collectives failed because of it (gloo: "Connection closed by peer"), before anyone
        was seen waiting. Their own exceptions, consequences, name no rank and get no finding."""
        out = set()
        for rank, view in self.snap.ranks.items():
            if (rank not in dead and view.status == EXITED and (view.exit or {}).get("exception") and view.cause
                    and not view.failed):   # its own collective failed first: a consequence
                if any(item["missing"] for item in self._failed_because(rank)):
                    out.add(rank)
        return out

    def _failed_because(self, rank: int) -> list[dict]:
        """Collectives that failed on other ranks because this one is gone (gloo: "Connection
        closed by peer"): on a group it belongs to, at a number it never entered or died inside;
        or a p2p op with it. One item per (group, number, op), biggest first."""
        dead = self.snap.ranks[rank]
        out: dict[tuple, dict] = {}
        for other, view in self.snap.ranks.items():
            if other == rank:
                continue
            for raw in view.failed:
                try:
                    group, seq = str(raw["group"]), to_int(raw["seq"])
                    p2p = bool(raw.get("p2p"))
                    if p2p:
                        if raw.get("peer") != rank:
                            continue
                        missing = True
                    else:
                        if rank not in self.snap.members(group):
                            continue
                        missing = dead.entered(group) < seq
                        if not missing and dead.completed(group) >= seq:
                            continue   # it finished that one: the failure is not its doing
                except (KeyError, TypeError, ValueError):
                    continue
                item = out.setdefault((group, seq, str(raw.get("op")), p2p), {
                    "group": group, "seq": seq, "op": raw.get("op"), "p2p": p2p, "missing": missing,
                    "ranks": [], "error": raw.get("error"), "records": {}})
                item["ranks"].append(other)
                item["records"][other] = raw
        return sorted(out.values(), key=lambda i: (-len(i["ranks"]), i["group"], i["seq"]))

    def _routine(self, k: Key) -> float:
        """How many times, on average, k's waiters made the very same call (op and chain of user
        frames) in their recent records. A few waiters are sampled: 16k alike tell no more."""
        total = 0
        sample = k.waiters[:ROUTINE_SAMPLE]
        for w in sample:
            view = self.snap.ranks.get(w.rank)
            chain = _site(view, w.raw)
            for r in (view.records[-ROUTINE_WINDOW:] if view is not None else ()):
                if r is not w.raw and isinstance(r, dict) and r.get("op") == w.op and _site(view, r) == chain:
                    total += 1
        return total / len(sample) if sample else 0.0

    def _deadlock(self, comp: list[int]):
        g = self.graph
        keys = [g.key_at(v) for v in comp if g.is_key(v)]
        in_comp = {g.rank_at(v) for v in comp if not g.is_key(v)}
        # Look first at the odd call out: routine traffic (a gather every step) is rarely where a
        # deadlock starts; a call the waiters seldom make (a barrier in checkpoint code) is.
        marks = {k.name: self.pattern(k.waiters[0].rank, k.waiters[0].raw) for k in keys}
        keys.sort(key=lambda k: (marks[k.name] not in ("left", "new"), self._routine(k),
                                 -sum(1 for w in k.waiters if w.rank in in_comp), len(k.targets()), k.name))
        primary = keys[0]
        comp_nodes = set(comp)
        # the cycle's keys in the order one follows it from the primary
        order, seen, todo = [], set(), [primary]
        while todo:
            k = todo.pop(0)
            if k.name in seen:
                continue
            seen.add(k.name)
            order.append(k)
            for r in sorted(set(k.targets()) & in_comp):
                for u in g.adj[g.node_rank[r]]:
                    if u in comp_nodes:
                        todo.append(g.key_at(u))
        order += [k for k in keys if k.name not in seen]
        pairs, own = [], set()
        for k in order:
            for w in k.waiters:
                if w.rank not in own:
                    own.add(w.rank)
                    pairs.append((w.rank, self.entry(w.rank, w)))
        for k in order:
            for r in k.targets():
                if r not in own:
                    own.add(r)
                    pairs.append((r, self.entry(r, where=True)))
        ranks = self._rank_sorted_entries(pairs)
        f = self._base("deadlock", "deadlock:" + ",".join(sorted(k.name for k in keys)), primary.group,
                       primary.seq, primary.targets(), ranks)
        cycle = []
        for k in order:
            item = {"key": k.name, "group": k.group, "seq": k.seq, "p2p": k.p2p, "op": k.waiters[0].op,
                    "waiting": sorted({w.rank for w in k.waiters}), "missing": sorted(set(k.targets()))}
            if k.p2p:
                item["peer"] = k.waiters[0].peer
                item["posted"] = k.posted
            cycle.append(item)
        f["cycle"] = cycle
        f["waited_s"] = round(self.now - min(k.first_entered for k in keys), 3)
        # the odd call out: the key whose waiters left their own pattern, else the least routine
        f["look_first"] = {"ranks": cycle[0]["waiting"], "rank": primary.waiters[0].rank, "key": primary.name,
                           "reason": marks[primary.name] if marks[primary.name] in ("left", "new") else "odd_call"}
        return f, list(comp), own

    def _stall(self, k: Key):
        if k.p2p:
            return self._p2p(k)
        g = self.graph
        pairs = [(w.rank, self.entry(w.rank, w)) for w in k.waiters]
        own = {w.rank for w in k.waiters}
        targets = k.missing + k.unknown
        for m in targets:
            if m not in own:
                own.add(m)
                pairs.append((m, self.entry(m, where=True)))
        stage = "arrival" if targets else "completion"
        key = f"stall:{k.group}:{k.seq}" + (":completion" if stage == "completion" else "")
        f = self._base("stall", key, k.group, k.seq, k.missing, self._rank_sorted_entries(pairs))
        f["stage"] = stage
        f["waited_s"] = round(g.age(k), 3)
        f["waiting"] = sorted({w.rank for w in k.waiters})
        if k.unknown:
            f["unknown_ranks"] = sorted(k.unknown)
        notes = self._untraced_before(k.group, k.seq, f["waiting"][:1])
        if notes:
            f["untraced_before"] = notes
        if stage == "completion":
            f["completed_ranks"] = sorted(set(self.snap.members(k.group)) - own)
            f["look_first"] = {"ranks": f["waiting"], "rank": f["waiting"][0], "reason": "backend"}
        else:
            # The waiters' own history first: a rank that left its established pattern to enter
            # this collective (a barrier in a rank-conditional branch) is the odd one, not the
            # ranks doing what they always do. Otherwise the ranks that never arrive.
            w = k.waiters[0]
            mark = self.pattern(w.rank, w.raw)
            if mark in ("left", "new") and self._absent_routine(targets, k):
                f["look_first"] = {"ranks": f["waiting"], "rank": w.rank, "reason": mark, "versus": sorted(targets)}
            else:
                first = self._first_class(f, targets)
                f["look_first"] = {"ranks": first, "rank": first[0], "reason": "missing"}
        return f, [k.node], own

    def _absent_routine(self, targets, k: Key) -> bool:
        """Whether the ranks a collective waits for are busy with their routine: each readable,
        alive, and in a collective it made at that point before (one in no collective, stuck
        in a data loader say, may well be the problem itself)."""
        for m in targets:
            v = self.snap.ranks.get(m)
            if v is None or v.dead:
                return False
            cur = self.current(v)
            if cur is None:
                cur = self._untraced_now(v)
            if cur is None or self.pattern(m, cur.raw if isinstance(cur, Rec) else cur) != "same":
                return False
        return bool(targets)

    def _untraced_now(self, v: RankView):
        """The collective the Flight Recorder says the rank is in, untraced (DDP's all-reduce)."""
        for u in v.untraced[-1:]:
            try:
                return v.untraced_at(str(u["group"]), to_int(u["seq"]))
            except (KeyError, TypeError, ValueError):
                return None
        return None

    @staticmethod
    def _first_class(f: dict, ranks) -> list[int]:
        """The first of `ranks` and those doing the same thing at the same place."""
        table = f["ranks"]
        rs = sorted(ranks)

        def key(e):
            fr = e.get("frames") or []
            return (e.get("state"), e.get("op"), e.get("group"), e.get("seq"),
                    tuple((x.get("file"), x.get("line")) for x in fr[-8:] if isinstance(x, dict)))
        k0 = key(table.get(str(rs[0])) or {})
        return [r for r in rs if key(table.get(str(r)) or {}) == k0]

    @staticmethod
    def _look(why: str, classes: list[list[int]], odd: int | None) -> dict:
        if odd is None:
            return {"ranks": sorted(r for rs in classes for r in rs), "rank": None, "reason": why,
                    "sides": [{"ranks": rs, "rank": rs[0]} for rs in classes]}
        others = [r for i, rs in enumerate(classes) if i != odd for r in rs]
        return {"ranks": classes[odd], "rank": classes[odd][0], "reason": why, "versus": sorted(others)}

    def _duplicate(self, site: duplicates.Site):
        seq, senders = site.identical[-1]
        ranks = self._rank_sorted_entries((r, self.entry(r, raw)) for r, raw in senders.items())
        r0 = next(iter(senders))
        own = self.snap.ranks[r0].origins.user_frames if r0 in self.snap.ranks else (lambda fs: [])
        chain = "/".join(f"{f}:{ln}" for f, ln in
                         ((x.get("file"), x.get("line")) for x in own(senders[r0].get("frames"))))
        f = self._base("duplicate_data", f"duplicate_data:{site.group}:{site.op}:{chain}", site.group, seq, [], ranks)
        f["calls"] = site.calls
        f["identical_calls"] = len(site.identical)
        f["seqs"] = [s for s, _ in site.identical]
        f["digest"] = next(iter(senders.values())).get("digest")
        f["look_first"] = {"ranks": sorted(senders), "rank": min(senders), "reason": "data_split"}
        return f, [], set(senders)

    def _p2p(self, k: Key):
        g = self.graph
        rec = k.waiters[0]
        a, c = rec.rank, rec.peer
        pairs = [(a, self.entry(a, rec))]
        if c is not None and c != a:
            pairs.append((c, self.entry(c, where=True)))
        if k.status == "missing":
            kind, key, stage = "unmatched_p2p", f"unmatched_p2p:{a}:{rec.op}:{c}:{rec.seq}", None
        elif k.status == "posted":
            kind, key, stage = "stall", f"stall:p2p:{a}:{rec.op}:{c}:{rec.seq}:completion", "completion"
        else:
            kind, key, stage = "stall", f"stall:p2p:{a}:{rec.op}:{c}:{rec.seq}", "unverified"
        f = self._base(kind, key, rec.group, rec.seq, [c] if k.status == "missing" else [],
                       self._rank_sorted_entries(pairs))
        if stage:
            f["stage"] = stage
        f["p2p"] = True
        f["rank"] = a
        f["peer"] = c
        f["op"] = rec.op
        f["posted"] = k.posted
        f["waited_s"] = round(g.age(k), 3)
        if k.status == "missing":
            f["look_first"] = {"ranks": [c], "rank": c, "reason": "unposted", "versus": [a]}
        elif k.status == "posted":
            f["look_first"] = {"ranks": sorted({a, c}), "rank": a, "reason": "transport"}
        else:
            f["look_first"] = {"ranks": [c], "rank": c, "reason": "unverified", "versus": [a]}
        return f, [k.node], {a} | ({c} if c is not None else set())
