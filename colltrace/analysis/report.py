"""Findings as text a person can act on: one paragraph per finding, and ranks grouped into
stack classes with rank ranges (like LLNL's STAT).

Everything here reads the finding dict alone (as written to findings.jsonl), so the same text
comes from a live watchdog and from `colltrace analyze` on a copied folder.
"""
from __future__ import annotations

import functools
import os
import re
from collections import Counter

PENDING_STATES = ("waiting", "in_flight")
MAX_CLASSES = 12          # stack classes shown per finding; the rest are counted
MAX_RANKS_TEXT = 72       # longer rank lists are abbreviated in prose (the JSON has them all)


# -- ranks ----------------------------------------------------------------------------------
def _sorted_ranks(ranks) -> list[int]:
    return sorted({int(r) for r in ranks or ()})


def format_ranks(ranks) -> str:
    """[0, 1, 2, 3, 5, 7, 8] -> "0-3,5,7-8" (sorted, duplicates dropped)."""
    rs = _sorted_ranks(ranks)
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
    rs = _sorted_ranks(ranks)
    text = format_ranks(rs)
    if len(text) <= limit or len(rs) < 3:
        return text
    # a regular layout with a few holes: one step, from first to last
    step = Counter(b - a for a, b in zip(rs, rs[1:])).most_common(1)[0][0]
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
    rs = _sorted_ranks(ranks)
    if not rs:
        return "no rank"
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {short_ranks(rs)}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _verb(ranks, singular: str, plural: str) -> str:
    return singular if len(set(ranks or ())) == 1 else plural


# -- frames and locations -----------------------------------------------------------------
@functools.lru_cache(maxsize=8192)  # a job has few distinct files; 16k ranks share them
def _internal(path) -> bool:
    """Whether a frame's file is torch's, colltrace's or the standard library's: not where the
    user should look. Decided from the path alone (the analysis may run on another machine)."""
    p = "/" + str(path).replace("\\", "/").lstrip("/")
    if "/torch/" in p or "/colltrace/" in p or p.startswith("/<frozen "):
        return True
    m = _STDLIB.search(p)
    return m is not None and not p[m.end():].startswith(("site-packages/", "dist-packages/"))


_CPP_LOCATION = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|cu|h|hpp):\d+\] ")
_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?t?/")


def is_internal(path) -> bool:
    try:
        return _internal(path)
    except TypeError:  # an unhashable value in a malformed frame
        return _internal(str(path))


def user_frames(frames) -> list[dict]:
    """The frames outside torch, colltrace and the standard library, innermost last."""
    if not isinstance(frames, list):
        return []
    return [f for f in frames if isinstance(f, dict) and not is_internal(f.get("file", ""))]


def frame_text(f: dict) -> str:
    """"basename:line (func)"."""
    try:
        return _frame_text(f.get("file"), f.get("line", "?"), f.get("func"))
    except TypeError:  # an unhashable field in a malformed frame
        return _frame_text.__wrapped__(str(f.get("file")), str(f.get("line", "?")), str(f.get("func")))


@functools.lru_cache(maxsize=4096)  # 16k ranks usually stand at a handful of lines
def _frame_text(file, line, func) -> str:
    name = os.path.basename(str(file or "?").replace("\\", "/")) or "?"
    return f"{name}:{line} ({func or '?'})"


def user_location(frames) -> str | None:
    """The innermost frame that is the user's (not inside torch, colltrace or the stdlib), as
    "basename:line (func)"; the innermost frame when all are internal; None without frames."""
    if not frames or not isinstance(frames, list):
        return None
    for f in reversed(frames):
        if type(f) is dict and not is_internal(f.get("file", "")):
            return frame_text(f)
    last = frames[-1]
    return frame_text(last) if isinstance(last, dict) else None


def call_site(frames) -> str | None:
    """user_location plus where it is called from, when the call sits in a helper of the user's:
    "distributed.py:57 (gather_batch), called from train.py:100 (serve_teacher)". The caller is
    the nearest frame in another file (the way into the helper's module), else the direct one."""
    loc = user_location(frames)
    chain = user_frames(frames)
    if loc and len(chain) > 1:
        inner = chain[-1].get("file")
        caller = next((f for f in reversed(chain[:-1]) if f.get("file") != inner), chain[-2])
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


