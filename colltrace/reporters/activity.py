"""What the missing ranks were doing while others waited: progressing, frozen, blocked in I/O
(host/probes.py's samples), and the threads that died in them."""
from __future__ import annotations

from colltrace.model.finding import Finding, Stall
from colltrace.model.parts import RankPart
from colltrace.reporters.locations import user_location, where
from colltrace.reporters.phrases import capitalized, first_line, verb_for
from colltrace.words import frame_text, rank_word, sorted_ranks

ROUTES = {"in-process": "the rank's own thread", "signal": "faulthandler's signal", "py-spy": "py-spy"}


def activity_text(rank, e: RankPart) -> str | None:
    """"rank 0: busy, 8.7 s of CPU in eval.py:40 (long_eval) over the last 9.0 s" and the like."""
    a = e.get("activity") if isinstance(e, dict) else None
    via = ROUTES.get(str(e.get("stack_via"))) if isinstance(e, dict) else None
    if not isinstance(a, dict):
        return f"rank {rank}: live stack by {via}" if via else None
    at = frame_text(a["at"]) if isinstance(a.get("at"), dict) else where(e)
    cpu, w = a.get("cpu_s") or 0.0, a.get("window_s") or 0.0
    state = a.get("state")
    if state == "progressing" and a.get("how") == "busy":
        text = f"rank {rank}: busy, {cpu:.1f} s of CPU in {at} over the last {w:.1f} s"
    elif state == "progressing":
        text = (f"rank {rank}: moving, {a.get('stacks_seen')} different stacks (now {at}) and {cpu:.1f} s of CPU "
                f"over the last {w:.1f} s")
    elif state == "blocked_io":
        moved = a.get("io_bytes") or 0
        text = (f"rank {rank}: blocked in I/O in {at}, {cpu:.1f} s of CPU"
                + (f" and {moved / 1e6:.1f} MB read or written" if moved >= 1e5 else "") + f" over the last {w:.1f} s")
    elif state == "frozen" and a.get("how") == "device_sync":
        text = (f"rank {rank}: parked in a device sync at {at} (the same stack over the last {w:.1f} s; its "
                f"{cpu:.1f} s of CPU are the sync's spinning): it waits for its GPU work, which waits for a collective")
    elif state == "frozen":
        text = f"rank {rank}: frozen, {cpu:.1f} s of CPU and the same stack in {at} over the last {w:.1f} s"
    else:
        text = f"rank {rank}: sampled for {w:.1f} s, too short to tell whether it moves"
    return text + (f" (stack by {via})" if via else "")


def _thread_death_lines(rank, e: RankPart) -> list[str]:
    out = []
    for x in (e.get("thread_exceptions") or [])[-1:]:
        if isinstance(x, dict):
            at = user_location(x.get("frames")) or "?"
            out.append(f"rank {rank}'s thread {x.get('thread') or '?'} died of {x.get('type')}: "
                       f"{first_line(x.get('message') or '')} at {at}")
    return out


def activity_lines(finding: Finding, ranks=None) -> str:
    """The activity of the ranks a stall waits for, "; "-joined ("" when nothing was sampled)."""
    table = finding.ranks
    if ranks is None:
        ranks = finding.missing_ranks + ((finding.unknown_ranks or []) if isinstance(finding, Stall) else [])
    parts = []
    for r in sorted_ranks(ranks):
        e = table.get(str(r)) or {}
        t = activity_text(r, e)
        if t:
            parts.append(t)
    return "; ".join(parts)


def activity_clause(finding: Finding, ranks) -> str:
    """" Progress: …" for a stall's paragraph, and what it means for COLLTRACE_ON_HANG=abort."""
    table = finding.ranks
    lines = [d for r in sorted_ranks(ranks) for d in _thread_death_lines(r, table.get(str(r)) or {})]
    deaths = "".join(f" {capitalized(d)}." for d in lines)
    text = activity_lines(finding, ranks)
    if not text:
        return deaths
    states = [((table.get(str(r)) or {}).get("activity") or {}).get("state") for r in ranks]
    if states and all(s == "progressing" for s in states):
        text += (f". {capitalized(rank_word(ranks))} {verb_for(ranks, 'is', 'are')} still working: slow, not hung "
                 f"(COLLTRACE_ON_HANG=abort leaves {'it' if len(ranks) == 1 else 'them'} running)")
    return f"{deaths} Progress: {text}."
