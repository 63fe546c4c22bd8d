"""The warnings in words: analysis/desync.py's silent desyncs (their JSON, docs/findings.md
"warnings", and their text in report.txt and `colltrace analyze`) and the folder's damaged files
(tracefile/damage.py: JSON only; `colltrace analyze` names them on stderr)."""
from __future__ import annotations

from collections.abc import Sequence

from colltrace.analysis.desync import Desync, Place
from colltrace.reporters.phrases import capitalized, number_phrase, setup_kind
from colltrace.tracefile.damage import Damage
from colltrace.words import frame_text, group_label, rank_word


def _chain(p: Place) -> str:
    return " → ".join(frame_text(x) for x in p.frames)


def message(w: Desync) -> str:
    text = "; ".join(f"{rank_word(p.ranks)} in {p.op} at {_chain(p)}" for p in w.places)
    at = (capitalized(number_phrase(w.group["name"], w.seq)) if setup_kind(w.group["name"])
          else f"Collective #{w.seq} on {group_label(w.group)}")
    return (f"{at} was reached "
            f"from different places: {text}. It matched this time; the ranks are out of step there, and the next "
            f"change to either path can hang the job.")


def warning_json(w: Desync) -> dict:
    """The warning as `colltrace analyze --json` writes it."""
    return {"kind": "desync", "group": w.group, "seq": w.seq, "seqs": w.seqs,
            "places": [{"ranks": p.ranks, "op": p.op, "file": p.file, "line": p.line, "func": p.func,
                        "chain": _chain(p)} for p in w.places],
            "message": message(w)}


def damage_json(d: Damage) -> dict:
    """A file of the folder that could not be read whole, as `colltrace analyze --json` lists it
    among the warnings (docs/findings.md)."""
    return {"kind": "damaged_file", "file": d.file, "rank": d.rank, "reason": d.reason, "message": d.text()}


def render_warnings(warnings: Sequence[Desync]) -> str:
    """The warnings (a healthy run's silent desyncs) as text, or ""."""
    if not warnings:
        return ""
    n = len(warnings)
    lines = [f"colltrace: {n} warning{'s' if n != 1 else ''} (no hang this time)"]
    for i, w in enumerate(warnings, 1):
        extra = f" (and {len(w.seqs) - 1} more collectives the same way)" if len(w.seqs) > 1 else ""
        lines.append(f"[w{i}] {message(w)}{extra}")
    return "\n\n".join(lines)
