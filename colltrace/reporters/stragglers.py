"""Stragglers in words: the post-mortem paragraph and the live line (analysis/stragglers.py's facts)."""
from __future__ import annotations

from collections.abc import Sequence

from colltrace.words import frame_text


def render_stragglers(stragglers: Sequence[dict]) -> str:
    """One paragraph: who made the others wait, how often, how long, from where. Not a problem
    found: the job ran; it only ran slower."""
    parts = []
    for s in stragglers:
        parts.append(f"rank {s['rank']} arrived last at {s['collectives']} of {s['of']} collectives, "
                     f"{1000 * s['lag_s']:.0f} ms after the first on average, making the others wait "
                     f"{s['waited_for_s']:.1f} s in all ({round(100 * s['late_share'])} % of the time they span)"
                     + _straggler_where(s, MAX_WHERE_SAID))
    return "Stragglers (the job ran, slower): " + "; ".join(parts) + "."


def render_straggler_line(s: dict) -> str:
    """The live line (host/latecomers.py): one rank has made the others wait a share of the job's
    time over the last minute or so; said again only minutes later."""
    return (f"colltrace: straggler: rank {s['rank']} arrived last at {s['collectives']} of {s['of']} collectives "
            f"in the last {s.get('window_s', 0):.0f} s, {1000 * s['lag_s']:.0f} ms after the first on average: "
            f"the others waited for it {round(100 * s['late_share'])} % of the time"
            + _straggler_where(s, 1) + " (not a hang: the job runs slower)")


MAX_WHERE_SAID = 3


def _straggler_where(s: dict, most: int) -> str:
    """Where the straggler was while the others waited (its stack samples), else where it called
    its late collectives from; and the garbage collections in those waits, apart."""
    where = [w for w in list(s.get("where") or ())[:most] if round(100 * (w.get("share") or 0)) > 0]
    text = ""
    if where and s.get("where_from") == "samples":
        sites = ", ".join(f"{frame_text(w)} in {round(100 * w['share'])} %" for w in where)
        text = f"; while they waited it was at {sites} of {s.get('samples', 0)} samples of its stack"
    elif where:
        sites = ", ".join(frame_text(w) + (f" ({round(100 * w['share'])} %)" if most > 1 else "") for w in where)
        text = f"; it called them from {sites}"
    if (s.get("gc_s") or 0) >= 0.001:
        text += f"; garbage collection held it {1000 * s['gc_s']:.0f} ms of that time"
    if (s.get("clock_error_s") or 0) > 0:   # compared across hosts: their clocks' offsets taken off
        text += f" (hosts' clocks matched to within {_ms(s['clock_error_s'])})"
    return text


def _ms(seconds: float) -> str:
    ms = 1000 * seconds
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"
