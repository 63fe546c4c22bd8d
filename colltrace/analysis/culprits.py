"""The culprits: the ranks whose own state explains every other rank's wait (root cause, not
consequences), read from the findings alone.

    c = culprits.explain(findings)    # {"culprits": [12, 14], "reasons": {...}, "others": [...], ...}

Findings already follow the wait graph to where each wait starts (a rank that only waits for
another is credited to that one's problem), so each names its own root:

- mismatch: the ranks of the smallest class of calls (the odd call out); a tie names them all;
- dead_rank: the rank; deadlock: the ranks that made the cycle's odd call;
- stall (arrival), unmatched_p2p, unverified p2p: the ranks that never arrived or posted;
- a collective that some members completed and others did not: the ones that did not (they
  stopped first in that group's sequence, whatever they were doing);
- a collective or transfer that no member completes, where everyone arrived: a consequence when
  any of the above exists (work queued behind a stuck rank on the same GPU or stream); else its
  ranks are the culprits (the backend itself hangs there).

No table of framework group names: only groups, sequence numbers and who waits on whom.
"""
from __future__ import annotations

from colltrace.model.finding import Deadlock, DeadRank, Finding, Mismatch, Stall, UnmatchedP2P
from colltrace.words import and_list, rank_word   # rank lists and joins in the reasons


def _op(f: Finding) -> str:
    """The collective's name, from the first rank in it ("" when none says)."""
    for e in f.ranks.values():
        if e.get("seq") == f.seq and e.get("op"):
            return f"{e['op']} "
    return ""


def _minority(f: Mismatch) -> list[int]:
    classes = [c for c in f.classes if c.get("ranks")]
    if not classes:
        return []
    smallest = min(len(c["ranks"]) for c in classes)
    odd = [c for c in classes if len(c["ranks"]) == smallest]
    if len(odd) == len(classes) and len(classes) > 1:
        return sorted({r for c in classes for r in c["ranks"]})
    return sorted({r for c in odd for r in c["ranks"]})


def _roots(f: Finding) -> tuple[str, list[int], str]:
    """(strength, ranks, why) for one finding. strength: "root", "lag", "backend" or ""."""
    g = f.group.get("name")
    where = f"{_op(f)}#{f.seq} on group {g}"
    if isinstance(f, Mismatch):
        rs = _minority(f)
        odd = [c for c in f.classes if set(c.get("ranks") or ()) & set(rs)]
        rest = [c for c in f.classes if c not in odd]
        differs = [d.replace("_", " ") for d in f.differs]
        if odd and rest and "op" in differs:
            why = (f"called {odd[0].get('op')} where {rank_word(rest[0]['ranks'])} called "
                   f"{rest[0].get('op')}, as #{f.seq} on group {g}")
        else:
            why = f"called {where} with different {and_list(differs) or 'arguments'} than the other members"
        return "root", rs, why
    if isinstance(f, DeadRank):
        return "root", [f.rank], "died (or exited) while the others still needed it"
    if isinstance(f, Deadlock):
        cyc = f.cycle or [{}]
        first = cyc[0]
        why = f"waited in {first.get('op')} #{first.get('seq')} on group {first.get('group')}"
        if first.get("missing"):
            why += f", which {rank_word(first['missing'])} never called"
            other = next((c for c in cyc[1:] if set(c.get("waiting") or ()) & set(first["missing"])), None)
            if other:
                why += f" (waiting in {other.get('op')} #{other.get('seq')} on group {other.get('group')} instead)"
        return "root", sorted(first.get("waiting") or []), why + ": a wait cycle"
    if isinstance(f, UnmatchedP2P):
        return "root", [int(f.peer)] if f.peer is not None else [], \
            f"never posted the op matching rank {f.rank}'s {f.op}"
    if not isinstance(f, Stall):
        return "", [], ""
    if f.p2p:
        if f.stage == "unverified" and f.peer is not None:
            return "root", [f.peer], f"showed no op matching rank {f.rank}'s {f.op}"
        return "backend", sorted(int(r) for r in f.ranks), "posted a transfer that never completes"
    if f.stage == "completion":
        if f.completed_ranks:
            return "lag", sorted(f.waiting), (f"did not complete {where}, which "
                                              f"{rank_word(f.completed_ranks)} completed")
        return "backend", sorted(f.waiting), f"entered {where} with everyone, and it never completes"
    rs = sorted(set(f.missing_ranks) | set(f.unknown_ranks or []))
    waiting = f.waiting
    return "root", rs, (f"never entered {where}" + (f", where {rank_word(waiting)} waited" if waiting else ""))


def _waiters(f: Finding) -> set[int]:
    """Ranks this finding shows waiting on others (not the ones waited for)."""
    if isinstance(f, UnmatchedP2P) or (isinstance(f, Stall) and f.stage == "unverified"):
        return {f.rank} if f.rank is not None else set()
    if isinstance(f, Stall) and f.stage != "completion":
        return set(f.waiting)
    return set()


def explain(findings: list[Finding]) -> dict:
    """{"culprits": sorted ranks, "reasons": {rank: [why, ...]}, "others": the ranks that only wait,
    "consequences": keys of the findings that name no culprit}; reporters.text.culprit_paragraph
    renders it."""
    hang = [f for f in findings if f.kind != "duplicate_data"]
    by: dict[str, dict[int, list[str]]] = {"root": {}, "lag": {}, "backend": {}}
    named = [(f, _roots(f)) for f in hang]
    for f, (strength, ranks, why) in named:
        for r in ranks if strength else ():
            by[strength].setdefault(r, []).append(why)
    waiting = set().union(*(_waiters(f) for f in hang)) if hang else set()
    chosen = dict(by["root"])
    for r, whys in by["lag"].items():
        # lagging in one group while waiting for others elsewhere: a consequence, not a cause
        if r not in waiting or r in chosen:
            chosen.setdefault(r, []).extend(whys)
    if not chosen:
        chosen = by["backend"]
    culprits = sorted(chosen)
    involved: set[int] = set()
    for f in hang:
        involved.update(int(r) for r in f.ranks)
        involved.update(f.behind or [])
        if isinstance(f, Stall):   # ranks; a dead rank's `waiting` lists collectives
            involved.update(f.waiting)
    others = sorted(involved - set(culprits))
    reasons = {str(r): sorted(set(chosen[r]), key=chosen[r].index) for r in culprits}
    # findings that name no culprit as their own root: work stuck behind the culprits
    consequences = [f.key for f, (_, ranks, _) in named if not set(ranks) & set(culprits)]
    return {"culprits": culprits, "reasons": reasons, "others": others, "consequences": consequences}
