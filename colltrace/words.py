"""The few words every layer writes: rank lists ("ranks 0-3,5"), joins ("a, b and c"), a
group's label ("group 3 (mesh_dp, ranks 0-3)") and a frame's "file:line (func)". The reporters'
paragraphs use them, and so do the analyzer's reasons
(culprits, desync), which must not import the reporters: they live here, below both. Nothing
imported but the standard library."""
from __future__ import annotations

import functools
import os
import signal
from collections import Counter
from collections.abc import Mapping
from typing import Any

MAX_RANKS_TEXT = 72       # longer rank lists are abbreviated in prose (the JSON has them all)


# -- ranks ----------------------------------------------------------------------------------
def sorted_ranks(ranks) -> list[int]:
    return sorted({int(r) for r in ranks or ()})


def format_ranks(ranks) -> str:
    """[0, 1, 2, 3, 5, 7, 8] -> "0-3,5,7-8" (sorted, duplicates dropped)."""
    rs = sorted_ranks(ranks)
    if not rs:
        return ""
    parts = []
    start = prev = rs[0]
    for r in rs[1:]:
        if r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = r
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def short_ranks(ranks, limit: int = MAX_RANKS_TEXT) -> str:
    """format_ranks, abbreviated when long: "0-4088 every 8 (512 ranks)", "0-16383 except 8195"."""
    rs = sorted_ranks(ranks)
    text = format_ranks(rs)
    if len(text) <= limit or len(rs) < 3:
        return text
    # a regular layout with a few holes: one step, from first to last
    step = Counter(b - a for a, b in zip(rs, rs[1:], strict=False)).most_common(1)[0][0]
    if step > 0 and all((r - rs[0]) % step == 0 for r in rs):
        full = (rs[-1] - rs[0]) // step + 1
        holes = full - len(rs)
        if holes <= 3:
            every = f" every {step}" if step > 1 else ""
            text = f"{rs[0]}-{rs[-1]}{every}"
            if holes:
                have = set(rs)
                text += " except " + ",".join(str(r) for r in range(rs[0], rs[-1] + 1, step) if r not in have)
            return f"{text} ({len(rs)} ranks)" if step > 1 or holes else text
    cut = text[:limit].rsplit(",", 1)[0]
    return f"{cut},… ({len(rs)} ranks)"


def rank_word(ranks) -> str:
    """"rank 7" or "ranks 0-6"."""
    rs = sorted_ranks(ranks)
    if not rs:
        return "no rank"
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {short_ranks(rs)}"


def counted(n: int, noun: str) -> str:
    """"1 finding", "2 findings", "no findings": how every command counts (findings, files, lines)."""
    return f"no {noun}s" if n == 0 else f"{n} {noun}{'s' if n != 1 else ''}"


def and_list(items: list[str]) -> str:
    """["a", "b", "c"] -> "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# -- groups ---------------------------------------------------------------------------------
TORCH_UNDESCRIBED = "undefined"   # torch's group_desc for a group made without a description


def group_desc(desc) -> str:
    """A group's description as read from torch or a trace: torch's placeholder is none."""
    text = str(desc or "")
    return "" if text == TORCH_UNDESCRIBED else text


def group_label(g: Mapping[str, Any]) -> str:
    """"group 0 (default_pg, ranks 0-7)"; a group without a description by its ranks alone:
    "group 3 (ranks 0-1)"."""
    bits = [b for b in (group_desc(g.get("desc")), f"ranks {short_ranks(g.get('ranks'))}" if g.get("ranks") else "")
            if b]
    return f"group {g.get('name')} ({', '.join(bits)})" if bits else f"group {g.get('name')}"


# -- frames ---------------------------------------------------------------------------------
def frame_text(f: dict) -> str:
    """"basename:line (func)"."""
    try:
        return frame_text_of(f.get("file"), f.get("line", "?"), f.get("func"))
    except TypeError:  # an unhashable field in a malformed frame
        return frame_text_of.__wrapped__(str(f.get("file")), str(f.get("line", "?")), str(f.get("func")))


@functools.lru_cache(maxsize=4096)  # 16k ranks usually stand at a handful of lines
def frame_text_of(file, line, func) -> str:
    name = os.path.basename(str(file or "?").replace("\\", "/")) or "?"
    return f"{name}:{line} ({func or '?'})"


def signal_name(code: int) -> str | None:
    """-9 -> "SIGKILL": the signal a process died of, by its exit code as Popen reports it (None:
    not a signal's)."""
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return None
