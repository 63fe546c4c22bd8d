"""A rank's sampled batches (colltrace/rank/batches.py), read from its defs file into the
snapshot entry's "batches" (docs/design.md): per data-parallel model, its group, the digests of
its most recent sampled steps, where the training loop called it and the DataLoader it read.

Kept small: it travels through the store with every host summary.
"""
from __future__ import annotations

from colltrace.words import group_desc

KINDS = ("dp", "batch", "loader")
KEEP = 64   # sampled steps kept per model: enough for "in 40 of 40 sampled steps"


class BatchLog:
    def __init__(self):
        self.models: dict[int, dict] = {}
        self.loaders: dict[int, dict] = {}
        self.steps: dict[int, list] = {}     # model id -> [[step, digest], ...], oldest first
        self.last: dict[int, dict] = {}      # model id -> its newest sampled line

    def apply(self, d: dict) -> None:
        """One defs line of a KINDS kind (KeyError, TypeError, ValueError: a bad line)."""
        k = d["k"]
        if k == "dp":
            g = d.get("group") or {}
            self.models[int(d["id"])] = {"kind": str(d.get("kind", "")), "exhaustive": bool(d.get("exhaustive")),
                                         "group": {"name": str(g["name"]), "desc": group_desc(g.get("desc")),
                                                   "ranks": [int(r) for r in g["ranks"]]}}
        elif k == "loader":
            self.loaders[int(d["id"])] = {key: d.get(key) for key in
                                          ("frames", "before_init", "sampler", "distributed", "num_replicas")}
        else:
            m = int(d["m"])
            steps = self.steps.setdefault(m, [])
            steps.append([int(d["step"]), d.get("d")])
            if len(steps) > KEEP:
                del steps[:len(steps) - KEEP]
            self.last[m] = d

    def entry(self, frames) -> dict | None:
        """{"<model id>": {"kind", "group", "steps", "frames", "loader"}}; None when there is none.
        frames(stack id) resolves the interned stack of the training loop's call."""
        out = {}
        for mid, model in self.models.items():
            steps = self.steps.get(mid)
            if not steps:
                continue
            last = self.last[mid]
            e = dict(model, steps=[list(s) for s in steps], sampled=len(steps),
                     frames=frames(int(last.get("stack") or 0)))
            loader = self.loaders.get(last.get("loader") or 0)
            if loader is not None:
                e["loader"] = loader
            out[str(mid)] = e
        return out or None
