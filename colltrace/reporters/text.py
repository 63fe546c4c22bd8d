"""Findings as text a person can act on: one paragraph per finding, and ranks grouped into
stack classes with rank ranges (like LLNL's STAT).

Everything here reads the finding dict alone (as written to findings.jsonl), so the same text
comes from a live watchdog and from `colltrace analyze` on a copied folder.
"""
from __future__ import annotations

from collections.abc import Sequence

import os
import re
import time

from colltrace.model.schema import DEAD, EXITED, FAILED, NOT_IN_COLLECTIVE, UNKNOWN, UNREADABLE
from colltrace.origins import FRAMEWORK, USER, for_roots, origin_of, user_frames
# The rank lists ("ranks 0-6"), joins ("a, b and c") and a frame's "file:line (func)" are shared
# with the analyzer's reasons and live below both: colltrace/words.py (its names are still
# importable from here, as the host's and the dashboard's modules do).
from colltrace.words import (and_list, format_ranks, frame_text, frame_text_of, rank_word,  # noqa: F401 (re-exported)
                             short_ranks, sorted_ranks)

PENDING_STATES = ("waiting", "in_flight")
MAX_CLASSES = 12          # stack classes shown per finding; the rest are counted
_CPP_LOCATION = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|cu|h|hpp):\d+\] ")


# -- words ----------------------------------------------------------------------------------
def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _verb(ranks, singular: str, plural: str) -> str:
    return singular if len(set(ranks or ())) == 1 else plural


# -- frames and locations -----------------------------------------------------------------
# Frames carry their origin ("user", "framework" with its "package", "internal"), set by the
# analyzer from the rank's recorded roots (colltrace/origins.py); a frame without one is the user's.
def _is_user(f) -> bool:
    return type(f) is dict and origin_of(f) == USER


def _api_text(f: dict) -> str:
    """A framework's function the user called: "lightning.barrier() (ddp.py:300)"."""
    name = os.path.basename(str(f.get("file") or "?").replace("\\", "/")) or "?"
    return f"{f.get('package') or 'a library'}.{f.get('func') or '?'}() ({name}:{f.get('line', '?')})"


def _innermost_user(frames) -> int | None:
    if not isinstance(frames, list):
        return None
    for i in range(len(frames) - 1, -1, -1):
        if _is_user(frames[i]):
            return i
    return None


def _via(frames, i: int) -> dict | None:
    """The framework call the user's frame i went through (the next frame in, if a framework's)."""
    nxt = frames[i + 1] if i + 1 < len(frames) else None
    return nxt if type(nxt) is dict and nxt.get("origin") == FRAMEWORK else None


def user_location(frames) -> str | None:
    """The user's innermost own frame, "basename:line (func)", with the framework call it went
    through: "model.py:42 (training_step) calling lightning.barrier() (ddp.py:300)". Without
    any frame of the user's: the innermost framework frame (else the innermost frame), saying
    so. None without frames."""
    if not frames or not isinstance(frames, list):
        return None
    i = _innermost_user(frames)
    if i is not None:
        text = frame_text(frames[i])
        via = _via(frames, i)
        return f"{text} calling {_api_text(via)}" if via else text
    fw = next((f for f in reversed(frames) if type(f) is dict and f.get("origin") == FRAMEWORK), None)
    if fw is not None:
        return f"{fw.get('package') or 'a library'}'s {frame_text(fw)} (no frame of your code on the stack)"
    last = frames[-1]
    return f"{frame_text(last)} (no frame of your code on the stack)" if isinstance(last, dict) else None


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
    i = _innermost_user(frames)
    if not loc or i is None:
        return loc
    # the user's frames calling straight into it (a framework's loop in between is no caller)
    chain = []
    j = i - 1
    while j >= 0 and _is_user(frames[j]):
        chain.append(frames[j])
        j -= 1
    if chain:
        inner = frames[i].get("file")
        caller = next((f for f in chain if f.get("file") != inner), chain[0])
        loc += f", called from {frame_text(caller)}"
    return loc


def where(entry: dict) -> str:
    return user_location(entry.get("frames")) or "an unknown place (no frames recorded)"


# -- groups and ops ---------------------------------------------------------------------------
def _group(finding: dict, name) -> dict | None:
    table = finding.get("groups") or {}
    g = table.get(str(name))
    if g is None:
        main = finding.get("group")
        if isinstance(main, dict) and str(main.get("name")) == str(name):
            g = main
    return g if isinstance(g, dict) else None


def group_phrase(finding: dict, name) -> str:
    """"group 0 (default_pg, ranks 0-7)"."""
    g = _group(finding, name)
    if not g:
        return f"group {name}"
    bits = [b for b in (g.get("desc"), f"ranks {short_ranks(g.get('ranks'))}" if g.get("ranks") else "") if b]
    return f"group {name} ({', '.join(bits)})" if bits else f"group {name}"


def _direction(e: dict) -> str:
    op = str(e.get("op") or "")
    backend = str(e.get("backend_op") or op)
    if backend == "batch_p2p":
        return "with"
    return "to" if backend == "send" or op in ("send", "isend", "send_object_list") else "from"


def op_phrase(finding: dict, e: dict, full_group: bool = True) -> str:
    """"barrier #5 on group 0 (default_pg, ranks 0-7)" or "recv from rank 3 (#2 between them) on group 0"."""
    op = e.get("op") or "?"
    grp = group_phrase(finding, e.get("group")) if full_group else f"group {e.get('group')}"
    if e.get("p2p") and e.get("peer") is not None:
        return f"{op} {_direction(e)} rank {e['peer']} (#{e.get('seq')} between them) on {grp}"
    return f"{op} #{e.get('seq')} on {grp}"


def seconds(x) -> str:
    try:
        return f"{float(x):.1f} s"
    except (TypeError, ValueError):
        return "? s"


