"""What one host sends up the exchange, and when: its summary, slimmed to what its parent asked.

What a verdict waits for goes up at once: a rank newly sent in full (it waits, the root asked, it
died) or whose status changed. The rest every PUBLISH_S; and where nothing but the beats changed (a
hung job), only the beats, nothing encoded."""
from __future__ import annotations

from collections.abc import Iterable

from colltrace.host import storelink, tree
from colltrace.model.build import compact_entry


class Publication:
    def __init__(self) -> None:
        self.urgent = False                 # publish at once: the leader waits for what it asked
        self._at = 0.0                      # time.time() of the last summary sent
        self._shape: dict | None = None     # which ranks went up in full, and their status, when last published
        self._bare: tuple | None = None     # (the link, what it published less the beats): unchanged -> beats only

    def publish(self, link: storelink.StoreLink, summary: dict, want: dict, own: Iterable, now: float) -> None:
        """summary: this host's (its subtree's); want: what the parent asked (tree.want_from);
        own: the ranks of this host itself."""
        ranks = tree.slim(summary["ranks"], want, now)
        shape = {r: (tree.detailed(e), e.get("status")) if isinstance(e, dict) else None
                 for r, e in ranks.items()}
        urgent = self.urgent or shape != self._shape
        if not urgent and now - self._at < storelink.PUBLISH_S:
            return
        bare = (storelink.without_beats(ranks), {k: v for k, v in summary.items() if k not in ("t", "ranks")})
        if not urgent and self._bare is not None and self._bare[0] is link and self._bare[1] == bare:
            link.publish_beat({"t": summary.get("t"), "ranks": ranks})
        else:
            ranks = {r: compact_entry(e) if tree.detailed(e) and "cls" not in e else e
                     for r, e in ranks.items()}
            classes = summary.get("classes") or {}
            extra = {}
            if not want["all"]:   # a large job: equal states travel once (tree.fold), counted here
                ranks, classes = tree.fold(ranks, classes)
                extra["tally"] = tree.subtree_tally(ranks, classes)
            link.publish_node({**summary, "own": sorted(int(r) for r in own), "ranks": ranks,
                               "classes": classes, **extra})
            self._bare = (link, bare)
        self._at, self.urgent, self._shape = now, False, shape
