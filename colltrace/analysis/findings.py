"""The verdicts: mismatches, dead ranks, deadlocks, stalls and unmatched p2p as finding dicts
(shared/CONTRACT.md), one finding per problem, reported where the problem starts.

Priority when one situation could be read several ways: mismatch, dead_rank, deadlock, then
stall / unmatched_p2p. Ranks stuck only because of a reported problem are listed in its
`behind` field instead of getting findings of their own.
"""
from __future__ import annotations

from colltrace.analysis import duplicates, report
from colltrace.analysis.matching import Mismatch, check_collective
from colltrace.analysis.snapshot import PENDING, Rec, RankView, Snapshot, to_int
from colltrace.analysis.waitgraph import Key, WaitGraph, coll_name

MAX_ALSO_MISSING = 64   # other absent members described in a dead_rank finding (all are listed)
MISMATCH_SETTLE_S = 0.3  # a mismatch waits this long after the last arrival for members still coming
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


def _probe_fields(e: dict, entry: dict) -> None:
    """What the watchdog's probes saw of a rank in no collective: which route gave its stack,
    its activity over the wait (progressing / frozen / blocked_io), threads that died."""
    for k in ("stack_via", "stack_errors", "activity", "thread_exceptions"):
        if entry.get(k):
            e[k] = entry[k]


def _thread_death(e: dict, who: str = "", goal: str = "") -> str:
    """The advice for a rank one of whose threads died of an exception: that is the first cause
    (the main thread then waits for what the thread would have done)."""
    deaths = [x for x in e.get("thread_exceptions") or [] if isinstance(x, dict)]
    if not deaths or not who:
        return "yes" if deaths else ""
    x = deaths[-1]
    at = report.user_location(x.get("frames")) or "its thread"
    return (f"Look first at {at}: {who}'s thread {x.get('thread') or '?'} died of {x.get('type')} "
            f"({report._first_line(x.get('message') or '')}), and {who} waits at {report.where(e)} instead of "
            f"reaching {goal}.")


def _user_chain(frames) -> tuple:
    return tuple((f.get("file"), f.get("line")) for f in report.user_frames(frames))