def exit_text(e: dict) -> str:
    """"died of SIGSEGV", "exited with code 1 (ValueError: bad batch)", "was killed (…)"."""
    ex: dict = e["exit"] if isinstance(e.get("exit"), dict) else {}
    if e.get("status") == EXITED or e.get("state") == EXITED:
        code = ex.get("code")
        text = f"exited with code {code}" if code is not None else "exited"
        if ex.get("exception"):
            text += f" ({ex['exception']})"
        return text
    if ex.get("signal"):
        return f"died of {ex['signal']}" + (" at interpreter exit, after its program had finished" if ex.get("at_exit") else "")
    if ex.get("ended_by") == "colltrace":
        return f"ended by colltrace (abort: {ex.get('why')}) at {clock(ex.get('at'))}"
    return "vanished (no exit record: killed by SIGKILL/SIGTERM, or died in native code)"


def clock(t) -> str:
    """A unix time as the local HH:MM:SS a person compares with the job's own log."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(float(t)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _ended_by_colltrace(e: dict) -> bool:
    return isinstance(e.get("exit"), dict) and e["exit"].get("ended_by") == "colltrace"


def _died_since(f: dict, dead: list[int], still: str = "") -> str:
    """" Ranks 0-2 have died since." — or, for the ranks colltrace itself ended after the
    finding: " colltrace then ended ranks 0-3 (abort: deadlock) at 14:37:17." """
    table = f.get("ranks") or {}
    ended = [r for r in dead if _ended_by_colltrace(table.get(str(r)) or {})]
    others = [r for r in dead if r not in ended]
    text = ""
    if others:
        text += f" {_cap(rank_word(others))} {_verb(others, 'has', 'have')} died since{still}."
    if ended:
        ex = table[str(ended[0])]["exit"]
        text += f" colltrace then ended {rank_word(ended)} (abort: {ex.get('why')}) at {clock(ex.get('at'))}."
    return text


def not_taken_note(deadline_s: float) -> str:
    """What a stacks file says when its dump did not finish in time (the ranks were ended)."""
    return (f"(no stack dump within {deadline_s:g} s; the stacks at the hang are in findings.jsonl, "
            "report.txt and the rank's records: colltrace analyze this folder)\n")


def _shape_text(shapes) -> str:
    try:
        return ", ".join("x".join(str(d) for d in s) or "scalar" for s in shapes) or "none"
    except TypeError:
        return str(shapes)


# -- classes ----------------------------------------------------------------------------------
def classes(finding: dict, ranks, key=None) -> list[tuple[list[int], dict]]:
    """Ranks grouped by what they do and where: [(ranks, a sample entry)], by first rank."""
    table = finding.get("ranks") or {}
    key = key or (lambda e: (e.get("state"), e.get("op"), e.get("group"), e.get("seq"), e.get("peer"), where(e)))
    groups: dict = {}
    unknown = {"state": UNKNOWN}
    for r in sorted_ranks(ranks):
        e = table.get(str(r)) or unknown
        k = key(e)
        c = groups.get(k)
        if c is None:
            groups[k] = ([r], e)
        else:
            c[0].append(r)
    return sorted(groups.values(), key=lambda c: c[0][0])


def _who(finding: dict, ranks, group=None) -> str:
    """rank_word, or for most of a large group: "511 ranks (all of group 1 but rank 8)"."""
    rs = sorted_ranks(ranks)
    g = _group(finding, group) if group is not None else None
    if g and len(rs) > 16:
        rest = set(sorted_ranks(g.get("ranks"))) - set(rs)
        if len(rest) <= 8 and set(rs) <= set(sorted_ranks(g.get("ranks"))):
            but = f" but {rank_word(rest)}" if rest else ""
            return f"{len(rs)} ranks (all of group {group}{but})"
    return rank_word(rs)


def _locations(finding: dict, ranks) -> str:
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


def _where_instead(finding: dict, rs: list[int], e: dict) -> str:
    """What ranks that did not arrive are doing instead (one clause)."""
    who = rank_word(rs)
    state = e.get("state")
    if state == UNREADABLE:
        return f"{who} could not be read ({e.get('error') or 'unreadable'})"
    if state == UNKNOWN:
        return f"{who} {_verb(rs, 'has', 'have')} no trace in this snapshot (another host, or not started)"
    if state in (DEAD, EXITED):
        text = f"{who} {exit_text(e)}"
        if e.get("op"):
            text += f" in {op_phrase(finding, e, full_group=False)} at {where(e)}"
        return text
    if state in PENDING_STATES:
        text = f"{who} {_verb(rs, 'is', 'are')} in {op_phrase(finding, e)} at {where(e)}"
        if e.get("waiting_for"):
            text += f", waiting for {rank_word(e['waiting_for'])}"
        return text
    if e.get("frames"):
        text = f"{who} {_verb(rs, 'is', 'are')} in no blocking collective: {_verb(rs, 'its', 'their')} live stack is at {where(e)}"
        flight = [x for x in e.get("in_flight") or [] if isinstance(x, dict)]
        if flight:
            x = flight[-1]
            text += f" (its {op_phrase(finding, x, full_group=False)} issued at {where(x)} is still in flight)"
        return text
    text = f"{who} {_verb(rs, 'is', 'are')} in no collective (no live stack available"
    last = e.get("last")
    if isinstance(last, dict) and last.get("op"):
        text += (f"; {_verb(rs, 'its', 'their')} last collective was {last.get('op')} #{last.get('seq')} on group "
                 f"{last.get('group')} at {where(last)}, {last.get('state')}")
    return text + ")"


def _missing_text(finding: dict, ranks) -> str:
    cs = classes(finding, ranks)
    parts = [_where_instead(finding, rs, e) for rs, e in cs[:6]]
    if len(cs) > 6:
        parts.append(f"{sum(len(rs) for rs, _ in cs[6:])} more ranks elsewhere")
    return "; ".join(parts)


def _sample(finding: dict, ranks) -> dict:
    table = finding.get("ranks") or {}
    return next((table[str(r)] for r in sorted_ranks(ranks) if str(r) in table), {})


def _waiters_clause(finding: dict, ranks, verb_s="waits", verb_p="wait", prep="in") -> str:
    """"ranks 0-6 wait in barrier #5 on group 0 (...) at checkpoint.py:302 (save)"."""
    sample = _sample(finding, ranks)
    prep = f" {prep}" if prep else ""
    return (f"{_who(finding, ranks, sample.get('group'))} {_verb(ranks, verb_s, verb_p)}{prep} "
            f"{op_phrase(finding, sample)} at {_locations(finding, ranks)}")


def _behind(finding: dict) -> str:
    b = finding.get("behind") or []
    return f" Also stuck behind this: {rank_word(b)}." if b else ""


def _untraced(finding: dict) -> str:
    out = ""
    for n in finding.get("untraced_before") or []:
        out += (f" {n.get('count')} untraced collective(s) (run by torch itself, e.g. DDP's C++ all-reduces) ran on "
                f"group {n.get('group')} just before, on {rank_word(n.get('ranks'))}.")
    return out


def _unreadable(finding: dict) -> str:
    u = finding.get("unreadable_ranks") or []
    return f" Could not read {rank_word(u)}: the analysis did not see {_verb(u, 'it', 'them')}." if u else ""


# -- paragraphs -------------------------------------------------------------------------------
def _call_text(c: dict) -> str:
    """One mismatch class: "all_gather_object (allgather) with shape 4x8, bfloat16"."""
    op = str(c.get("op") or "?")
    backend = c.get("backend_op")
    text = op
    if backend and backend.replace("_", "") != op.replace("_", ""):
        text += f" ({backend})"
    extra = []
    if "shapes" in c:
        extra.append(f"shape {_shape_text(c['shapes'])}")
    if "dtypes" in c:
        extra.append(", ".join(str(d) for d in c["dtypes"] or ()) or "no dtype")
    if "reduce_op" in c:
        extra.append(f"reduce op {c['reduce_op']}")
    if "root" in c:
        extra.append(f"root rank {c['root']}")
    text += " with " + ", ".join(extra) if extra else ""
    if c.get("untraced"):
        text += " (untraced: run by torch itself, e.g. DDP's gradient all-reduce; named by the Flight Recorder)"
    return text


def _mismatch(f: dict) -> str:
    g = (f.get("group") or {}).get("name")
    parts = [f"{rank_word(c.get('ranks'))} called {_call_text(c)} at {_locations(f, c.get('ranks'))}"
             for c in f.get("classes") or []]
    differs = [d.replace("_", " ") for d in f.get("differs") or ["?"]]
    text = (f"Mismatch: collective #{f.get('seq')} on {group_phrase(f, g)} is not the same call on every rank: "
            + "; ".join(parts) + f". They differ in {and_list(differs)}.")
    m = f.get("missing_ranks")
    if m:
        text += f" {_cap(rank_word(m))} {_verb(m, 'has', 'have')} not reached it yet."
    return text + _untraced(f)


def _deadlock(f: dict) -> str:
    clauses = []
    for item in f.get("cycle") or []:
        waiting, missing = item.get("waiting") or [], item.get("missing") or []
        if item.get("p2p"):
            clauses.append(_waiters_clause(f, waiting) + f", whose matching op {rank_word(missing)} "
                                                         f"{_verb(missing, 'has', 'have')} not posted")
        else:
            clauses.append(_waiters_clause(f, waiting) + f" for {rank_word(missing)}, which "
                                                         f"{_verb(missing, 'has', 'have')} not entered it")
    groups = sorted({str(i.get("group")) for i in f.get("cycle") or []}, key=_natural)
    head = f"Deadlock across groups {and_list(groups)}: " if len(groups) > 1 else f"Deadlock on group {and_list(groups or ['?'])}: "
    text = head + ": ".join(clauses) + (f". Nobody in this cycle can proceed (the longest has waited "
                                        f"{seconds(f.get('waited_s'))}).")
    dead = [int(r) for r, e in (f.get("ranks") or {}).items() if e.get("state") in (DEAD, EXITED)]
    text += _died_since(f, sorted(dead))
    return text + _behind(f)


def _stall(f: dict) -> str:
    table = f.get("ranks") or {}
    g = (f.get("group") or {}).get("name")
    stage = f.get("stage")
    waited = seconds(f.get("waited_s"))
    if f.get("p2p"):
        a, c = f.get("rank"), f.get("peer")
        e = table.get(str(a), {})
        text = f"Stall: rank {a} has waited {waited} in {op_phrase(f, e)} at {where(e)}"
        if stage == "completion":
            text += f"; rank {c} posted the matching op, but the transfer does not complete (transport or GPU)."
        else:
            text += f"; whether rank {c} posted the matching op cannot be told: its trace window is too short."
        if c is not None and str(c) in table:
            text += " " + _cap(_where_instead(f, [int(c)], table[str(c)])) + "."
        return text + _behind(f)
    waiting = f.get("waiting") or []
    if stage == "completion":
        sample = _sample(f, waiting)
        done = f.get("completed_ranks") or []
        text = (f"Stall: every member of {group_phrase(f, g)} entered {sample.get('op', 'collective')} #{f.get('seq')}"
                f" at {_locations(f, waiting)}, but ")
        if done:
            text += (f"only {rank_word(done)} completed it; {_who(f, waiting, g)} {_verb(waiting, 'has', 'have')} "
                     f"not, after {waited}")
        else:
            text += f"none has completed it after {waited}"
        text += ": the collective itself is hung (a GPU kernel that does not finish, a network or transport fault)."
        return text + _untraced(f) + _behind(f)
    missing = (f.get("missing_ranks") or []) + (f.get("unknown_ranks") or [])
    instead = _missing_text(f, missing)
    text = (f"Stall: {_waiters_clause(f, waiting, f'has waited {waited}', f'have waited {waited}')}"
            f" for {rank_word(missing)}, which {_verb(missing, 'has', 'have')} not entered it. {_cap(instead)}.")
    dead = [r for r in waiting if (table.get(str(r)) or {}).get("state") in (DEAD, EXITED)]
    text += _died_since(f, dead, ", still waiting")
    text += _activity(f, missing)
    return text + _untraced(f) + _behind(f)


def _unmatched(f: dict) -> str:
    table = f.get("ranks") or {}
    a, c = f.get("rank"), f.get("peer")
    e = table.get(str(a), {})
    posted = f.get("posted")
    want = {"send": "recv", "recv": "send"}.get(str(e.get("backend_op") or ""), "matching op")
    count = f" (it posted {posted} to rank {a} so far)" if isinstance(posted, int) else ""
    text = (f"Unmatched p2p: rank {a} has waited {seconds(f.get('waited_s'))} in {op_phrase(f, e)} at {where(e)}, "
            f"but rank {c} has not posted the matching {want}{count}.")
    if c is not None and str(c) in table:
        text += " " + _cap(_where_instead(f, [int(c)], table[str(c)])) + "."
    text += _activity(f, [int(c)]) if c is not None else ""
    return text + _behind(f)


def _dead_rank(f: dict) -> str:
    table = f.get("ranks") or {}
    d = f.get("rank")
    e = table.get(str(d), {})
    text = f"Dead rank: rank {d}"
    if e.get("host"):
        text += f" (on {e['host']})"
    text += f" {exit_text(e)}"
    if e.get("stack"):
        text += f"; it was at {user_location(e['stack'])} when it died"
    text += "."
    last = f.get("last_collective")
    if isinstance(last, dict) and last.get("op"):
        state = {"waiting": "it died inside it", "in_flight": "still in flight", "completed": "completed",
                 "failed": "it failed"}.get(str(last.get("state")), last.get("state"))
        text += (f" Its last collective was {last.get('op')} #{last.get('seq')} on {group_phrase(f, last.get('group'))}"
                 f" at {where(last)} ({state}).")
    waits = f.get("waiting") or []
    for w in waits:
        rs = w.get("ranks") or []
        sample = _sample(f, rs)
        text += (f" It leaves {_who(f, rs, sample.get('group'))} waiting forever in {op_phrase(f, sample)} at "
                 f"{_locations(f, rs)} ({seconds(w.get('waited_s'))} so far).")
    also = f.get("also_missing") or []
    if also:
        described = [r for r in sorted_ranks(also) if str(r) in table]
        text += f" {_cap(rank_word(also))} {_verb(also, 'has', 'have')} not entered it either"
        text += f": {_missing_text(f, described)}." if described else "."
    for x in f.get("failed") or []:
        rs = x.get("ranks") or []
        sample = _sample(f, rs)
        err = f" ({_first_line(x.get('error'))})" if x.get("error") else ""
        text += (f" {_cap(_who(f, rs, sample.get('group')))} failed in {op_phrase(f, sample)} at "
                 f"{_locations(f, rs)} because of it{err}.")
    if not waits and not f.get("failed"):
        text += " No rank waits for it yet."
    return text + _behind(f)


def _first_line(text, limit: int = 160) -> str:
    """An error's first line, without the C++ source location gloo/NCCL put in front."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    line = _CPP_LOCATION.sub("", line)
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _duplicate(f: dict) -> str:
    if f.get("source") == "batches":
        return _duplicate_batches(f)
    table = f.get("ranks") or {}
    rs = sorted_ranks(table)
    sample = _sample(f, rs)
    g = (f.get("group") or {}).get("name")
    seqs = f.get("seqs") or []
    span = f" (#{seqs[0]}-#{seqs[-1]})" if len(seqs) > 1 else ""
    return (f"Identical data: {rank_word(rs)} sent byte-identical {_shape_text(sample.get('shapes'))} "
            f"{','.join(sample.get('dtypes') or []) or ''} tensors to {sample.get('op')} on {group_phrase(f, g)} at "
            f"{_locations(f, rs)} in {f.get('identical_calls')} of the last {f.get('calls')} calls{span}. Ranks that "
            f"split the data normally send different batches. This is no hang: the job goes on, silently training on "
            f"duplicated data.")


