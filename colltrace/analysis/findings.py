"""The verdicts: mismatches, dead ranks, deadlocks, stalls and unmatched p2p as typed findings
(colltrace/model/finding.py, docs/findings.md), one finding per problem, reported where the problem starts.

Facts only, no English: who, where (frames marked with their origin: the user's, a framework's,
torch's), and which ranks to look at first and why (`look_first`). colltrace.reporters.text
turns them into the summary paragraph and the advice.

Priority when one situation could be read several ways: mismatch, dead_rank, deadlock, then
stall / unmatched_p2p. Ranks stuck only because of a reported problem are listed in its
`behind` field instead of getting findings of their own.
"""
from __future__ import annotations

from typing import cast

from colltrace.analysis import batches, duplicates
from colltrace.analysis.evidence import ROUTINE_SAMPLE, ROUTINE_WINDOW, Evidence, call_site_of, compact_record
from colltrace.analysis.matching import Disagreement, check_collective
from colltrace.analysis.view import JobView, RankView, Rec
from colltrace.analysis.waitgraph import Key, WaitGraph, coll_name
from colltrace.model.finding import Deadlock, DeadRank, DuplicateData, Finding, Mismatch, Stall, UnmatchedP2P
from colltrace.model.parts import CycleStep, FailedCall, LookFirst, WaitingCall
from colltrace.model.schema import ALIVE, EXIT_CALLS, EXITED, INTERRUPTED, NATIVE_EXIT, RAISED, RETURNED, WAITING
from colltrace.origins import called, innermost_user

MAX_ALSO_MISSING = 64   # other absent members described in a dead_rank finding (all are listed)
MISMATCH_SETTLE_S = 0.3  # a mismatch waits this long after the last arrival for members still coming
DEATH_SETTLE_S = 0.3     # a rank dead with nobody seen waiting yet: its consequences show within this
EXIT_STATUS_S = 5.0      # a returned rank's exit status comes after its interpreter's shutdown: waited for this long
ENDING_SLACK_S = 1.0     # a failure this much before a rank wrote its ending (hosts' clocks) may still be its doing
PRIORITY = {"mismatch": 0, "dead_rank": 1, "deadlock": 2, "stall": 3, "unmatched_p2p": 3, "duplicate_data": 5}
# Kinds that mean the job is stuck or broken now: COLLTRACE_ON_HANG acts on these alone.
HANG_KINDS = frozenset(("mismatch", "dead_rank", "deadlock", "stall", "unmatched_p2p"))
# A wait on a rank that is itself in a young wait for a key of the store (a wait any rank may end)
# is named with that wait, once it is old enough: one problem, one finding. Not past this many
# stall thresholds (a rank waiting on the store again and again, each wait short).
DEFER = -2
DEFER_LIMIT = 2.0


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _ending_reason(v) -> str:
    """look_first's reason for a dead rank: how it ended, which says where to look."""
    ex = v.exit or {}
    how = ex.get("how")
    if how == INTERRUPTED:
        return "interrupted"        # SIGINT: Ctrl-C, or a launcher ending it
    if ex.get("exception"):
        return "error"              # its exception and the line it was raised at
    if how in EXIT_CALLS or how == RAISED:
        return "exit"               # it ended itself on purpose: sys.exit(3), os._exit(4), SystemExit(5)
    if how == NATIVE_EXIT:
        return "native_exit"        # exit() in a native library
    if v.status == EXITED:
        return "returned" if how == RETURNED else "exited"
    if v.stack:
        return "stack"              # a fatal signal, at the line faulthandler saw
    return "signal" if ex.get("signal") else "vanished"


def _frame_refs(f: Finding) -> None:
    """Point look_first at frames: the index, in its rank's `frames`, of the user's innermost own
    frame ("user_frame") and of the framework call it went through ("framework_frame"); None
    where there is none."""
    look = f.look_first
    if look is None or look.get("rank") is None:
        return
    frames = (f.ranks.get(str(look["rank"])) or {}).get("frames")
    frames = frames if isinstance(frames, list) else []
    i = innermost_user(frames)   # wrappers that pass a call on never stand for it
    j = called(frames, i) if i is not None else None
    look["user_frame"] = i
    look["framework_frame"] = (j if j is not None and isinstance(frames[j], dict)
                               and frames[j].get("origin") == "framework" else None)


