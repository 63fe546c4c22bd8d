"""What the leader asks of the other hosts: the ranks whose live stacks it needs, whether every rank
travels in full (a job of up to DETAIL_ALL_RANKS ranks), else the groups whose members it needs in
full (tree.Suspicion), and the ranks whose stacks their hosts sample; and so what it can judge."""
from __future__ import annotations

import time

from colltrace.host import tree
from colltrace.model.schema import Snapshot


class Wants:
    def __init__(self) -> None:
        self.every = True                   # every entry in full (a small job)
        self.suspicion = tree.Suspicion()
        self._sent: tuple = ()              # what was last asked, as written

    @property
    def groups(self) -> set[str]:
        """On a large job: the groups whose members the root has asked for in full."""
        return self.suspicion.groups

    def judgeable(self, snap: Snapshot) -> Snapshot | None:
        """What the leader judges this round. A small job: all of it. A large one: the ranks it has
        in full, once every member of the groups it asked for is there (else None)."""
        if self.every:
            return snap
        if not self.suspicion.groups:
            return None
        return tree.judged(snap, self.suspicion.groups, snap.get("taken_at") or time.time())

    def update(self, wanted: set[int], snap: Snapshot | None, now: float | None, parts: list[dict] | None,
               sample: set[int] | frozenset[int]) -> tuple | None:
        """What to ask now, as (stacks, groups, every, sample), where it differs from what was last
        sent; else None. parts: the summaries snap merged (tree.Suspicion reuses what it counted of
        the unchanged)."""
        groups: set[str] = set()
        if snap is not None:
            self.every = len(snap["ranks"]) <= tree.DETAIL_ALL_RANKS
            if not self.every:
                groups = self.suspicion.update(snap, now if now is not None else time.time(), parts)
        key = (frozenset(wanted), frozenset(groups), self.every, frozenset(sample))
        return None if key == self._sent else key

    def sent(self, key: tuple) -> None:
        self._sent = key