def _loader_clause(loader) -> str:
    """Where the identical batches came from: the DataLoader the user built, and why it repeats."""
    at = f"{os.path.basename(str(loader.get('file') or '?'))}:{loader.get('line')}"
    if loader.get("distributed"):
        n = loader.get("num_replicas")
        return (f"the DataLoader at {at} has a DistributedSampler"
                + (f" with num_replicas={n}" if n is not None else "") + ", yet the ranks read the same samples")
    if loader.get("before_init"):
        return f"the DataLoader at {at} was built before init_process_group (no DistributedSampler)"
    return f"the DataLoader at {at} has no DistributedSampler (its sampler: {loader.get('sampler') or '?'})"


def _duplicate_batches(f: dict) -> str:
    """What each rank fed its DDP/FSDP model (colltrace/analysis/batches.py)."""
    rs = sorted_ranks(f.get("ranks") or {})
    sample = _sample(f, rs)
    g = (f.get("group") or {}).get("name")
    loader = f.get("loader")
    source = (_loader_clause(loader) if isinstance(loader, dict) and loader.get("line")
              else f"no DataLoader was seen feeding them; the batches reach the model at {where(sample)}")
    return (f"{rank_word(rs)} trained on identical batches in {f.get('identical_calls')} of {f.get('calls')} sampled "
            f"steps: {source}. Their {f.get('model') or 'data-parallel'} model on {group_phrase(f, g)} is called at "
            f"{where(sample)}; ranks that split the data feed it different batches. This is no hang: the job goes "
            f"on, every one of these ranks repeating the same work.")


