"""The small words every finding's text is made of: groups and ops, times, exits, how many
(verbs agreeing with their ranks), a message's first line."""
from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, cast

from colltrace.model.finding import Finding, Mismatch, Stall
from colltrace.model.parts import GroupRef, RankPart
from colltrace.model.schema import (
    EXIT_CALLS,
    EXITED,
    IN_FLIGHT,
    INTERRUPTED,
    NATIVE_EXIT,
    RAISED,
    RETURNED,
    SETUP_GROUP,
    SETUP_LOCAL,
    STORE_WAIT,
    WAITING,
    Exit,
    Record,
)
from colltrace.words import group_label, rank_word, sorted_ranks

PENDING_STATES = (WAITING, IN_FLIGHT)


_CPP_LOCATION = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|cu|h|hpp):\d+\] ")


def capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def verb_for(ranks, singular: str, plural: str) -> str:
    return singular if len(set(ranks or ())) == 1 else plural


def _group(finding: Finding, name) -> GroupRef | None:
    g = finding.groups.get(str(name))
    if g is None and str(finding.group.get("name")) == str(name):
        g = finding.group
    return g


def group_phrase(finding: Finding, name) -> str:
    """"group 0 (default_pg, ranks 0-7)"."""
    g = _group(finding, name)
    return group_label(dict(g, name=name)) if g else f"group {name}"


def direction_word(e: Record) -> str:
    op = str(e.get("op") or "")
    backend = str(e.get("backend_op") or op)
    if backend == "batch_p2p":
        return "with"
    return "to" if backend == "send" or op in ("send", "isend", "send_object_list") else "from"


def setup_kind(group) -> str | None:
    """A group no process group stands for (colltrace/rank/setup.py): "job" (the job's group
    creations), "local" (a group's members alone), "store" (waits on a key of the job's store)."""
    g = str(group)
    if g == SETUP_GROUP:
        return "job"
    if g.startswith(SETUP_LOCAL):
        return "local"
    if g.startswith(STORE_WAIT):
        return "store"
    return None


def store_key(group, e: Record | None = None) -> str:
    """The key a store wait waits for: its record's, else its group's name."""
    key = (e or {}).get("detail")
    return str(key) if key is not None else str(group)[len(STORE_WAIT):]


def number_phrase(group, seq) -> str:
    """"collective #3 on group 0", "group creation #3 of the job", "group creation #1 among ranks
    0-1", "wait #1 for key 'ready' of the job's store"."""
    kind = setup_kind(group)
    if kind == "job":
        return f"group creation #{seq} of the job"
    if kind == "local":
        return f"group creation #{seq} among ranks {str(group)[len(SETUP_LOCAL):]}"
    if kind == "store":
        return f"wait #{seq} for key {store_key(group)!r} of the job's store"
    return f"collective #{seq} on group {group}"


def call_at(op, seq, group) -> str:
    """"all_reduce #3 on group dp", "new_group #3 (a group creation)", "store.get('ready')"."""
    kind = setup_kind(group)
    if kind == "store":
        return f"{op or 'store wait'}({store_key(group)!r})"
    if kind == "job":
        return f"{op + ' ' if op else ''}#{seq} (a group creation)"
    if kind == "local":
        return f"{op + ' ' if op else ''}#{seq} (a group creation among ranks {str(group)[len(SETUP_LOCAL):]})"
    return f"{op + ' ' if op else ''}#{seq} on group {group}"


def setup_phrase(finding: Finding, e: Record) -> str:
    """"new_group #3 (ranks 0-3)", "init_device_mesh #2 (its new_group of ranks 0-1)", "new_group #1
    among ranks 0-1 alone (ranks 0-1)", "store.get('ready') on the job's store"."""
    op, seq, group = e.get("op") or "?", e.get("seq"), e.get("group")
    kind = setup_kind(group)
    if kind == "store":
        again = f" (its wait #{seq} for it)" if isinstance(seq, int) and seq > 1 else ""
        return f"{op}({store_key(group, e)!r}) on the job's store{again}"
    g: GroupRef | dict[str, Any] = _group(finding, group) or {}
    asked = e.get("members") if isinstance(e.get("members"), list) else g.get("ranks")
    what = rank_word(asked) if asked else ""
    bop = e.get("backend_op")
    if bop and bop != op:
        what = f"its {bop} of {what}" if what else f"its {bop}"
    if e.get("detail") is not None:
        what += (", " if what else "") + str(e["detail"])
    among = f" among {rank_word(g.get('ranks'))} alone" if kind == "local" and g.get("ranks") else ""
    return f"{op} #{seq}{among} ({what})" if what else f"{op} #{seq}{among}"