class Verdicts:
    def __init__(self, snap: Snapshot, stall_s: float, now: float):
        self.snap = snap
        self.stall_s = stall_s
        self.now = now
        self.graph = WaitGraph(snap, now, stall_s)

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
        for rank, view in self.snap.ranks.items():
            if view.alone and rank not in dead:
                dead.add(rank)  # crashed or killed alone: worth a finding before anyone waits for it
        dead.update(self._raised_first(dead))
        for rank in sorted(dead):
            made.append(self._dead(rank))
        for comp in deadlocks:
            made.append(self._deadlock(comp))
        for k in stall_roots:
            made.append(self._stall(k))
        for site in duplicates.find(self.snap):
            made.append(self._duplicate(site))
        made.sort(key=lambda m: (PRIORITY.get(m[0]["kind"], 9), m[0]["key"]))
        # Who is stuck behind each problem: each rank credited once, to the first problem.
        seen = {n for _, nodes, _ in made for n in nodes}
        for f, nodes, own in made:
            behind = set(g.upstream(nodes, seen))
            for n in nodes:
                behind.update(self.extra_behind.get(n, ()))
            behind = sorted(behind - own)
            if behind:
                f["behind"] = behind
        out = []
        for f, _, _ in made:
            if self.snap.unreadable:
                f["unreadable_ranks"] = list(self.snap.unreadable)
                f["unreadable"] = {str(r): e for r, e in self.snap.unreadable.items()}
            f["summary"] = report.paragraph(f)
            out.append(f)
        return out

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
            if r.state == "waiting":
                return r
        if view.pending and not (view.stack and not view.dead):
            return view.pending[-1]
        return None

    def entry(self, rank: int, rec=None, where: bool = False) -> dict:
        """The finding's view of one rank: the record it is in, or where it is instead."""
        v = self.snap.ranks.get(rank)
        if v is None:
            if rank in self.snap.unreadable:
                return {"state": "unreadable", "status": "unreadable", "error": self.snap.unreadable[rank]}
            return {"state": "unknown", "status": "unknown", "error": "no trace of this rank in the snapshot"}
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
            e = {"state": "not_in_collective", "frames": v.stack or []}
            if v.stack:
                e["stack_at"] = v.entry.get("stack_at")
            else:
                e["note"] = "no live stack available"
            _probe_fields(e, v.entry)
            flight = [_compact(r.raw) for r in v.pending if r.state == "in_flight"]
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
        return e

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
        minority = min(mm.classes, key=lambda c: (len(c["ranks"]), -c["ranks"][0]))
        majority = max(mm.classes, key=lambda c: (len(c["ranks"]), -c["ranks"][0]))
        loc = report.call_site(ranks[str(minority["ranks"][0])].get("frames")) or "the call"
        loc2 = report.user_location(ranks[str(majority["ranks"][0])].get("frames")) or "theirs"
        who = report.rank_word(minority["ranks"])
        if "op" in mm.differs:
            what = f"{minority['op']} where {report.rank_word(majority['ranks'])} call {majority['op']} (at {loc2})"
        else:
            fields = report._and([d.replace("_", " ") for d in mm.differs])
            what = f"{minority['op']} with different {fields} than {report.rank_word(majority['ranks'])} (at {loc2})"
        f["advice"] = (f"Look first at {loc}: {who} call{'s' if len(minority['ranks']) == 1 else ''} {what}, "
                       f"as collective #{mm.seq} on group {mm.group}.")
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
        waiting = []
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
        f["waiting"] = waiting
        f["failed"] = failed
        if also:
            f["also_missing"] = also
        if waiting:
            f["waited_s"] = max(w["waited_s"] for w in waiting)
        e = f["ranks"][str(rank)]
        how = report._exit_text(e)
        at = report.user_location(v.stack) if v.stack else None
        exc = (v.exit or {}).get("exception")
        if exc:
            f["advice"] = f"Look first at rank {rank}'s error, {exc}" + (f", raised at {at}" if at else "") + " (its log has the traceback)."
        elif at:
            f["advice"] = f"Look first at why rank {rank} {how} at {at}."
        elif (v.exit or {}).get("signal"):
            f["advice"] = f"Look first at why rank {rank} {how}: its log (faulthandler prints the Python stack there)."
        else:
            f["advice"] = (f"Look first at why rank {rank} {how}: its log, and the kernel log (dmesg) for the OOM "
                           f"killer.")
        return f, ([node] if node is not None else []), own

    def _raised_first(self, dead: set[int]) -> set[int]:
        """Ranks that exited with an exception while others were in a collective with them: the
        others' collectives failed because of it (gloo: "Connection closed by peer"), before anyone
        was seen waiting. Their own exceptions, consequences, name no rank and get no finding."""
        out = set()
        for rank, view in self.snap.ranks.items():
            if (rank not in dead and view.status == "exited" and (view.exit or {}).get("exception") and view.cause
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
            chain = _user_chain(w.raw.get("frames"))
            for r in (view.records[-ROUTINE_WINDOW:] if view is not None else ()):
                if r is not w.raw and isinstance(r, dict) and r.get("op") == w.op and _user_chain(r.get("frames")) == chain:
                    total += 1
        return total / len(sample) if sample else 0.0

    def _deadlock(self, comp: list[int]):
        g = self.graph
        keys = [g.key_at(v) for v in comp if g.is_key(v)]
        in_comp = {g.rank_at(v) for v in comp if not g.is_key(v)}
        # Look first at the odd call out: routine traffic (a gather every step) is rarely where a
        # deadlock starts; a call the waiters seldom make (a barrier in checkpoint code) is.
        keys.sort(key=lambda k: (self._routine(k), -sum(1 for w in k.waiters if w.rank in in_comp),
                                 len(k.targets()), k.name))
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
        loc = report._locations(f, cycle[0]["waiting"])
        if len(report.classes(f, cycle[0]["waiting"], key=report.where)) == 1:
            loc = report.call_site(primary.waiters[0].raw.get("frames")) or loc   # which caller of a helper
        missing = cycle[0]["missing"]
        others = [c for c in cycle[1:] if set(c["waiting"]) & set(missing)]
        instead = f" (waiting in {others[0]['op']} on group {others[0]['group']} instead)" if others else ""
        who = report.rank_word(missing)
        if primary.p2p:
            w = primary.waiters[0]
            f["advice"] = (f"Look first at {loc}: rank {w.rank}'s {w.op} with rank {w.peer} is never matched, "
                           f"because rank {w.peer} waits in {others[0]['op'] if others else 'something else'} itself.")
        else:
            f["advice"] = (f"Look first at {loc}: {primary.waiters[0].op} on group {primary.group} is a collective "
                           f"that {who} never call{'s' if len(missing) == 1 else ''}{instead}.")
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
        op = k.waiters[0].op
        if stage == "completion":
            f["completed_ranks"] = sorted(set(self.snap.members(k.group)) - own)
            loc = report._locations(f, f["waiting"])
            f["advice"] = (f"Look first at the backend on {report.rank_word(f['waiting'])} ({op} #{k.seq} on group "
                           f"{k.group} at {loc}): every member entered it but it never completes; check the NCCL/gloo "
                           f"logs, GPU health and the network.")
        else:
            m_classes = report.classes(f, targets)
            rs, e = m_classes[0]
            who = report.rank_word(rs)
            goal = f"{op} #{k.seq} on group {k.group}"
            if e.get("state") in ("unreadable", "unknown"):
                f["advice"] = f"Look first at {who}: {'its' if len(rs) == 1 else 'their'} trace could not be read, and {goal} waits for {'it' if len(rs) == 1 else 'them'}."
            elif _thread_death(e):
                f["advice"] = _thread_death(e, who, goal)
            elif e.get("frames") or e.get("state") in PENDING:
                f["advice"] = (f"Look first at {report.where(e)}, where {who} {'is' if len(rs) == 1 else 'are'}: "
                               f"{'it never reaches' if len(rs) == 1 else 'they never reach'} {goal}.")
            else:
                pid = e.get("pid")
                hint = f" (py-spy dump --pid {pid} on its host shows where it is)" if pid else ""
                if e.get("stack_errors"):
                    hint = f" (no live stack: {'; '.join(map(str, e['stack_errors']))})"
                f["advice"] = (f"Look first at what {who} {'does' if len(rs) == 1 else 'do'} after "
                               f"{'its' if len(rs) == 1 else 'their'} last collective{hint}: "
                               f"{'it never reaches' if len(rs) == 1 else 'they never reach'} {goal}.")
        return f, [k.node], own

    def _duplicate(self, site: duplicates.Site):
        seq, senders = site.identical[-1]
        ranks = self._rank_sorted_entries((r, self.entry(r, raw)) for r, raw in senders.items())
        chain = "/".join(f"{f}:{ln}" for f, ln in
                         ((x.get("file"), x.get("line")) for x in report.user_frames(next(iter(senders.values())).get("frames"))))
        f = self._base("duplicate_data", f"duplicate_data:{site.group}:{site.op}:{chain}", site.group, seq, [], ranks)
        f["calls"] = site.calls
        f["identical_calls"] = len(site.identical)
        f["seqs"] = [s for s, _ in site.identical]
        f["digest"] = next(iter(senders.values())).get("digest")
        f["advice"] = ("Look first at how the data is split over the ranks: a DataLoader without a DistributedSampler "
                       "(or one built before init_process_group) gives every rank the same batches.")
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
        loc = report.user_location(f["ranks"][str(a)].get("frames")) or "the call"
        if k.status == "missing":
            e = f["ranks"].get(str(c), {})
            there = report.where(e) if e.get("frames") else f"rank {c}"
            f["advice"] = (f"Look first at {there}: rank {c} never posts the op that matches rank {a}'s {rec.op} "
                           f"at {loc}.")
        elif k.status == "posted":
            f["advice"] = (f"Look first at the transport between ranks {a} and {c}: both posted the transfer "
                           f"({rec.op} at {loc}) but it never completes.")
        else:
            f["advice"] = (f"Look first at rank {c}'s side of {rec.op} at {loc}: its trace window is too short to "
                           f"tell whether it posted the match.")
        return f, [k.node], {a} | ({c} if c is not None else set())