def _natural(s: str):
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


# -- look first -------------------------------------------------------------------------------
def _its(ranks) -> str:
    return _verb(ranks, "its", "their")


def _it(ranks) -> str:
    return _verb(ranks, "it", "they")


def _history_clause(look: dict) -> str:
    """Why this side and not the other, from the job's own history."""
    rs, vs = look.get("ranks") or [], look.get("versus") or []
    why = look.get("reason")
    if why == "left":
        return (f" In earlier iterations {rank_word(rs)} made another call at this point: {_it(rs)} left "
                f"{_its(rs)} own pattern, while {rank_word(vs)} {_verb(vs, 'keeps', 'keep')} to {_its(vs)}.")
    if why == "new":
        return (f" {_cap(rank_word(rs))} never made this call before, while {rank_word(vs)} "
                f"{_verb(vs, 'repeats', 'repeat')} {_its(vs)} usual one.")
    return ""


def _advice_mismatch(f: dict, look: dict) -> str:
    table = f.get("ranks") or {}
    cls = [c for c in f.get("classes") or [] if c.get("ranks")]
    g, seq = (f.get("group") or {}).get("name"), f.get("seq")
    if look.get("reason") == "undecided" or look.get("rank") is None:
        sides = [f"{rank_word(c['ranks'])} {_verb(c['ranks'], 'calls', 'call')} {c.get('op')} at "
                 f"{call_site((table.get(str(sorted(c['ranks'])[0])) or {}).get('frames')) or 'an unknown place'}"
                 for c in cls]
        return (f"Look first at both sides of collective #{seq} on group {g}: " + "; ".join(sides) +
                ". Neither the job's history nor a majority tells which side left the pattern.")
    odd = set(look.get("ranks") or [])
    mine = next((c for c in cls if set(c["ranks"]) == odd), None) or {"ranks": sorted(odd), "op": "?"}
    rest = [c for c in cls if c is not mine]
    other = max(rest, key=lambda c: (len(c["ranks"]), -min(c["ranks"]))) if rest else {"ranks": [], "op": "?"}
    loc = call_site((table.get(str(look.get("rank"))) or {}).get("frames")) or "the call"
    loc2 = user_location((table.get(str(sorted(other["ranks"])[0])) or {}).get("frames")) if other["ranks"] else None
    who, them = rank_word(mine["ranks"]), rank_word(other["ranks"])
    at = f" (at {loc2})" if loc2 else ""
    if "op" in (f.get("differs") or []):
        what = f"{mine.get('op')} where {them} {_verb(other['ranks'], 'calls', 'call')} {other.get('op')}{at}"
    else:
        fields = and_list([d.replace("_", " ") for d in f.get("differs") or ["?"]])
        what = f"{mine.get('op')} with different {fields} than {them}{at}"
    return (f"Look first at {loc}: {who} {_verb(mine['ranks'], 'calls', 'call')} {what}, as collective #{seq} on "
            f"group {g}." + _history_clause(dict(look, ranks=mine["ranks"], versus=look.get("versus") or other["ranks"])))


