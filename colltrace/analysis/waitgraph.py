"""Who waits for whom: a graph of ranks and the operations ("keys") they are stuck in.

rank A -> key K   when A cannot proceed until K completes;
key K  -> rank B  when B has not entered K (a collective) or not posted the match (p2p).

Going through key nodes keeps the graph linear in size: 16k ranks waiting for one rank are 16k
edges, not 16k x 16k. A strongly connected component with a cycle is a deadlock. Tarjan's
algorithm emits components sinks first, so one pass over them decides, for every key, whether
something downstream (a cycle, a dead rank, a mismatch, an older stall) already explains it:
one problem gives one finding, reported where it starts.
"""
from __future__ import annotations

from colltrace.analysis.matching import p2p_status
from colltrace.analysis.view import JobView, Rec
from colltrace.model.schema import WAITING

# A blocking call younger than this does not count as blocked yet: ranks are read a few ms
# apart, and a root that is about to return (its sends buffered) must not close a cycle.
SETTLE_S = 0.5


class Key:
    """One collective (group, seq) that some ranks are pending in, or one pending p2p op."""

    __slots__ = ("name", "group", "seq", "p2p", "waiters", "missing", "unknown", "died_inside", "status", "posted",
                 "node", "first_entered", "ready_at", "mismatch", "ended", "ended_at", "any_of")

    def __init__(self, name: str, group: str, seq: int, p2p: bool):
        self.name = name
        self.group = group
        self.seq = seq
        self.p2p = p2p
        self.waiters: list[Rec] = []
        self.missing: list[int] = []    # ranks known not to have entered / posted the match
        self.unknown: list[int] = []    # members whose progress cannot be read
        self.died_inside: list[int] = []  # members that entered it and died before it completed
        self.status = ""                # p2p: posted | missing | unknown
        self.posted: int | None = None  # p2p: the peer's count of matching ops toward the waiter
        self.node = -1
        self.first_entered = 0.0
        self.ready_at = 0.0             # a collective every member entered: when the last one did
        self.mismatch: str | None = None
        self.ended: str | None = None   # the backend ended its waiters' wait: "timeout" | "abort"
        self.ended_at = 0.0              # ... when it did (the last waiter's failure or death)
        self.any_of = False             # any one of its targets ends the wait (a key of the job's store)

    @property
    def waits_for_ranks(self) -> bool:
        if self.p2p:
            return self.status != "posted"
        return bool(self.missing or self.unknown or self.died_inside)

    def targets(self) -> list[int]:
        if self.p2p:
            return list(self.missing)
        return self.missing + self.unknown + self.died_inside


def coll_name(group: str, seq: int) -> str:
    return f"{group}#{seq}"


def p2p_name(rec: Rec) -> str:
    return f"p2p:{rec.rank}:{rec.op}:{rec.peer}#{rec.seq}:{rec.id}"