def _exit_text(e: dict) -> str:
    """"died of SIGSEGV", "exited with code 1 (ValueError: bad batch)", "was killed (…)"."""
    ex = e.get("exit") if isinstance(e.get("exit"), dict) else {}
    if e.get("status") == "exited" or e.get("state") == "exited":
        code = ex.get("code")
        text = f"exited with code {code}" if code is not None else "exited"
        if ex.get("exception"):
            text += f" ({ex['exception']})"
        return text
    if ex.get("signal"):
        return f"died of {ex['signal']}"
    return "vanished (no exit record: killed by SIGKILL/SIGTERM, or died in native code)"


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
    unknown = {"state": "unknown"}
    for r in _sorted_ranks(ranks):
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
    rs = _sorted_ranks(ranks)
    g = _group(finding, group) if group is not None else None
    if g and len(rs) > 16:
        rest = set(_sorted_ranks(g.get("ranks"))) - set(rs)
        if len(rest) <= 8 and set(rs) <= set(_sorted_ranks(g.get("ranks"))):
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
    if state == "unreadable":
        return f"{who} could not be read ({e.get('error') or 'unreadable'})"
    if state == "unknown":
        return f"{who} {_verb(rs, 'has', 'have')} no trace in this snapshot (another host, or not started)"
    if state in ("dead", "exited"):
        text = f"{who} {_exit_text(e)}"
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
    return next((table[str(r)] for r in _sorted_ranks(ranks) if str(r) in table), {})


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


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


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
            + "; ".join(parts) + f". They differ in {_and(differs)}.")
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
    head = f"Deadlock across groups {_and(groups)}: " if len(groups) > 1 else f"Deadlock on group {_and(groups or ['?'])}: "
    text = head + ": ".join(clauses) + (f". Nobody in this cycle can proceed (the longest has waited "
                                        f"{seconds(f.get('waited_s'))}).")
    dead = [int(r) for r, e in (f.get("ranks") or {}).items() if e.get("state") in ("dead", "exited")]
    if dead:
        text += f" {_cap(rank_word(dead))} {_verb(dead, 'has', 'have')} died since."
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
    dead = [r for r in waiting if (table.get(str(r)) or {}).get("state") in ("dead", "exited")]
    if dead:
        text += f" {_cap(rank_word(dead))} {_verb(dead, 'has', 'have')} died since, still waiting."
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
    if str(c) in table:
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
    text += f" {_exit_text(e)}"
    if e.get("stack"):
        text += f"; it was at {user_location(e['stack'])} when it died"
    text += "."
    last = f.get("last_collective")
    if isinstance(last, dict) and last.get("op"):
        state = {"waiting": "it died inside it", "in_flight": "still in flight", "completed": "completed",
                 "failed": "it failed"}.get(last.get("state"), last.get("state"))
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
        described = [r for r in _sorted_ranks(also) if str(r) in table]
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
    table = f.get("ranks") or {}
    rs = _sorted_ranks(table)
    sample = _sample(f, rs)
    g = (f.get("group") or {}).get("name")
    seqs = f.get("seqs") or []
    span = f" (#{seqs[0]}-#{seqs[-1]})" if len(seqs) > 1 else ""
    return (f"Identical data: {rank_word(rs)} sent byte-identical {_shape_text(sample.get('shapes'))} "
            f"{','.join(sample.get('dtypes') or []) or ''} tensors to {sample.get('op')} on {group_phrase(f, g)} at "
            f"{_locations(f, rs)} in {f.get('identical_calls')} of the last {f.get('calls')} calls{span}. Ranks that "
            f"split the data normally send different batches. This is no hang: the job goes on, silently training on "
            f"duplicated data.")


def _natural(s: str):
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


def paragraph(finding: dict) -> str:
    """The one-paragraph human summary of a finding (also its "summary" field)."""
    kind = finding.get("kind")
    render = {"mismatch": _mismatch, "deadlock": _deadlock, "stall": _stall, "unmatched_p2p": _unmatched,
              "dead_rank": _dead_rank, "duplicate_data": _duplicate}.get(kind)
    if render is None:
        body = finding.get("summary") or (f"{kind}: collective #{finding.get('seq')} on group "
                                          f"{(finding.get('group') or {}).get('name')}.")
    else:
        body = render(finding)
    advice = finding.get("advice")
    if advice:
        body += " " + advice
    return body + _unreadable(finding)


