"""Stack classes: the ranks of a finding grouped by their stacks, with rank ranges (like LLNL's STAT)."""
from __future__ import annotations

from colltrace.model.finding import Finding
from colltrace.model.parts import RankPart
from colltrace.model.schema import COMPLETED, DEAD, EXITED, FAILED, NOT_IN_COLLECTIVE, UNKNOWN, UNREADABLE
from colltrace.origins import is_wrapper, user_frames
from colltrace.reporters.locations import FramesMemo, api_text, innermost_user, user_location, via_frame
from colltrace.reporters.phrases import PENDING_STATES, call_at, direction_word, exit_text
from colltrace.words import frame_text, rank_word

MAX_CLASSES = 12          # stack classes shown per finding; the rest are counted


def _chain(frames) -> list[str]:
    """The user's last three own frames and the framework call they went through; without a
    frame of the user's, the innermost framework (else any) frame, saying so."""
    if not isinstance(frames, list) or not frames:
        return []
    i = innermost_user(frames)
    if i is None:
        loc = user_location(frames)
        return [loc] if loc else []
    chain = [frame_text(f) for f in user_frames(frames[:i + 1]) if not is_wrapper(f)][-3:]
    via = via_frame(frames, i)
    if via is not None:
        chain.append(api_text(via))
    return chain


_stack_chain = FramesMemo(_chain)   # once per frames list: 16k ranks share a handful


def _stack_tail(e: RankPart) -> str:
    state = e.get("state")
    if e.get("op") and state in PENDING_STATES + (COMPLETED, FAILED, DEAD, EXITED):
        if e.get("p2p") and e.get("peer") is not None:
            tail = f"{e['op']} {direction_word(e)} rank {e['peer']} (#{e.get('seq')}) on group {e.get('group')}"
        else:
            tail = call_at(e["op"], e.get("seq"), e.get("group"))
        if state == FAILED:
            tail += " (failed)"
    elif state == NOT_IN_COLLECTIVE:
        tail = "(in no collective)" if e.get("frames") else "(in no collective; no live stack)"
    elif state in (DEAD, EXITED):
        tail = ""
    else:
        tail = f"({state})"
    if state in (DEAD, EXITED):
        tail = (tail + " " if tail else "") + f"[{exit_text(e)}]"
    return tail


def _stack_label(e: RankPart) -> str:
    state = e.get("state")
    if state == UNREADABLE:
        return f"(unreadable: {e.get('error') or '?'})"
    if state == UNKNOWN:
        return "(no trace)"
    return " → ".join(_stack_chain(e.get("frames")) + [_stack_tail(e)])


def stack_classes(finding: Finding) -> tuple[list[dict], dict | None]:
    """Ranks with the same stack grouped into classes, as data: ([{"ranks": [ints], "ranks_text",
    "stack": label}], {"classes": n, "ranks": n} beyond MAX_CLASSES or None)."""
    table = finding.ranks
    if not table:
        return [], None
    by_label: dict[str, list[int]] = {}
    for r, e in table.items():
        try:
            rank = int(r)
        except (TypeError, ValueError):
            continue
        by_label.setdefault(_stack_label(e if isinstance(e, dict) else {}), []).append(rank)
    rows = sorted(((sorted(rs), label) for label, rs in by_label.items()), key=lambda x: x[0][0])
    out = [{"ranks": rs, "ranks_text": rank_word(rs), "stack": label} for rs, label in rows[:MAX_CLASSES]]
    more = None
    if len(rows) > MAX_CLASSES:
        more = {"classes": len(rows) - MAX_CLASSES, "ranks": sum(len(rs) for rs, _ in rows[MAX_CLASSES:])}
    return out, more


def render_stack_classes(finding: Finding) -> str:
    """Ranks with the same stack grouped into classes, STAT-like:
    "ranks 0-6: train.py:900 (main) → checkpoint.py:302 (save) → barrier #5 on group 0"."""
    rows, more = stack_classes(finding)
    if not rows:
        return ""
    heads = [row["ranks_text"] + ":" for row in rows]
    width = min(max((len(h) for h in heads), default=0), 24)
    lines = ["  stacks (ranks with the same stack):"]
    for row, head in zip(rows, heads, strict=True):
        lines.append(f"    {head.ljust(width)} {row['stack']}")
    if more:
        lines.append(f"    … {more['classes']} more classes ({more['ranks']} ranks)")
    return "\n".join(lines)