def op_phrase(finding: Finding, e: Record, full_group: bool = True) -> str:
    """"barrier #5 on group 0 (default_pg, ranks 0-7)" or "recv from rank 3 (#2 between them) on group 0"."""
    if e.get("setup"):
        return setup_phrase(finding, e)
    op = e.get("op") or "?"
    grp = group_phrase(finding, e.get("group")) if full_group else f"group {e.get('group')}"
    if e.get("p2p") and e.get("peer") is not None:
        return f"{op} {direction_word(e)} rank {e['peer']} (#{e.get('seq')} between them) on {grp}"
    return f"{op} #{e.get('seq')} on {grp}"


def seconds(x) -> str:
    try:
        return f"{float(x):.1f} s"
    except (TypeError, ValueError):
        return "? s"


def exit_text(e: Mapping[str, Any], at: str | None = None) -> str:
    """How a rank ended: "died of SIGSEGV", "exited with code 3 at job.py:14 (load_shard), called
    sys.exit", "exited with code 1 (ValueError: bad batch)", "was killed (…)". `at`: where its
    exit call was made (the user's line), said after the code."""
    ex: dict = e["exit"] if isinstance(e.get("exit"), dict) else {}
    if e.get("status") == EXITED or e.get("state") == EXITED:
        how = ex.get("how")
        if how == INTERRUPTED:
            return (f"was interrupted by {ex.get('signal') or 'a signal'}"
                    + (f" ({first_line(str(ex['exception']))})" if ex.get("exception") else "")
                    + (f" at {at}" if at else ""))
        if ex.get("pending"):
            return "ended its program (its exit code was not written yet)"
        code = ex.get("code")
        text = f"exited with code {code}" if code is not None else "exited"
        if ex.get("exception"):
            return text + f" ({first_line(str(ex['exception']))})"
        if how in EXIT_CALLS:
            msg = f": {first_line(str(ex['message']))}" if ex.get("message") else ""
            return text + (f" at {at}" if at else "") + f", called {how}{msg}"
        if how == RAISED:
            return text + (f" (raise SystemExit({code}): colltrace sees the line of sys.exit, exit() and os._exit "
                           "calls only)")
        if how == NATIVE_EXIT:
            return text + " (exit() called in native code: Python's own ending never ran)"
        if how == RETURNED:
            return text + " (its program returned)"
        return text
    if ex.get("signal"):
        return (f"died of {ex['signal']}"
                + (" at interpreter exit, after its program had finished" if ex.get("at_exit") else ""))
    if ex.get("ended_by") == "colltrace":
        return f"ended by colltrace (abort: {ex.get('why')}) at {clock(ex.get('at'))}"
    return "vanished (no exit record: killed by SIGKILL/SIGTERM, or died in native code)"


