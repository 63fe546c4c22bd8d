"""Ranks of one data-parallel group that trained on identical batches (duplicate_data).

Each rank samples what it feeds its DDP or FSDP model (colltrace/rank/batches.py): the same
training steps on every rank (the first few, then every Nth), a CRC-32 of a strided sample of the
input's bytes. Ranks that each read their own share of the data feed different bytes; ranks that
feed the same bytes step after step read the same batches: a DataLoader without a
DistributedSampler, or one built before init_process_group. No hang: a finding because N-1 of N
ranks repeat the same work, silently.

What is legitimately equal is never sampled or never compared: evaluation passes (no grad, or
the model in eval mode) are not counted, inputs too small or all of one byte value carry no
digest, a group of one rank compares nothing. And by default only batches a DataLoader gave are
judged: a smoke test feeding torch.randn from torch's fixed default seed (the DDP tutorial) feeds
every rank the same on purpose; COLLTRACE_DIGEST (the exhaustive mode) judges those too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from colltrace.analysis.view import JobView, to_int
from colltrace.model.finding import DuplicateData
from colltrace.model.parts import GroupRef, Loader
from colltrace.model.schema import COMPLETED

MIN_STEPS = 3      # identical sampled steps before it is a pattern
MIN_SHARE = 0.9    # of the sampled steps the ranks have in common


@dataclass
class Duplicate:
    model: str                 # the model's id on its ranks (the order they wrapped their models)
    kind: str                  # DistributedDataParallel | FSDP
    group: GroupRef            # the model's data-parallel group
    ranks: list[int]           # the ranks that fed identical batches
    steps: list[int] = field(default_factory=list)   # the identical sampled steps
    compared: int = 0          # sampled steps all of `ranks` have a digest for
    entries: dict = field(default_factory=dict)      # rank -> its entry["batches"][model]


def _steps(m: dict) -> dict[int, str]:
    out = {}
    for s in m.get("steps") or ():
        try:
            step, digest = to_int(s[0]), s[1]
        except (IndexError, TypeError, ValueError):
            continue
        if isinstance(digest, str) and digest:
            out[step] = digest
    return out


def _tally(ranks: tuple, by_rank: dict[int, dict[int, str]]) -> tuple[list[int], int]:
    """(steps where every one of `ranks` fed the same digest, steps all of them have one)."""
    common = set.intersection(*(set(by_rank[r]) for r in ranks))
    same = [s for s in sorted(common) if len({by_rank[r][s] for r in ranks}) == 1]
    return same, len(common)


def find(snap: JobView) -> list[Duplicate]:
    """Every set of ranks of one data-parallel group that fed identical batches in MIN_STEPS or
    more sampled steps and in MIN_SHARE of those compared; largest sets first."""
    models: dict[tuple, dict[int, dict]] = {}
    for rank, view in snap.ranks.items():
        b = view.entry.get("batches")
        if not isinstance(b, dict):
            continue   # the common case for ranks with no DDP/FSDP model
        for mid, m in b.items():
            try:
                g = m["group"]
                models.setdefault((str(mid), str(g["name"])), {})[rank] = m
            except (KeyError, TypeError):
                continue
    out = []
    for (mid, _name), entries in sorted(models.items()):
        sample = entries[min(entries)]
        try:
            members = sorted({to_int(r) for r in sample["group"]["ranks"]})
        except (KeyError, TypeError, ValueError):
            continue
        if not any(isinstance(m.get("loader"), dict) or m.get("exhaustive") for m in entries.values()):
            continue   # no DataLoader behind these batches: data made in the loop, equal by design or not
        by_rank = {r: _steps(m) for r, m in entries.items() if r in members}
        by_rank = {r: s for r, s in by_rank.items() if s}
        if len(members) < 2 or len(by_rank) < 2:
            continue   # a world (or group) of one, or one rank seen: nothing to compare
        # Only the steps every rank seen has sampled: a rank whose sample of a step has not come
        # yet (a loaded machine) would otherwise leave a smaller set named first, the whole later.
        steps = set.intersection(*(set(s) for s in by_rank.values()))
        by_rank = {r: {k: v for k, v in s.items() if k in steps} for r, s in by_rank.items()}
        # candidate sets: ranks that fed one digest at some step
        candidates: set[tuple] = set()
        for step in steps:
            buckets: dict[str, list[int]] = {}
            for r, s in by_rank.items():
                if step in s:
                    buckets.setdefault(s[step], []).append(r)
            candidates.update(tuple(sorted(rs)) for rs in buckets.values() if len(rs) >= 2)
        found: list[Duplicate] = []
        for rs in sorted(candidates, key=lambda c: (-len(c), c)):
            if any(set(rs) <= set(d.ranks) for d in found):
                continue   # part of a larger set already named
            same, compared = _tally(rs, by_rank)
            if len(same) >= MIN_STEPS and len(same) >= MIN_SHARE * compared:
                g = sample["group"]
                found.append(Duplicate(mid, str(sample.get("kind") or ""),
                                       {"name": str(g.get("name")), "desc": str(g.get("desc") or ""), "ranks": members},
                                       list(rs), same, compared, {r: entries[r] for r in rs}))
        out.extend(found)
    out.sort(key=lambda d: (-len(d.ranks), d.group["name"], d.model))
    return out


def _loader(view, m: dict) -> Loader | None:
    """The loader the rank read its last sampled batch from: its user's line, how it was made."""
    info = m.get("loader")
    if not isinstance(info, dict):
        return None
    frames = info.get("frames") if isinstance(info.get("frames"), list) else []
    own = view.origins.user_frames(frames) if view is not None else []
    at = (own or frames or [{}])[-1]
    out: Loader = {"file": at.get("file"), "line": at.get("line"), "func": at.get("func")}
    for k in ("before_init", "sampler", "distributed", "num_replicas"):
        if info.get(k) is not None:
            out[k] = info[k]
    return out


def findings(v) -> list[tuple[DuplicateData, list, set]]:
    """The findings for colltrace.analysis.findings.Analysis `v`: (finding, graph nodes, own ranks)."""
    out: list[tuple[DuplicateData, list, set]] = []
    for d in find(v.snap):
        r0 = d.ranks[0]
        ranks = {}
        for r in d.ranks:
            m = d.entries[r]
            s = _steps(m)
            last = d.steps[-1]
            rec = {"state": COMPLETED, "op": "forward", "group": d.group["name"], "seq": last,
                   "digest": s.get(last), "frames": m.get("frames") if isinstance(m.get("frames"), list) else []}
            loader = _loader(v.snap.ranks.get(r), m)
            if loader is not None:
                rec["loader"] = loader
            ranks[str(r)] = v.ev.entry(r, rec)
        key = f"duplicate_data:batches:{d.group['name']}:{d.model}:{','.join(map(str, d.ranks))}"
        # the model's data-parallel group as the ranks described it, not the snapshot's table
        f = v.ev.base(DuplicateData, key, d.group["name"], d.steps[-1], [], ranks, group=dict(d.group),
                      groups={d.group["name"]: dict(d.group)}, source="batches", model=d.kind, op="forward",
                      identical_calls=len(d.steps), calls=d.compared, seqs=d.steps,
                      digest=ranks[str(r0)].get("digest"), loader=ranks[str(r0)].get("loader"),
                      look_first={"ranks": list(d.ranks), "rank": r0, "reason": "data_split"})
        out.append((f, [], set(d.ranks)))
    return out