# -- stack classes ------------------------------------------------------------------------------
def _stack_label(e: dict) -> str:
    state = e.get("state")
    if state == "unreadable":
        return f"(unreadable: {e.get('error') or '?'})"
    if state == "unknown":
        return "(no trace)"
    chain = [frame_text(f) for f in user_frames(e.get("frames"))[-3:]]
    if e.get("op") and state in PENDING_STATES + ("completed", "failed", "dead", "exited"):
        if e.get("p2p") and e.get("peer") is not None:
            tail = f"{e['op']} {_direction(e)} rank {e['peer']} (#{e.get('seq')}) on group {e.get('group')}"
        else:
            tail = f"{e['op']} #{e.get('seq')} on group {e.get('group')}"
        if state == "failed":
            tail += " (failed)"
    elif state == "not_in_collective":
        tail = "(in no collective)" if e.get("frames") else "(in no collective; no live stack)"
    elif state in ("dead", "exited"):
        tail = ""
    else:
        tail = f"({state})"
    if state in ("dead", "exited"):
        tail = (tail + " " if tail else "") + f"[{_exit_text(e)}]"
    return " → ".join(chain + [tail])


def render_stack_classes(finding: dict) -> str:
    """Ranks with the same stack grouped into classes, STAT-like:
    "ranks 0-6: train.py:900 (main) → checkpoint.py:302 (save) → barrier #5 on group 0"."""
    table = finding.get("ranks") or {}
    if not isinstance(table, dict) or not table:
        return ""
    by_label: dict[str, list[int]] = {}
    for r, e in table.items():
        try:
            rank = int(r)
        except (TypeError, ValueError):
            continue
        by_label.setdefault(_stack_label(e if isinstance(e, dict) else {}), []).append(rank)
    if not by_label:
        return ""
    rows = sorted(((sorted(rs), label) for label, rs in by_label.items()), key=lambda x: x[0][0])
    heads = [rank_word(rs) + ":" for rs, _ in rows[:MAX_CLASSES]]
    width = min(max((len(h) for h in heads), default=0), 24)
    lines = ["  stacks (ranks with the same stack):"]
    for (rs, label), head in zip(rows, heads):
        lines.append(f"    {head.ljust(width)} {label}")
    if len(rows) > MAX_CLASSES:
        rest = sum(len(rs) for rs, _ in rows[MAX_CLASSES:])
        lines.append(f"    … {len(rows) - MAX_CLASSES} more classes ({rest} ranks)")
    return "\n".join(lines)


def render_report(findings: list[dict]) -> str:
    """Every finding's paragraph and stack classes; "no problems found" when there are none."""
    if not findings:
        return "colltrace: no problems found"
    n = len(findings)
    out = [f"colltrace: {n} problem{'s' if n != 1 else ''} found"]
    for i, f in enumerate(findings, 1):
        block = f"[{i}] " + paragraph(f)
        classes_text = render_stack_classes(f)
        if classes_text:
            block += "\n" + classes_text
        out.append(block)
    return "\n\n".join(out)


# -- progress over the wait (the watchdog's samples of the ranks others wait for) -------------------
ROUTES = {"in-process": "the rank's own thread", "signal": "faulthandler's signal", "py-spy": "py-spy"}


def activity_text(rank, e: dict) -> str | None:
    """"rank 0: busy, 8.7 s of CPU in eval.py:40 (long_eval) over the last 9.0 s" and the like."""
    a = e.get("activity") if isinstance(e, dict) else None
    via = ROUTES.get(e.get("stack_via")) if isinstance(e, dict) else None
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


def _thread_deaths(rank, e: dict) -> list[str]:
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
    for r in _sorted_ranks(ranks):
        e = table.get(str(r)) or {}
        t = activity_text(r, e)
        if t:
            parts.append(t)
    return "; ".join(parts)


def _activity(finding: dict, ranks) -> str:
    """" Progress: …" for a stall's paragraph, and what it means for COLLTRACE_ON_HANG=abort."""
    table = finding.get("ranks") or {}
    deaths = [d for r in _sorted_ranks(ranks) for d in _thread_deaths(r, table.get(str(r)) or {})]
    deaths = "".join(f" {_cap(d)}." for d in deaths)
    text = activity_lines(finding, ranks)
    if not text:
        return deaths
    states = [((table.get(str(r)) or {}).get("activity") or {}).get("state") for r in ranks]
    if states and all(s == "progressing" for s in states):
        text += (f". {_cap(rank_word(ranks))} {_verb(ranks, 'is', 'are')} still working: slow, not hung "
                 f"(COLLTRACE_ON_HANG=abort leaves {'it' if len(ranks) == 1 else 'them'} running)")
    return f"{deaths} Progress: {text}."
