"""Where in the code: a frame list to the user's own line (and the framework call it made), and
findings' ranks grouped by where they are.

Frames carry their origin ("user", "framework" with its "package", "internal"), set by the
analyzer from the rank's recorded roots (colltrace/origins.py); a frame without one is the user's."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from colltrace.model.finding import Finding
from colltrace.model.parts import RankPart
from colltrace.model.schema import UNKNOWN
from colltrace.origins import FRAMEWORK, USER, callable_name, called, for_roots, innermost_user, is_wrapper, origin_of
from colltrace.words import frame_text, rank_word, sorted_ranks


def _is_user(f) -> bool:
    return type(f) is dict and origin_of(f) == USER


def api_text(f: dict) -> str:
    """A framework's function the user called, a method with its class where the frame has it:
    "lightning.barrier() (ddp.py:300)", "deepspeed.DeepSpeedEngine.save_checkpoint() (engine.py:3100)"."""
    name = os.path.basename(str(f.get("file") or "?").replace("\\", "/")) or "?"
    return f"{f.get('package') or 'a library'}.{callable_name(f)}() ({name}:{f.get('line', '?')})"


def via_frame(frames, i: int) -> dict | None:
    """The framework call the user's frame i went through: the frame it called, past the
    wrappers that pass calls on (a decorator's, DeepSpeed's nvtx), if a framework's."""
    j = called(frames, i)
    nxt = frames[j] if j is not None else None
    return nxt if type(nxt) is dict and nxt.get("origin") == FRAMEWORK else None


def user_location(frames) -> str | None:
    """The user's innermost own frame, "basename:line (func)", with the framework call it went
    through: "model.py:42 (training_step) calling lightning.barrier() (ddp.py:300)". Without
    any frame of the user's: the innermost framework frame (else the innermost frame), saying
    so. None without frames."""
    if not frames or not isinstance(frames, list):
        return None
    i = innermost_user(frames)
    if i is not None:
        text = frame_text(frames[i])
        via = via_frame(frames, i)
        return f"{text} calling {api_text(via)}" if via else text
    fw = next((f for f in reversed(frames) if type(f) is dict and f.get("origin") == FRAMEWORK and not is_wrapper(f)),
              None)
    if fw is not None:
        return f"{fw.get('package') or 'a library'}'s {frame_text(fw)} (no frame of your code on the stack)"
    last = frames[-1]
    return f"{frame_text(last)} (no frame of your code on the stack)" if isinstance(last, dict) else None


def exit_location(frames) -> str | None:
    """Where an exit call was made: user_location, never a `<string>` or `<stdin>` entry point (a
    harness started by `python -c`, multiprocessing's spawn): then the call itself, in a
    framework's or torch's code ("common_distributed.py:1068 (_run) (no frame of your code ...)")."""
    real = [f for f in frames or () if type(f) is dict and not str(f.get("file") or "").startswith("<")]
    return user_location(real) or user_location(frames)


def located(frames, roots) -> str | None:
    """user_location of frames straight from a trace (no origins marked yet), classified
    against the rank's recorded roots (colltrace/origins.py)."""
    if not frames or not isinstance(frames, list) or (type(frames[-1]) is dict and "origin" in frames[-1]):
        return user_location(frames)
    return user_location(for_roots(roots).annotate(frames))


def call_site(frames) -> str | None:
    """user_location plus where it is called from, when the call sits in a helper of the user's:
    "distributed.py:57 (gather_batch), called from train.py:100 (serve_teacher)". The caller is
    the nearest frame in another file (the way into the helper's module), else the direct one."""
    loc = user_location(frames)
    i = innermost_user(frames)
    if not loc or i is None:
        return loc
    # the user's frames calling straight into it (a framework's loop in between is no caller;
    # a wrapper, the user's or a framework's, passes the call on and is none either)
    chain = []
    j = i - 1
    while j >= 0 and (_is_user(frames[j]) or is_wrapper(frames[j])):
        if not is_wrapper(frames[j]):
            chain.append(frames[j])
        j -= 1
    if chain:
        inner = frames[i].get("file")
        caller = next((f for f in chain if f.get("file") != inner), chain[0])
        loc += f", called from {frame_text(caller)}"
    return loc


class FramesMemo:
    """fn(frames), worked out once per frames list. Ranks in one state share their frames list
    (the root unfolds a class once: host/tree.py; the analyzer marks origins once per list), so a
    16,384-rank finding has a handful of lists. The memo holds each list, so its id is not reused
    while cached; a list that grew, or had its origins marked since, is worked out again."""

    MAX = 8192

    def __init__(self, fn):
        self.fn = fn
        self._memo: dict[int, tuple] = {}

    def __call__(self, frames):
        if type(frames) is not list or not frames:
            return self.fn(frames)
        marked = type(frames[-1]) is dict and "origin" in frames[-1]
        hit = self._memo.get(id(frames))
        if hit is not None and hit[0] is frames and hit[1] == len(frames) and hit[2] == marked:
            return hit[3]
        value = self.fn(frames)
        if len(self._memo) >= self.MAX:
            self._memo.clear()
        self._memo[id(frames)] = (frames, len(frames), marked, value)
        return value


_user_location = FramesMemo(user_location)


def where(entry: Mapping[str, Any]) -> str:
    return _user_location(entry.get("frames")) or "an unknown place (no frames recorded)"


def classes(finding: Finding, ranks, key=None) -> list[tuple[list[int], RankPart]]:
    """Ranks grouped by what they do and where: [(ranks, a sample entry)], by first rank."""
    table = finding.ranks
    key = key or (lambda e: (e.get("state"), e.get("op"), e.get("group"), e.get("seq"), e.get("peer"), where(e)))
    groups: dict = {}
    unknown: RankPart = {"state": UNKNOWN}
    for r in sorted_ranks(ranks):
        e = table.get(str(r)) or unknown
        k = key(e)
        c = groups.get(k)
        if c is None:
            groups[k] = ([r], e)
        else:
            c[0].append(r)
    return sorted(groups.values(), key=lambda c: c[0][0])


def locations_text(finding: Finding, ranks) -> str:
    """"checkpoint.py:302 (save)" or "a.py:1 (f) (ranks 0-3), b.py:2 (g) (ranks 4-6)"."""
    cs = classes(finding, ranks, key=lambda e: where(e))
    if not cs:
        return "an unknown place"
    if len(cs) == 1:
        return where(cs[0][1])
    shown = [f"{where(e)} ({rank_word(rs)})" for rs, e in cs[:4]]
    if len(cs) > 4:
        shown.append(f"{len(cs) - 4} more places")
    return ", ".join(shown)