def _advice_dead(f: dict, look: dict) -> str:
    rank = f.get("rank")
    e = (f.get("ranks") or {}).get(str(rank)) or {}
    how = exit_text(e)
    why = look.get("reason")
    exc = (e.get("exit") or {}).get("exception") if isinstance(e.get("exit"), dict) else None
    if (e.get("exit") or {}).get("at_exit") and not f.get("waiting") and not f.get("failed"):
        return (f"Nothing waits for rank {rank}: its program had finished. A signal this late comes from native "
                f"threads still running as Python shuts down (gloo's, when a process group outlives "
                f"destroy_process_group or is never destroyed); its log has the stack.")
    if why == "error" and exc:
        at = user_location(e["stack"]) if e.get("stack") else None
        return f"Look first at rank {rank}'s error, {exc}" + (f", raised at {at}" if at else "") + " (its log has the traceback)."
    if why == "stack" and e.get("stack"):
        return f"Look first at why rank {rank} {how} at {user_location(e['stack'])}."
    if why == "signal":
        return f"Look first at why rank {rank} {how}: its log (faulthandler prints the Python stack there)."
    return f"Look first at why rank {rank} {how}: its log, and the kernel log (dmesg) for the OOM killer."


def _advice_deadlock(f: dict, look: dict) -> str:
    cycle = f.get("cycle") or []
    if not cycle:
        return ""
    first = cycle[0]
    waiting, missing = first.get("waiting") or [], first.get("missing") or []
    if len(classes(f, waiting, key=where)) == 1:
        loc = call_site(((f.get("ranks") or {}).get(str(look.get("rank"))) or {}).get("frames")) or _locations(f, waiting)
    else:
        loc = _locations(f, waiting)
    others = [c for c in cycle[1:] if set(c.get("waiting") or []) & set(missing)]
    if first.get("p2p"):
        peer = first.get("peer")
        text = (f"Look first at {loc}: rank {look.get('rank')}'s {first.get('op')} with rank {peer} is never matched, "
                f"because rank {peer} waits in {others[0]['op'] if others else 'something else'} itself.")
    else:
        instead = f" (waiting in {others[0]['op']} on group {others[0]['group']} instead)" if others else ""
        text = (f"Look first at {loc}: {first.get('op')} on group {first.get('group')} is a collective that "
                f"{rank_word(missing)} never {_verb(missing, 'calls', 'call')}{instead}.")
    return text + _history_clause(dict(look, ranks=waiting, versus=missing))


def _thread_deaths(e: dict) -> list[dict]:
    return [x for x in e.get("thread_exceptions") or [] if isinstance(x, dict)]


def _thread_death_advice(e: dict, who: str, goal: str) -> str:
    """A rank one of whose threads died of an exception: that is the first cause (the main thread
    then waits for what the thread would have done)."""
    x = _thread_deaths(e)[-1]
    at = user_location(x.get("frames")) or "its thread"
    return (f"Look first at {at}: {who}'s thread {x.get('thread') or '?'} died of {x.get('type')} "
            f"({_first_line(x.get('message') or '')}), and {who} waits at {where(e)} instead of reaching {goal}.")


