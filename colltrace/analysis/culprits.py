"""The culprits: the ranks whose own state explains every other rank's wait (root cause, not
consequences), read from the findings alone.

    c = culprits.explain(findings)    # Explanation(culprits=[12, 14], reasons={12: [Reason(...)]}, ...)

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from colltrace.model.finding import Deadlock, DeadRank, Finding, Mismatch, Stall, UnmatchedP2P
from colltrace.model.schema import EXITED


@dataclass(frozen=True)
class Where:
    """A collective: its op (None where no rank said), number and group."""
    op: str | None
    seq: int | None
    group: str | None


@dataclass(frozen=True)
class Reason:
    """Why a rank is a culprit, as facts (colltrace/reporters/culprits.py words them). `what`:
    odd_op        it called `op` where `ranks` called `other_op`, as `at`
    odd_args      it called `at` with `differs` unlike the other members
    died          it died (or exited) while the others still needed it
    exited        it exited, with `code` (`how`: sys.exit, os._exit, return, exception, ...), or by
                  the signal `how` with no code, while the others still needed it
    cycle         it waited in `at`, which `ranks` never called (waiting in `instead`): a wait cycle
    never_posted  it never posted the op matching rank `rank`'s `op` (p2p)
    no_match      it showed no op matching rank `rank`'s `op` (an unverified p2p)
    no_transfer   it posted a transfer that never completes
    not_completed it did not complete `at`, which `ranks` completed
    never_completes it entered `at` with everyone, and it never completes
    never_entered it never entered `at`, where `ranks` waited"""
    what: str
    at: Where | None = None
    ranks: tuple[int, ...] = ()
    op: str | None = None
    other_op: str | None = None
    differs: tuple[str, ...] = ()
    rank: int | None = None
    instead: Where | None = None
    code: int | None = None
    how: str | None = None


@dataclass(frozen=True)
class Explanation:
    culprits: list[int]                 # sorted
    reasons: dict[int, list[Reason]]    # each culprit's, the first one first
    others: list[int]                   # the ranks involved that only wait
    consequences: list[str]             # keys of the findings that name no culprit: work stuck behind them


def _op(f: Finding) -> str | None:
    """The collective's name, from the first rank in it (None when none says)."""
    for e in f.ranks.values():
        if e.get("seq") == f.seq and e.get("op"):
            return str(e["op"])
    return None


def _minority(f: Mismatch) -> list[int]:
    classes = [c for c in f.classes if c.get("ranks")]
    if not classes:
        return []
    smallest = min(len(c["ranks"]) for c in classes)
    odd = [c for c in classes if len(c["ranks"]) == smallest]
    if len(odd) == len(classes) and len(classes) > 1:
        return sorted({r for c in classes for r in c["ranks"]})
    return sorted({r for c in odd for r in c["ranks"]})


def _cycle_at(c: Mapping[str, Any]) -> Where:
    return Where(c.get("op"), c.get("seq"), c.get("group"))


def _roots(f: Finding) -> tuple[str, list[int], Reason | None]:
    """(strength, ranks, reason) for one finding. strength: "root", "lag", "backend" or ""."""
    at = Where(_op(f), f.seq, f.group.get("name"))
    if isinstance(f, Mismatch):
        rs = _minority(f)
        odd = [c for c in f.classes if set(c.get("ranks") or ()) & set(rs)]
        rest = [c for c in f.classes if c not in odd]
        if odd and rest and "op" in f.differs:
            return "root", rs, Reason("odd_op", at=Where(None, f.seq, f.group.get("name")), op=odd[0].get("op"),
                                      ranks=tuple(rest[0]["ranks"]), other_op=rest[0].get("op"))
        return "root", rs, Reason("odd_args", at=at, differs=tuple(f.differs))
    if isinstance(f, DeadRank):
        ex = f.exit or {}
        if (f.ranks.get(str(f.rank)) or {}).get("state") == EXITED:
            if isinstance(ex.get("code"), int):
                return "root", [f.rank], Reason("exited", code=ex["code"], how=ex.get("how"))
            if ex.get("signal"):   # Python ended itself with it (SIGINT after KeyboardInterrupt)
                return "root", [f.rank], Reason("exited", how=str(ex["signal"]))
        return "root", [f.rank], Reason("died")
    if isinstance(f, Deadlock):
        cyc: Sequence[Mapping[str, Any]] = f.cycle or [{}]   # [{}]: read back without one
        first = cyc[0]
        missing = tuple(first.get("missing") or ())
        other = next((c for c in cyc[1:] if set(c.get("waiting") or ()) & set(missing)), None) if missing else None
        return "root", sorted(first.get("waiting") or []), Reason(
            "cycle", at=_cycle_at(first), ranks=missing, instead=_cycle_at(other) if other else None)
    if isinstance(f, UnmatchedP2P):
        return "root", [int(f.peer)] if f.peer is not None else [], Reason("never_posted", rank=f.rank, op=f.op)
    if not isinstance(f, Stall):
        return "", [], None
    if f.p2p:
        if f.stage == "unverified" and f.peer is not None:
            return "root", [f.peer], Reason("no_match", rank=f.rank, op=f.op)
        return "backend", sorted(int(r) for r in f.ranks), Reason("no_transfer")
    if f.stage == "completion":
        if f.completed_ranks:
            return "lag", sorted(f.waiting), Reason("not_completed", at=at, ranks=tuple(f.completed_ranks))
        return "backend", sorted(f.waiting), Reason("never_completes", at=at)
    rs = sorted(set(f.missing_ranks) | set(f.unknown_ranks or []))
    return "root", rs, Reason("never_entered", at=at, ranks=tuple(f.waiting))


def _waiters(f: Finding) -> set[int]:
    """Ranks this finding shows waiting on others (not the ones waited for)."""
    if isinstance(f, UnmatchedP2P) or (isinstance(f, Stall) and f.stage == "unverified"):
        return {f.rank} if f.rank is not None else set()
    if isinstance(f, Stall) and f.stage != "completion":
        return set(f.waiting)
    return set()


def explain(findings: list[Finding]) -> Explanation:
    """The culprits of these findings, each with its reasons; the ranks that only wait; the findings
    that are only work stuck behind the culprits. reporters/culprits.py words it."""
    hang = [f for f in findings if f.kind != "duplicate_data"]
    by: dict[str, dict[int, list[Reason]]] = {"root": {}, "lag": {}, "backend": {}}
    named = [(f, _roots(f)) for f in hang]
    for _f, (strength, ranks, why) in named:
        if strength and why is not None:
            for r in ranks:
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
    reasons = {r: list(dict.fromkeys(chosen[r])) for r in culprits}   # each reason once, in order
    consequences = [f.key for f, (_, ranks, _) in named if not set(ranks) & set(culprits)]
    return Explanation(culprits, reasons, others, consequences)