def clock(t) -> str:
    """A unix time as the local HH:MM:SS a person compares with the job's own log."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(float(t)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _ended_by_colltrace(e: RankPart) -> bool:
    return isinstance(e.get("exit"), dict) and cast(Exit, e["exit"]).get("ended_by") == "colltrace"


def died_since(f: Finding, dead: list[int], still: str = "") -> str:
    """" Ranks 0-2 have died since." — or, for the ranks colltrace itself ended after the
    finding: " colltrace then ended ranks 0-3 (abort: deadlock) at 14:37:17." """
    table = f.ranks
    ended = [r for r in dead if _ended_by_colltrace(table.get(str(r)) or {})]
    backend = [r for r in dead if r not in ended and (table.get(str(r)) or {}).get("ended")]
    others = [r for r in dead if r not in ended and r not in backend]
    text = backend_ended(f, backend)
    if others:
        text += f" {capitalized(rank_word(others))} {verb_for(others, 'has', 'have')} died since{still}."
    if ended:
        ex = cast(Exit, table[str(ended[0])]["exit"])   # a dict: _ended_by_colltrace
        text += f" colltrace then ended {rank_word(ended)} (abort: {ex.get('why')}) at {clock(ex.get('at'))}."
    return text


def backend_ended(f: Finding, ranks: list[int]) -> str:
    """" The backend's timeout then ended the wait (Timed out waiting 8000ms ...): ranks 0-3 exited
    with code 1." — the hang's ending, told as its consequence (NCCL: its watchdog's SIGABRT)."""
    if not ranks:
        return ""
    table = f.ranks
    aborted = [r for r in ranks if (table.get(str(r)) or {}).get("ended") == "abort"]
    text = ""
    timed = [r for r in ranks if r not in aborted]
    if timed:
        error = next((e["error"] for r in timed if (e := table.get(str(r)) or {}).get("error")), None)
        why = f" ({first_line(error)})" if error else ""
        by_exit: dict[str, list[int]] = {}
        for r in timed:
            by_exit.setdefault(_exit_short(table.get(str(r)) or {}), []).append(r)
        how = "; ".join(f"{rank_word(rs)} {how}" for how, rs in by_exit.items())
        text += f" The backend's timeout then ended the wait{why}: {how}."
    if aborted:
        text += (f" NCCL's watchdog then aborted {rank_word(aborted)} (SIGABRT) at the groups' timeout: the hang's "
                 "consequence, not a crash of {0}.".format("its own" if len(aborted) == 1 else "their own"))
    return text


def _exit_short(e: RankPart) -> str:
    ex: Exit = cast(Exit, e["exit"]) if isinstance(e.get("exit"), dict) else {}
    if e.get("status") == EXITED and ex.get("code") is not None:
        return f"exited with code {ex['code']}"
    if ex.get("signal"):
        return f"died of {ex['signal']}"
    return "ended"


def not_taken_note(deadline_s: float) -> str:
    """What a stacks file says when its dump did not finish in time (the ranks were ended)."""
    return (f"(no stack dump within {deadline_s:g} s; the stacks at the hang are in findings.jsonl, "
            "report.txt and the rank's records: colltrace analyze this folder)\n")


def shape_text(shapes) -> str:
    try:
        return ", ".join("x".join(str(d) for d in s) or "scalar" for s in shapes) or "none"
    except TypeError:
        return str(shapes)


def who_phrase(finding: Finding, ranks, group=None) -> str:
    """rank_word, or for most of a large group: "511 ranks (all of group 1 but rank 8)"."""
    rs = sorted_ranks(ranks)
    g = _group(finding, group) if group is not None else None
    if g and len(rs) > 16:
        rest = set(sorted_ranks(g.get("ranks"))) - set(rs)
        if len(rest) <= 8 and set(rs) <= set(sorted_ranks(g.get("ranks"))):
            but = f" but {rank_word(rest)}" if rest else ""
            return f"{len(rs)} ranks (all of group {group}{but})"
    return rank_word(rs)


def sample_entry(finding: Finding, ranks) -> RankPart:
    table = finding.ranks
    none: RankPart = {}
    return next((table[str(r)] for r in sorted_ranks(ranks) if str(r) in table), none)


def behind_clause(finding: Finding) -> str:
    b = finding.behind or []
    return f" Also stuck behind this: {rank_word(b)}." if b else ""


def untraced_clause(finding: Mismatch | Stall) -> str:
    out = ""
    for n in finding.untraced_before or []:
        out += (f" {n.get('count')} untraced collective(s) (run by torch itself, e.g. DDP's C++ all-reduces) ran on "
                f"group {n.get('group')} just before, on {rank_word(n.get('ranks'))}.")
    return out


def first_line(text, limit: int = 160) -> str:
    """An error's first line, without the C++ source location gloo/NCCL put in front."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    line = _CPP_LOCATION.sub("", line)
    return line if len(line) <= limit else line[:limit - 1] + "…"


def natural_key(s: str):
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


def its_word(ranks) -> str:
    return verb_for(ranks, "its", "their")


def it_word(ranks) -> str:
    return verb_for(ranks, "it", "they")