def _advice_stall(f: dict, look: dict) -> str:
    table = f.get("ranks") or {}
    waiting = f.get("waiting") or []
    sample = _sample(f, waiting)
    op, g, seq = sample.get("op") or "collective", (f.get("group") or {}).get("name"), f.get("seq")
    why = look.get("reason")
    if why == "backend":
        return (f"Look first at the backend on {rank_word(waiting)} ({op} #{seq} on group {g} at "
                f"{_locations(f, waiting)}): every member entered it but it never completes; check the NCCL/gloo "
                f"logs, GPU health and the network.")
    goal = f"{op} #{seq} on group {g}"
    if why in ("left", "new"):
        rs, vs = look.get("ranks") or waiting, look.get("versus") or []
        loc = call_site((table.get(str(look.get("rank"))) or {}).get("frames")) or "the call"
        return (f"Look first at {loc}: {rank_word(rs)} {_verb(rs, 'enters', 'enter')} {goal} there, and "
                f"{rank_word(vs)} never {_verb(vs, 'does', 'do')}." + _history_clause(dict(look, ranks=rs, versus=vs)))
    rs = look.get("ranks") or []
    e = table.get(str(look.get("rank"))) or {}
    who = rank_word(rs)
    if e.get("state") in (UNREADABLE, UNKNOWN):
        return f"Look first at {who}: {_its(rs)} trace could not be read, and {goal} waits for {_verb(rs, 'it', 'them')}."
    if _thread_deaths(e):
        return _thread_death_advice(e, who, goal)
    if e.get("frames") or e.get("state") in PENDING_STATES:
        return (f"Look first at {where(e)}, where {who} {_verb(rs, 'is', 'are')}: "
                f"{_verb(rs, 'it never reaches', 'they never reach')} {goal}.")
    pid = e.get("pid")
    hint = f" (py-spy dump --pid {pid} on its host shows where it is)" if pid else ""
    if e.get("stack_errors"):
        hint = f" (no live stack: {'; '.join(map(str, e['stack_errors']))})"
    return (f"Look first at what {who} {_verb(rs, 'does', 'do')} after {_its(rs)} last collective{hint}: "
            f"{_verb(rs, 'it never reaches', 'they never reach')} {goal}.")


def _advice_p2p(f: dict, look: dict) -> str:
    table = f.get("ranks") or {}
    a, c = f.get("rank"), f.get("peer")
    op = f.get("op") or ((table.get(str(a)) or {}).get("op"))
    loc = user_location((table.get(str(a)) or {}).get("frames")) or "the call"
    why = look.get("reason")
    if why == "unposted":
        e = table.get(str(c)) or {}
        there = where(e) if e.get("frames") else f"rank {c}"
        return f"Look first at {there}: rank {c} never posts the op that matches rank {a}'s {op} at {loc}."
    if why == "transport":
        return (f"Look first at the transport between ranks {a} and {c}: both posted the transfer ({op} at {loc}) "
                f"but it never completes.")
    return (f"Look first at rank {c}'s side of {op} at {loc}: its trace window is too short to tell whether it "
            f"posted the match.")


def advice(finding: dict) -> str:
    """The "Look first at ..." sentence, from the finding's look_first facts."""
    look = finding.get("look_first")
    if not isinstance(look, dict):
        return str(finding.get("advice") or "")
    kind = finding.get("kind")
    if look.get("reason") == "data_split" and isinstance(finding.get("loader"), dict):
        loader = finding["loader"]
        at = f"{os.path.basename(str(loader.get('file') or '?'))}:{loader.get('line')}"
        if loader.get("distributed"):
            return (f"Look first at the DataLoader at {at}: its DistributedSampler must be given the world "
                    f"(num_replicas) and this rank's own rank, or left to read them from the process group.")
        fix = "build it after init_process_group with" if loader.get("before_init") else "give it"
        return (f"Look first at the DataLoader at {at}: {fix} sampler=DistributedSampler(dataset) (or let your "
                f"framework's prepare/Trainer shard it), and call sampler.set_epoch(epoch) each epoch.")
    if look.get("reason") == "data_split":
        return ("Look first at how the data is split over the ranks: a DataLoader without a DistributedSampler "
                "(or one built before init_process_group) gives every rank the same batches.")
    if kind == "mismatch":
        return _advice_mismatch(finding, look)
    if kind == "dead_rank":
        return _advice_dead(finding, look)
    if kind == "deadlock":
        return _advice_deadlock(finding, look)
    if finding.get("p2p"):
        return _advice_p2p(finding, look)
    if kind == "stall":
        return _advice_stall(finding, look)
    return str(finding.get("advice") or "")


def summarize(findings: list[dict]) -> list[dict]:
    """Fill each finding's "advice" and "summary" (its paragraph), in place; returns them."""
    for f in findings:
        try:
            f["advice"] = advice(f)
        except Exception as exc:   # never lose a finding over its text
            f["advice"] = f"(advice unavailable: {type(exc).__name__}: {exc})"
        f["summary"] = paragraph(f)
    return findings


def paragraph(finding: dict) -> str:
    """The one-paragraph human summary of a finding (also its "summary" field)."""
    kind = finding.get("kind")
    render = {"mismatch": _mismatch, "deadlock": _deadlock, "stall": _stall, "unmatched_p2p": _unmatched,
              "dead_rank": _dead_rank, "duplicate_data": _duplicate}.get(str(kind))
    if render is None:
        body = finding.get("summary") or (f"{kind}: collective #{finding.get('seq')} on group "
                                          f"{(finding.get('group') or {}).get('name')}.")
    else:
        body = render(finding)
    text = advice(finding)
    if text:
        body += " " + text
    return body + _unreadable(finding)


# -- stack classes ------------------------------------------------------------------------------
def _stack_chain(frames) -> list[str]:
    """The user's last three own frames and the framework call they went through; without a
    frame of the user's, the innermost framework (else any) frame, saying so."""
    if not isinstance(frames, list) or not frames:
        return []
    i = _innermost_user(frames)
    if i is None:
        loc = user_location(frames)
        return [loc] if loc else []
    chain = [frame_text(f) for f in user_frames(frames[:i + 1])[-3:]]
    via = _via(frames, i)
    if via is not None:
        chain.append(_api_text(via))
    return chain