class FailedBecause(FailedCall, total=False):
    """A `failed` item while it is built: the failed records by rank, dropped before it is written."""
    records: dict[int, dict]


class Analysis:
    """One snapshot judged at `now`: its findings, each from the facts the modules below establish
    (the wait graph, the matching, the evidence). run() gives them."""

    def __init__(self, snap: JobView, stall_s: float, now: float):
        self.snap = snap
        self.stall_s = stall_s
        self.now = now
        self.graph = WaitGraph(snap, now, stall_s)
        self.ev = Evidence(snap, now)

    # -- the pass ----------------------------------------------------------------------------
    def run(self) -> list[Finding]:
        g = self.graph
        mismatches = self._mismatches()
        g.build(set(mismatches))
        deadlocks, dead_causes, stall_roots = self._decide()
        made: list[tuple[Finding, list[int], set[int]]] = []   # (finding, its graph nodes, its own ranks)
        for mm in mismatches.values():
            if self._settled(mm):   # unsettled ones still keep their key out of deadlocks and stalls
                made.append(self._mismatch(mm))
        dead = set(dead_causes)
        settling: set[int] = set()   # dead alone a moment ago: reported next round, with its consequences
        for rank, view in self.snap.ranks.items():
            if view.alone and rank not in dead:   # crashed or killed alone: worth a finding before anyone waits
                (settling if self._just_died(view) else dead).add(rank)
        dead.update(self._ended_first(dead | settling) - settling)
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
        made.sort(key=lambda m: (PRIORITY.get(m[0].kind, 9), m[0].key))
        # Who is stuck behind each problem: each rank credited once, to the first problem.
        seen = {n for _, nodes, _ in made for n in nodes}
        for f, nodes, own in made:
            behind = set(g.upstream(nodes, seen))
            for n in nodes:
                behind.update(self.extra_behind.get(n, ()))
            after = sorted(behind - own)
            if after:
                f.behind = after
        out = []
        for f, _, _ in made:
            _frame_refs(f)
            if self.snap.unreadable:
                f.unreadable_ranks = list(self.snap.unreadable)
                f.unreadable = {str(r): e for r, e in self.snap.unreadable.items()}
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

    def _status_due(self, view) -> bool:
        """Its program ended, and the code it ends with is still to come (it comes after the
        interpreter's shutdown: a return and `raise SystemExit(3)` look alike until then): its
        finding waits for it, EXIT_STATUS_S at most."""
        ex = view.exit or {}
        return bool(ex.get("pending")) and self.now - (_number(ex.get("at")) or 0.0) < EXIT_STATUS_S

    def _mismatches(self) -> dict[str, Disagreement]:
        """Mismatches among the collectives someone is pending in or that failed: the ones that
        hang or break a job. (Completed ones are not re-read on every round: too costly at scale.)"""
        candidates: dict[tuple, list[tuple[int, dict]]] = {}
        for k in self.graph.keys.values():
            if not k.p2p:
                candidates[(k.group, k.seq)] = [(w.rank, w.raw) for w in k.waiters]
        for rank, view in self.snap.ranks.items():
            for raw in view.failed:
                if raw.get("p2p") or raw.get("backend_op") in ("send", "recv"):
                    continue
                candidates.setdefault((raw["group"], raw["seq"]), []).append((rank, raw))
        out = {}
        for (group, seq) in sorted(candidates):
            mm = check_collective(self.snap, group, seq, candidates[(group, seq)])
            if mm is not None:
                out[coll_name(group, seq)] = mm
        for k in self.graph.keys.values():
            if k.name not in out and k.missing and not k.p2p and k.waiters[0].raw.get("setup"):
                mm = self._diverged(k)
                if mm is not None and not any((x.group, x.seq) == (mm.group, mm.seq) for x in out.values()):
                    mm.key = k.name   # where it is waited on: one finding, the wait its consequence
                    out[k.name] = mm
        return out

    def _diverged(self, k: Key) -> Disagreement | None:
        """Group creations (rank/setup.py): the ranks k waits for made fewer; where one made a
        different call at its last number than the waiters did there, the ranks parted there (a
        group made by some ranks only, groups made in another order), though both calls returned.
        Looked for in the few setup records only (completed collectives are not re-read)."""
        for last in sorted({self.snap.ranks[m].entered(k.group) for m in k.missing if m in self.snap.ranks}):
            if 0 < last < k.seq:
                here = [(w.rank, r) for w in k.waiters
                        if (r := self.snap.ranks[w.rank].record_at(k.group, last)) is not None]
                mm = check_collective(self.snap, k.group, last, here)
                if mm is not None:
                    return mm
        return None

    def _settled(self, mm: Disagreement) -> bool:
        """A mismatch is certain once two ranks disagree, but members still arriving a moment
        later belong in the same finding: wait MISMATCH_SETTLE_S after the last arrival unless
        every member is in."""
        if not mm.not_entered:
            return True
        times = [raw.get("entered_at") or 0.0 for raw in mm.records.values()]
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
                        if downstream != DEFER:
                            break
                if downstream is not None and downstream != DEFER:
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
                    if downstream == DEFER and not k.ended and g.age(k) >= DEFER_LIMIT * self.stall_s:
                        downstream = None   # waited long enough: named whatever is downstream
                    if k.mismatch:
                        here = True
                    elif downstream is None and (g.age(k) >= self.stall_s or k.ended) and self._hung(k):
                        here = True
                        stall_roots.append(k)
                    elif downstream is None and k.any_of and k.waits_for_ranks:
                        # a wait for a key of the store, not old enough yet: the waits on its ranks
                        # are named with it once it is, as one problem
                        downstream = DEFER
                else:
                    view = self.snap.ranks.get(g.rank_at(v))
                    # a rank whose every waiter waits in a mismatch (ranks that made different
                    # groups at one number: the one that ended had nothing left to wait for) is that
                    # mismatch's consequence; a crash of its own is named anyway (`alone`)
                    if view is not None and view.cause and g.rev[v] and not self._status_due(view) and not all(
                            g.is_key(u) and g.key_at(u).mismatch for u in g.rev[v]):
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
                for waiter in k.waiters:
                    for k2 in g.out_keys.get(waiter.rank, ()):
                        c = cause_of[comp_of[k2.node]] if k2 is not k else None
                        if c is not None and c != DEFER and c != k.node:
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

    def _hung(self, k: Key) -> bool:
        """A collective every member entered is hung itself only while a rank is stuck behind
        it: in it or parked on it, or idle since (NCCL: parked in an untraced sync) for the
        threshold. Work whose ranks all moved on, or whose completion nothing reports (a
        functional collective never waited on), is not a hang. One that waits for ranks is."""
        if k.p2p or k.targets():
            return True
        for w in k.waiters:
            if w.state == WAITING or w.parked is not None:
                return True
            v = self.snap.ranks.get(w.rank)
            if v is not None and not w.unobserved and (v.dead or self.now - v.last_active >= self.stall_s):
                return True
        return False

    # -- pieces of a finding ---------------------------------------------------------------------

    # -- the job's own history: what a rank did at this point before ------------------------------

    # -- the verdicts ------------------------------------------------------------------------------
    def _mismatch(self, mm: Disagreement):
        ranks = self.ev.rank_sorted_entries((r, self.ev.entry(r, raw)) for r, raw in mm.records.items())
        notes = self.ev.untraced_before(mm.group, mm.seq, [c["ranks"][0] for c in mm.classes])
        cs = [(sorted(c["ranks"]), mm.records[sorted(c["ranks"])[0]]) for c in mm.classes]
        odd, why = self.ev.odd_ones(cs)
        f = self.ev.base(Mismatch, f"mismatch:{mm.group}:{mm.seq}", mm.group, mm.seq, mm.not_entered, ranks,
                         differs=mm.differs, classes=mm.classes, untraced_before=notes or None,
                         look_first=self.ev.look(why, [rs for rs, _ in cs], odd))
        nodes = []
        k = self.graph.keys.get(mm.key or coll_name(mm.group, mm.seq))
        if k is not None:
            nodes.append(k.node)
        return f, nodes, set(mm.records) | set(mm.not_entered)

    def _dead(self, rank: int):
        g = self.graph
        v = self.snap.ranks[rank]
        node = g.node_rank.get(rank)
        keys = [g.key_at(u) for u in (g.rev[node] if node is not None else []) if g.is_key(u)]
        keys.sort(key=lambda k: (-len(k.waiters), k.name))
        pairs = [(rank, self.ev.entry(rank, where=True))]
        waiting: list[WaitingCall] = []
        own = {rank}
        for k in keys:
            rs = sorted({w.rank for w in k.waiters})
            waiting.append({"key": k.name, "group": k.group, "seq": k.seq, "op": k.waiters[0].op, "p2p": k.p2p,
                            "ranks": rs, "waited_s": round(g.age(k), 3)})
            for w in k.waiters:
                if w.rank not in own:
                    own.add(w.rank)
                    pairs.append((w.rank, self.ev.entry(w.rank, w)))
        # Other members those collectives still miss: where they are tells whether they would
        # have come (busy elsewhere) or are stuck too (DDP's untraced all-reduce with the dead rank).
        also = sorted({m for k in keys for m in k.targets() if m not in own})
        for m in also[:MAX_ALSO_MISSING]:
            own.add(m)
            pairs.append((m, self.ev.entry(m, where=True)))
        failed = self._failed_because(rank)
        for item in failed:
            for r in item["ranks"]:
                if r not in own:
                    own.add(r)
                    pairs.append((r, self.ev.entry(r, item["records"][r])))
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
        last_collective = compact_record(last)
        if last_collective and "frames" in last_collective:
            last_collective["frames"] = self.ev.annotated_frames(v, last_collective["frames"])
        why = _ending_reason(v)
        f = self.ev.base(DeadRank, f"dead_rank:{rank}" + (f":{pid}" if pid else ""), group, seq, missing,
                         self.ev.rank_sorted_entries(pairs), rank=rank, exit=v.exit, died_at=v.entry.get("died_at"),
                         last_collective=last_collective, waiting=waiting, failed=failed,
                         also_missing=also or None,
                         waited_s=max(w["waited_s"] for w in waiting) if waiting else None,
                         look_first={"ranks": [rank], "rank": rank, "reason": why})
        return f, ([node] if node is not None else []), own

    def _ended_first(self, dead: set[int]) -> set[int]:
        """Ranks that ended (an exit call, a return, an exception: any code) while others were in
        a collective with them: the others' collectives failed because of it (gloo: "Connection
        closed by peer"), before anyone was seen waiting. Their own endings, consequences, name no
        rank and get no finding."""
        out = set()
        for rank, view in self.snap.ranks.items():
            if (rank not in dead and view.status == EXITED and view.cause and not self._status_due(view)
                    and not view.failed   # its own collective failed first: a consequence
                    and any(item["missing"] for item in self._failed_because(rank))):
                out.add(rank)
        return out

    def _failed_because(self, rank: int) -> list[FailedBecause]:
        """Collectives that failed on other ranks because this one is gone (gloo: "Connection
        closed by peer"): on a group it belongs to, at a number it never entered or died inside;
        or a p2p op with it. One item per (group, number, op), biggest first."""
        dead = self.snap.ranks[rank]
        # when it wrote its ending (not when a watchdog saw it gone: a poll, or more, later)
        ended_at = _number((dead.exit or {}).get("at"))
        out: dict[tuple, FailedBecause] = {}
        for other, view in self.snap.ranks.items():
            if other == rank:
                continue
            for raw in view.failed:
                failed_at = _number(raw.get("failed_at") or raw.get("returned_at"))
                if ended_at is not None and failed_at is not None and failed_at < ended_at - ENDING_SLACK_S:
                    continue   # it failed before this rank ended (a timeout): not its doing
                group, seq = raw["group"], raw["seq"]
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
            chain = call_site_of(view, w.raw)
            for r in (view.records[-ROUTINE_WINDOW:] if view is not None else ()):
                if r is not w.raw and isinstance(r, dict) and r.get("op") == w.op and call_site_of(view, r) == chain:
                    total += 1
        return total / len(sample) if sample else 0.0

    def _deadlock(self, comp: list[int]):
        g = self.graph
        keys = [g.key_at(v) for v in comp if g.is_key(v)]
        in_comp = {g.rank_at(v) for v in comp if not g.is_key(v)}
        # Look first at the odd call out: routine traffic (a gather every step) is rarely where a
        # deadlock starts; a call the waiters seldom make (a barrier in checkpoint code) is.
        marks = {k.name: self.ev.pattern(k.waiters[0].rank, k.waiters[0].raw) for k in keys}
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
                    pairs.append((w.rank, self.ev.entry(w.rank, w)))
        for k in order:
            for r in k.targets():
                if r not in own:
                    own.add(r)
                    pairs.append((r, self.ev.entry(r, where=True)))
        ranks = self.ev.rank_sorted_entries(pairs)
        cycle: list[CycleStep] = []
        for k in order:
            item: CycleStep = {"key": k.name, "group": k.group, "seq": k.seq, "p2p": k.p2p, "op": k.waiters[0].op,
                    "waiting": sorted({w.rank for w in k.waiters}), "missing": sorted(set(k.targets()))}
            if k.p2p:
                item["peer"] = k.waiters[0].peer
                item["posted"] = k.posted
            cycle.append(item)
        # the odd call out: the key whose waiters left their own pattern, else the least routine
        look: LookFirst = {"ranks": cycle[0]["waiting"], "rank": primary.waiters[0].rank, "key": primary.name,
                           "reason": (cast(str, marks[primary.name]) if marks[primary.name] in ("left", "new")
                                      else "odd_call")}
        f = self.ev.base(Deadlock, "deadlock:" + ",".join(sorted(k.name for k in keys)), primary.group,
                         primary.seq, primary.targets(), ranks, cycle=cycle,
                         waited_s=round((max(k.ended_at for k in keys) or self.now)
                                        - min(k.first_entered for k in keys), 3),
                         look_first=look)
        return f, list(comp), own

    def _stall(self, k: Key):
        if k.p2p:
            return self._p2p(k)
        g = self.graph
        pairs = [(w.rank, self.ev.entry(w.rank, w)) for w in k.waiters]
        own = {w.rank for w in k.waiters}
        targets = k.missing + k.unknown
        for m in targets:
            if m not in own:
                own.add(m)
                pairs.append((m, self.ev.entry(m, where=True)))
        stage = "arrival" if targets else "completion"
        key = f"stall:{k.group}:{k.seq}" + (":completion" if stage == "completion" else "")
        ranks = self.ev.rank_sorted_entries(pairs)
        waiting = sorted({w.rank for w in k.waiters})
        completed = None
        not_started = None
        if stage == "completion":
            completed = sorted(set(self.snap.members(k.group)) - own)
            # CUDA: a start event recorded before the call that has not fired: the GPU is still on
            # work queued ahead of the collective, which is then not what hangs
            not_started = sorted({w.rank for w in k.waiters
                                  if w.raw.get("start_event") and w.raw.get("started_at") is None}) or None
            look: LookFirst = {"ranks": not_started or waiting, "rank": (not_started or waiting)[0],
                    "reason": "gpu_queue" if not_started else "backend"}
        elif k.any_of:
            # any rank may set the key: the line that waits for it, and which rank was to set it
            look = {"ranks": waiting, "rank": waiting[0], "reason": "store_key"}
        else:
            # The waiters' own history first: a rank that left its established pattern to enter
            # this collective (a barrier in a rank-conditional branch) is the odd one, not the
            # ranks doing what they always do. Otherwise the ranks that never arrive.
            w = k.waiters[0]
            mark = self.ev.pattern(w.rank, w.raw)
            if mark in ("left", "new") and self._absent_routine(targets, k):
                look = {"ranks": waiting, "rank": w.rank, "reason": mark, "versus": sorted(targets)}
            else:
                first = self.ev.first_class(ranks, targets)
                look = {"ranks": first, "rank": first[0], "reason": "missing"}
        f = self.ev.base(Stall, key, k.group, k.seq, k.missing, ranks, stage=stage, waited_s=round(g.age(k), 3),
                         waiting=waiting, unknown_ranks=sorted(k.unknown) if k.unknown else None,
                         untraced_before=self.ev.untraced_before(k.group, k.seq, waiting[:1]) or None,
                         completed_ranks=completed, not_started=not_started, look_first=look)
        return f, [k.node], own

    def _absent_routine(self, targets, k: Key) -> bool:
        """Whether the ranks a collective waits for are busy with their routine: each readable,
        alive, and in a collective it made at that point before (one in no collective, stuck
        in a data loader say, may well be the problem itself)."""
        for m in targets:
            v = self.snap.ranks.get(m)
            if v is None or v.dead:
                return False
            cur = self.ev.current(v)
            if cur is None:
                cur = self._untraced_now(v)
            if cur is None or self.ev.pattern(m, cur.raw if isinstance(cur, Rec) else cur) != "same":
                return False
        return bool(targets)

    def _untraced_now(self, v: RankView):
        """The collective the Flight Recorder says the rank is in, untraced (DDP's all-reduce)."""
        for u in v.untraced[-1:]:
            return v.untraced_at(u["group"], u["seq"])
        return None

    def _duplicate(self, site: duplicates.Site):
        seq, senders = site.identical[-1]
        ranks = self.ev.rank_sorted_entries((r, self.ev.entry(r, raw)) for r, raw in senders.items())
        r0 = next(iter(senders))
        own = self.snap.ranks[r0].origins.user_frames if r0 in self.snap.ranks else (lambda fs: [])
        chain = "/".join(f"{f}:{ln}" for f, ln in
                         ((x.get("file"), x.get("line")) for x in own(senders[r0].get("frames"))))
        f = self.ev.base(DuplicateData, f"duplicate_data:{site.group}:{site.op}:{chain}", site.group, seq, [], ranks,
                         calls=site.calls, identical_calls=len(site.identical), seqs=[s for s, _ in site.identical],
                         digest=next(iter(senders.values())).get("digest"),
                         look_first={"ranks": sorted(senders), "rank": min(senders), "reason": "data_split"})
        return f, [], set(senders)

    def _p2p(self, k: Key):
        g = self.graph
        rec = k.waiters[0]
        a, c = rec.rank, rec.peer
        pairs = [(a, self.ev.entry(a, rec))]
        if c is not None and c != a:
            pairs.append((c, self.ev.entry(c, where=True)))
        ranks = self.ev.rank_sorted_entries(pairs)
        facts = {"rank": a, "peer": c, "op": rec.op, "posted": k.posted, "waited_s": round(g.age(k), 3)}
        f: Finding
        if k.status == "missing":
            f = self.ev.base(UnmatchedP2P, f"unmatched_p2p:{a}:{rec.op}:{c}:{rec.seq}", rec.group, rec.seq, [c], ranks,
                             look_first={"ranks": [c], "rank": c, "reason": "unposted", "versus": [a]}, **facts)
        elif k.status == "posted":
            f = self.ev.base(Stall, f"stall:p2p:{a}:{rec.op}:{c}:{rec.seq}:completion", rec.group, rec.seq, [], ranks,
                             stage="completion", p2p=True,
                             look_first={"ranks": sorted({a, c}), "rank": a, "reason": "transport"}, **facts)
        else:
            f = self.ev.base(Stall, f"stall:p2p:{a}:{rec.op}:{c}:{rec.seq}", rec.group, rec.seq, [], ranks,
                             stage="unverified", p2p=True,
                             look_first={"ranks": [c], "rank": c, "reason": "unverified", "versus": [a]}, **facts)
        return f, [k.node], {a} | ({c} if c is not None else set())
