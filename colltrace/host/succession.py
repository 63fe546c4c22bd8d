"""Who speaks for the leader's ranks if its host dies, and where a host goes when its parent does.

A child of the leader copies the leader's summary every LEADER_COPY_S: if the leader's host stops
answering, its ranks as last seen are dead (lost_leader). On a tree, a host with children says where
it serves them, in the leader's store, and learns where its elder siblings do: the first of them
that still answers takes over the job's verdict (host/leader.py's Exchange moves to it)."""
from __future__ import annotations

import time

from colltrace.host import meeting, storelink

LEADER_COPY_S = 1.0          # how often another host copies the leader's summary (its ranks, if its host dies)


class Succession:
    def __init__(self) -> None:
        self.siblings: dict[int, tuple[str, int]] = {}   # the leader's other children's servers: who takes over
        self.root_address: tuple[str, int] | None = None  # the leader's server, for a host whose parent dies
        self.leader_copy: tuple[float, dict] | None = None   # (when, the leader's node summary)
        self.lost_leader: dict | None = None   # the leader's ranks, marked dead, once its host stopped answering
        self.took_over = False             # the leader's host died and this host judges the job now

    def copy_due(self, now: float) -> bool:
        return self.leader_copy is None or now - self.leader_copy[0] >= LEADER_COPY_S

    def keep_copy(self, now: float, copy: dict | None) -> None:
        if copy is not None:
            self.leader_copy = (now, copy)

    def dead_leader(self, address: str) -> dict:
        """The leader's own ranks as last copied, dead: its meeting point at address is gone."""
        copy = self.leader_copy
        assert copy is not None   # its callers checked it
        seen = copy[1]
        note = (f"its host ({seen.get('host')}) stopped answering: the leader's meeting point at {address} "
                "is gone")
        own = {str(r) for r in seen.get("own") or seen["ranks"]}
        return dict(seen, ranks={r: dict(e, status="dead", died_at=time.time(), exit={"signal": None, "note": note})
                                 for r, e in seen["ranks"].items() if r in own})

    def learn_siblings(self, link: storelink.StoreLink, index: int, serving: tuple[str, int]) -> None:
        """Say where this host (index) serves its children, in the leader's store, and learn where
        its elder siblings serve theirs."""
        if index not in self.siblings:
            link.write(meeting.parent_key(index), f"{serving[0]}:{serving[1]}".encode())
            self.siblings[index] = serving
        for k in range(2, index):
            if k not in self.siblings:
                raw = link.read(meeting.parent_key(k))
                if raw is not None:
                    self.siblings[k] = storelink.parse_address(raw.decode(errors="replace"))

    def elder_siblings(self, index: int) -> list[tuple[str, int]]:
        """The servers of the leader's children before this one (index), first first: who takes over."""
        return [self.siblings[k] for k in sorted(self.siblings) if k < index]