def _stack_tail(e: dict) -> str:
    state = e.get("state")
    if e.get("op") and state in PENDING_STATES + ("completed", "failed", "dead", "exited"):
        if e.get("p2p") and e.get("peer") is not None:
            tail = f"{e['op']} {_direction(e)} rank {e['peer']} (#{e.get('seq')}) on group {e.get('group')}"
        else:
            tail = f"{e['op']} #{e.get('seq')} on group {e.get('group')}"
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


def _stack_label(e: dict) -> str:
    state = e.get("state")
    if state == UNREADABLE:
        return f"(unreadable: {e.get('error') or '?'})"
    if state == UNKNOWN:
        return "(no trace)"
    return " → ".join(_stack_chain(e.get("frames")) + [_stack_tail(e)])


def stack_classes(finding: dict) -> tuple[list[dict], dict | None]:
    """Ranks with the same stack grouped into classes, as data: ([{"ranks": [ints], "ranks_text",
    "stack": label}], {"classes": n, "ranks": n} beyond MAX_CLASSES or None)."""
    table = finding.get("ranks") or {}
    if not isinstance(table, dict) or not table:
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


def render_stack_classes(finding: dict) -> str:
    """Ranks with the same stack grouped into classes, STAT-like:
    "ranks 0-6: train.py:900 (main) → checkpoint.py:302 (save) → barrier #5 on group 0"."""
    rows, more = stack_classes(finding)
    if not rows:
        return ""
    heads = [row["ranks_text"] + ":" for row in rows]
    width = min(max((len(h) for h in heads), default=0), 24)
    lines = ["  stacks (ranks with the same stack):"]
    for row, head in zip(rows, heads):
        lines.append(f"    {head.ljust(width)} {row['stack']}")
    if more:
        lines.append(f"    … {more['classes']} more classes ({more['ranks']} ranks)")
    return "\n".join(lines)


def render_same_kind(f: dict) -> str:
    """The finding's `same_kind` call sites (colltrace/callsites/samekind.py) as an indented list, or ""."""
    sites = f.get("same_kind")
    if not isinstance(sites, list) or not sites:
        return ""
    who = rank_word(f.get("missing_ranks") or [])
    g = f.get("group") or {}
    lines = [f"\nThe same kind elsewhere: {len(sites)} other call site{'s' if len(sites) != 1 else ''} on group "
             f"{g.get('name')} ({g.get('desc') or 'no description'}) that {who} would not join either, "
             f"most likely next first:"]
    for s in sites:
        try:
            grp = "default group" if s.get("group") == "default" else f"group={s.get('group')}"
            why = s.get("may_be_default")
            if why:
                grp += ", may be the default group" + (f": {why}" if isinstance(why, str) else "")
            lines.append(f"  {frame_text_of(s.get('file'), s.get('line'), s.get('func'))}: {s.get('op')} ({grp})")
        except (AttributeError, TypeError):
            continue
    return "\n".join(lines)


def render_report(findings: list[dict]) -> str:
    """Every finding's paragraph and stack classes; "no problems found" when there are none."""
    if not findings:
        return "colltrace: no problems found"
    number = {f.get("key"): i for i, f in enumerate(findings, 1)}
    gone = sum(1 for f in findings if f.get("superseded_by"))
    n = len(findings) - gone
    out = [f"colltrace: {n} problem{'s' if n != 1 else ''} found"
           + (f" (and {gone} earlier stall{'s' if gone != 1 else ''} that turned into {'them' if n != 1 else 'it'})"
              if gone else "")]
    for i, f in enumerate(findings, 1):
        if f.get("superseded_by"):
            out.append(f"[{i}] " + superseded_line(f, number.get(f["superseded_by"])))
            continue
        block = f"[{i}] " + paragraph(f)
        classes_text = render_stack_classes(f)
        if classes_text:
            block += "\n" + classes_text
        block += render_same_kind(f)
        out.append(block)
    return "\n\n".join(out)


def superseded_line(f: dict, by: int | None = None) -> str:
    """An earlier stall that turned into something certain: said in one line, not repeated."""
    ref = f"[{by}] below" if by is not None else str(f.get("superseded_by"))
    return (f"Superseded by {ref}: the stall reported at {clock(f.get('detected_at'))} "
            f"({_first_line(f.get('summary') or paragraph(f), 120)})")


def supersedes_line(f: dict) -> str:
    """The line after a finding that replaces an earlier stall, on the job's stderr."""
    keys = f.get("supersedes") or []
    return (f"colltrace: this {f.get('kind')} is what the stall reported earlier ({', '.join(keys)}) turned into; "
            "that stall finding is superseded")


def headline(f: dict, limit: int = 400) -> str:
    """A finding's first sentence: what `colltrace run` repeats after the job's own output."""
    text = str(f.get("summary") or paragraph(f))
    m = re.search(r"[.!?](\s|$)", text)
    first = text[:m.start() + 1] if m else text
    return first if len(first) <= limit else first[:limit - 1] + "…"


def culprit_paragraph(culprits: list[int], reasons: dict, others: list[int]) -> str:
    """"Culprits: look at ranks 12,14 first. Rank 12 never entered ...; rank 14 did not complete
    .... The other 14 ranks involved (0-11,13,15) only wait, directly or through others, on them."
    Culprits with the same reason share one sentence."""
    if not culprits:
        return ""
    alike: dict[str, list[int]] = {}
    more: dict[str, int] = {}
    for r in culprits:
        why = reasons.get(str(r)) or ["is where the waits end"]
        alike.setdefault(why[0], []).append(r)
        more[why[0]] = max(more.get(why[0], 0), len(why) - 1)
    parts = [f"{rank_word(rs)} {why}" + (f" (and {more[why]} more like it)" if more[why] else "")
             for why, rs in alike.items()]
    text = f"Culprits: look at {rank_word(culprits)} first. {_cap('; '.join(parts))}."
    if others:
        who = (f"The other rank involved ({others[0]}) only waits" if len(others) == 1 else
               f"The other {len(others)} ranks involved ({short_ranks(others)}) only wait")
        text += f" {who}, directly or through others, on {'it' if len(culprits) == 1 else 'them'}."
    return text