class WaitGraph:
    def __init__(self, snap: JobView, now: float, stall_s: float):
        self.snap = snap
        self.now = now
        self.stall_s = stall_s
        self.keys: dict[str, Key] = {}
        self._build_keys()

    # -- keys ------------------------------------------------------------------------------
    def _build_keys(self) -> None:
        snap = self.snap
        coll: dict[tuple, Key] = {}
        p2p: list[Key] = []
        for view in snap.ranks.values():
            if view.sink or not view.pending:
                continue  # crashed or exited: waits for nothing any more
            for r in view.pending:
                k: Key | None
                if r.p2p:
                    k = Key(p2p_name(r), r.group, r.seq, True)
                    p2p.append(k)
                else:
                    ck = (r.group, r.seq)
                    k = coll.get(ck)
                    if k is None:
                        k = coll[ck] = Key(coll_name(r.group, r.seq), r.group, r.seq, False)
                k.waiters.append(r)
                r.key = k
                if r.ended:
                    k.ended = r.ended
                    k.ended_at = max(k.ended_at, view.ended_at(r))
        for k in coll.values():
            k.any_of = snap.any_of(k.group)
            missing, unknown = snap.missing(k.group, k.seq)
            if missing or unknown:
                here = {w.rank for w in k.waiters}  # they entered it, whatever a stale progress says
                k.missing = [m for m in missing if m not in here]
                k.unknown = [m for m in unknown if m not in here]
        # A member that died inside a collective (entered it, never returned) will never finish it.
        for view in snap.ranks.values():
            if view.sink:
                for r in view.pending:
                    k = None if r.p2p else coll.get((r.group, r.seq))
                    if k is not None and view.rank not in k.missing:
                        k.died_inside.append(view.rank)
        for k in p2p:
            rec = k.waiters[0]
            k.status, k.posted = p2p_status(snap, rec)
            if k.status == "missing":
                k.missing = [rec.peer] if rec.peer is not None else []
        every = list(coll.values()) + p2p
        for k in every:
            w = k.waiters
            k.first_entered = w[0].entered_at if len(w) == 1 else min(x.entered_at for x in w)
        for k in coll.values():
            if not (k.missing or k.unknown):
                k.ready_at = self._last_arrival(k)
        every.sort(key=lambda k: k.name)
        self.keys = {k.name: k for k in every}

    def _last_arrival(self, k: Key) -> float:
        """When the last member entered a collective every member entered (those that already
        completed it included): it cannot have been hung for longer than that."""
        latest = max(w.entered_at for w in k.waiters)
        here = {w.rank for w in k.waiters}
        for m in self.snap.members(k.group):
            v = self.snap.ranks.get(m)
            if m in here or v is None:
                continue
            r = v.record_at(k.group, k.seq)
            t = r.get("entered_at") if isinstance(r, dict) else None
            if isinstance(t, (int, float)) and not isinstance(t, bool) and t > latest:
                latest = float(t)
        return latest

    def age(self, k: Key) -> float:
        """How long k has waited: for ranks that never came, since the first entered; for a
        collective every member entered, since the last did (a slow rank arriving late does not
        make the others' completion look hung)."""
        return (k.ended_at or self.now) - (k.ready_at or k.first_entered)

    def blocking_keys(self, view) -> list[Key]:
        """The keys a rank cannot proceed without.

        A blocking call that has not returned ("waiting") blocks it, and so does async work the
        rank is parked on (a wait on it, or a blocking call queued behind it on its group).
        Other async work ("in_flight") that waits for ranks blocks it only when the rank is
        evidently stuck behind it: its
        blocking call waits on no rank (it waits for earlier work to finish), or it issued
        nothing for stall_s (on NCCL even blocking collectives return at once and the rank
        then blocks in a sync)."""
        settled = self.now - min(SETTLE_S, self.stall_s)
        waiting: list = []
        flight: list = []
        for r in view.pending:
            if r.state == WAITING:
                if r.entered_at <= settled:
                    waiting.append(r.key)
            elif r.parked is not None:
                # parked: a thread waits on it, or on a call queued behind it
                if r.parked <= settled:
                    waiting.append(r.key)
            elif r.entered_at <= settled and not r.unobserved:
                flight.append(r.key)
        # Async work counts only where it waits for ranks: an op every member entered does not
        # say whom the rank waits for, and must not make an idle rank look blocked by it. Nor does
        # work whose completion nothing reports (a functional collective), unless waited on.
        flight = [k for k in flight if k.waits_for_ranks]
        if waiting:
            for k in waiting:
                if k.waits_for_ranks:
                    return waiting
            return waiting + flight
        if flight and (view.dead or self.now - view.last_active >= self.stall_s):
            return flight
        return []

    # -- graph -------------------------------------------------------------------------------
    def build(self, mismatched: set[str]) -> None:
        snap = self.snap
        out: dict[int, list[Key]] = {}
        for rank, view in snap.ranks.items():
            if view.sink or not view.pending:
                continue
            ks = self.blocking_keys(view)
            if len(ks) > 1:
                ks = sorted(set(ks), key=lambda k: k.name)
            if ks:
                out[rank] = ks
        self.out_keys = out
        targets = set()
        for k in self.keys.values():
            targets.update(k.targets())
            k.mismatch = k.name if k.name in mismatched else None
        self.rank_nodes = sorted(set(out) | targets)
        self.node_rank = {r: i for i, r in enumerate(self.rank_nodes)}
        base = len(self.rank_nodes)
        self.key_nodes = list(self.keys.values())
        for i, k in enumerate(self.key_nodes):
            k.node = base + i
        n = base + len(self.key_nodes)
        adj: list[list[int]] = [[] for _ in range(n)]
        for rank, ks in out.items():
            adj[self.node_rank[rank]] = [k.node for k in ks]
        node_rank = self.node_rank
        for k in self.key_nodes:
            if k.any_of:
                continue   # who will end it cannot be told: it closes no cycle, it stalls past the threshold
            t = k.targets()
            adj[k.node] = [node_rank[r] for r in (sorted(set(t)) if len(t) > 1 else t)]
        self.adj = adj
        rev: list[list[int]] = [[] for _ in range(n)]
        for v, ws in enumerate(adj):
            for w in ws:
                rev[w].append(v)
        self.rev = rev

    def is_key(self, node: int) -> bool:
        return node >= len(self.rank_nodes)

    def key_at(self, node: int) -> Key:
        return self.key_nodes[node - len(self.rank_nodes)]

    def rank_at(self, node: int) -> int:
        return self.rank_nodes[node]

    def components(self) -> list[list[int]]:
        """Tarjan's strongly connected components, iteratively (no recursion limit), in the
        order Tarjan emits them: every component after all the components it reaches."""
        adj = self.adj
        n = len(adj)
        index = [-1] * n
        low = [0] * n
        on_stack = [False] * n
        stack: list[int] = []
        comps: list[list[int]] = []
        counter = 0
        for s in range(n):
            if index[s] != -1:
                continue
            index[s] = low[s] = counter
            counter += 1
            stack.append(s)
            on_stack[s] = True
            work = [(s, 0)]
            while work:
                v, i = work[-1]
                if i < len(adj[v]):
                    work[-1] = (v, i + 1)
                    w = adj[v][i]
                    if index[w] == -1:
                        index[w] = low[w] = counter
                        counter += 1
                        stack.append(w)
                        on_stack[w] = True
                        work.append((w, 0))
                    elif on_stack[w] and index[w] < low[v]:
                        low[v] = index[w]
                else:
                    work.pop()
                    if work:
                        u = work[-1][0]
                        if low[v] < low[u]:
                            low[u] = low[v]
                    if low[v] == index[v]:
                        comp = []
                        while True:
                            w = stack.pop()
                            on_stack[w] = False
                            comp.append(w)
                            if w == v:
                                break
                        comp.sort()
                        comps.append(comp)
        return comps

    def upstream(self, starts: list[int], seen: set[int]) -> list[int]:
        """Ranks that wait, directly or not, on the given nodes (reverse reachability); nodes in
        `seen` are skipped and the visited ones added, so that each rank is credited once."""
        ranks = []
        todo = [s for s in starts]
        while todo:
            v = todo.pop()
            for u in self.rev[v]:
                if u in seen:
                    continue
                seen.add(u)
                todo.append(u)
                if self.is_key(u):
                    # its waiters wait on it, blocked or not
                    for w in self.key_at(u).waiters:
                        ranks.append(w.rank)
                else:
                    ranks.append(self.rank_at(u))
        return sorted(set(ranks))