# -- progress over the wait (the watchdog's samples of the ranks others wait for) -------------------
ROUTES = {"in-process": "the rank's own thread", "signal": "faulthandler's signal", "py-spy": "py-spy"}


def activity_text(rank, e: dict) -> str | None:
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
    elif state == "frozen":
        text = f"rank {rank}: frozen, {cpu:.1f} s of CPU and the same stack in {at} over the last {w:.1f} s"
    else:
        text = f"rank {rank}: sampled for {w:.1f} s, too short to tell whether it moves"
    return text + (f" (stack by {via})" if via else "")


def _thread_death_lines(rank, e: dict) -> list[str]:
    out = []
    for x in (e.get("thread_exceptions") or [])[-1:]:
        if isinstance(x, dict):
            at = user_location(x.get("frames")) or "?"
            out.append(f"rank {rank}'s thread {x.get('thread') or '?'} died of {x.get('type')}: "
                       f"{_first_line(x.get('message') or '')} at {at}")
    return out


def activity_lines(finding: dict, ranks=None) -> str:
    """The activity of the ranks a stall waits for, "; "-joined ("" when nothing was sampled)."""
    table = finding.get("ranks") or {}
    if ranks is None:
        ranks = (finding.get("missing_ranks") or []) + (finding.get("unknown_ranks") or [])
    parts = []
    for r in sorted_ranks(ranks):
        e = table.get(str(r)) or {}
        t = activity_text(r, e)
        if t:
            parts.append(t)
    return "; ".join(parts)


def _activity(finding: dict, ranks) -> str:
    """" Progress: …" for a stall's paragraph, and what it means for COLLTRACE_ON_HANG=abort."""
    table = finding.get("ranks") or {}
    lines = [d for r in sorted_ranks(ranks) for d in _thread_death_lines(r, table.get(str(r)) or {})]
    deaths = "".join(f" {_cap(d)}." for d in lines)
    text = activity_lines(finding, ranks)
    if not text:
        return deaths
    states = [((table.get(str(r)) or {}).get("activity") or {}).get("state") for r in ranks]
    if states and all(s == "progressing" for s in states):
        text += (f". {_cap(rank_word(ranks))} {_verb(ranks, 'is', 'are')} still working: slow, not hung "
                 f"(COLLTRACE_ON_HANG=abort leaves {'it' if len(ranks) == 1 else 'them'} running)")
    return f"{deaths} Progress: {text}."


def render_warnings(warnings: Sequence[dict]) -> str:
    """analysis.desync's warnings (a healthy run's silent desyncs) as text, or ""."""
    if not warnings:
        return ""
    n = len(warnings)
    lines = [f"colltrace: {n} warning{'s' if n != 1 else ''} (no hang this time)"]
    for i, w in enumerate(warnings, 1):
        extra = f" (and {len(w['seqs']) - 1} more collectives the same way)" if len(w.get("seqs", ())) > 1 else ""
        lines.append(f"[w{i}] {w['message']}{extra}")
    return "\n\n".join(lines)


def render_verdict(findings: list[dict], warnings: Sequence[dict] = (), stragglers: Sequence[dict] = ()) -> str:
    """The whole verdict as `colltrace analyze` prints it and report.txt holds it: the culprits
    first; findings that are only work stuck behind them (NCCL queues a whole step behind one
    stuck rank) are counted, not printed (--json lists every one); then any silent desyncs, then
    the ranks that made the others wait (colltrace/analysis/stragglers.py)."""
    from colltrace.analysis import culprits

    verdict = culprits.explain(findings)
    paragraph = culprit_paragraph(verdict["culprits"], verdict["reasons"], verdict["others"])
    if not paragraph:
        text = render_report(findings)
    else:
        behind = set(verdict["consequences"])
        shown = [f for f in findings if f.get("key") not in behind]
        text = paragraph + "\n\n" + render_report(shown)
        if len(shown) < len(findings):
            text += (f"\n\n{len(findings) - len(shown)} more findings are collectives stuck behind the culprits "
                     f"on the other ranks (every member arrived; the work never completes): see --json.")
    if warnings:
        text += "\n\n" + render_warnings(warnings)
    if stragglers:
        text += "\n\n" + render_stragglers(stragglers)
    return text


def render_stragglers(stragglers: Sequence[dict]) -> str:
    """One paragraph: who made the others wait, how often, how long, from where. Not a problem
    found: the job ran; it only ran slower."""
    parts = []
    for s in stragglers:
        where = ", ".join(f"{frame_text(w)} ({round(100 * w['share'])} %)" for w in s.get("where") or ())
        parts.append(f"rank {s['rank']} arrived last at {s['collectives']} of {s['of']} collectives, "
                     f"{1000 * s['lag_s']:.0f} ms after the first on average, making the others wait "
                     f"{s['waited_for_s']:.1f} s in all ({round(100 * s['late_share'])} % of the time they span)"
                     + (f"; it called them from {where}" if where else ""))
    return "Stragglers (the job ran, slower): " + "; ".join(parts) + "."



def render_straggler_line(s: dict) -> str:
    """The live line (host/latecomers.py): one rank has made the others wait a share of the job's
    time over the last minute or so; said again only minutes later."""
    where = (s.get("where") or [None])[0]
    return (f"colltrace: straggler: rank {s['rank']} arrived last at {s['collectives']} of {s['of']} collectives "
            f"in the last {s.get('window_s', 0):.0f} s, {1000 * s['lag_s']:.0f} ms after the first on average: "
            f"the others waited for it {round(100 * s['late_share'])} % of the time"
            + (f"; it called them from {frame_text(where)}" if where else "")
            + " (not a hang: the job runs slower)")
