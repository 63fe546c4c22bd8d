"""What to do about a finding: the advice sentence of each kind, from its facts and the job's
own history (look_first)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, cast

from colltrace.model.finding import Deadlock, DeadRank, DuplicateData, Finding, Mismatch, Stall, UnmatchedP2P
from colltrace.model.parts import LookFirst, MismatchClass, RankPart
from colltrace.model.schema import EXIT_CALLS, EXITED, UNKNOWN, UNREADABLE, Exit
from colltrace.reporters.locations import call_site, classes, exit_location, locations_text, user_location, where
from colltrace.reporters.phrases import (
    PENDING_STATES,
    call_at,
    capitalized,
    exit_text,
    first_line,
    it_word,
    its_word,
    number_phrase,
    op_phrase,
    sample_entry,
    setup_kind,
    store_key,
    verb_for,
)
from colltrace.words import and_list, rank_word


def _history_clause(look: Mapping[str, Any]) -> str:
    """Why this side and not the other, from the job's own history."""
    rs, vs = look.get("ranks") or [], look.get("versus") or []
    why = look.get("reason")
    if why == "left":
        return (f" In earlier iterations {rank_word(rs)} made another call at this point: {it_word(rs)} left "
                f"{its_word(rs)} own pattern, while {rank_word(vs)} "
                f"{verb_for(vs, 'keeps to its own', 'keep to theirs')}.")
    if why == "new":
        return (f" {capitalized(rank_word(rs))} never made this call before, while {rank_word(vs)} "
                f"{verb_for(vs, 'repeats', 'repeat')} {its_word(vs)} usual one.")
    return ""


def _advice_mismatch(f: Mismatch, look: LookFirst) -> str:
    table = f.ranks
    cls = [c for c in f.classes if c.get("ranks")]
    g, seq = f.group.get("name"), f.seq
    if look.get("reason") == "undecided" or look.get("rank") is None:
        sides = [f"{rank_word(c['ranks'])} {verb_for(c['ranks'], 'calls', 'call')} {c.get('op')} at "
                 f"{call_site((table.get(str(sorted(c['ranks'])[0])) or {}).get('frames')) or 'an unknown place'}"
                 for c in cls]
        return (f"Look first at both sides of {number_phrase(g, seq)}: " + "; ".join(sides) +
                ". Neither the job's history nor a majority tells which side left the pattern.")
    odd = set(look.get("ranks") or [])
    mine: MismatchClass | dict[str, Any] = (next((c for c in cls if set(c["ranks"]) == odd), None)
                                            or {"ranks": sorted(odd), "op": "?"})
    rest = [c for c in cls if c is not mine]
    other: MismatchClass | dict[str, Any] = (max(rest, key=lambda c: (len(c["ranks"]), -min(c["ranks"]))) if rest
                                             else {"ranks": [], "op": "?"})
    loc = call_site((table.get(str(look.get("rank"))) or {}).get("frames")) or "the call"
    loc2 = user_location((table.get(str(sorted(other["ranks"])[0])) or {}).get("frames")) if other["ranks"] else None
    who, them = rank_word(mine["ranks"]), rank_word(other["ranks"])
    at = f" (at {loc2})" if loc2 else ""
    if "op" in f.differs:
        what = f"{mine.get('op')} where {them} {verb_for(other['ranks'], 'calls', 'call')} {other.get('op')}{at}"
    else:
        fields = and_list([d.replace("_", " ") for d in f.differs or ["?"]])
        what = f"{mine.get('op')} with different {fields} than {them}{at}"
    return (f"Look first at {loc}: {who} {verb_for(mine['ranks'], 'calls', 'call')} {what}, as {number_phrase(g, seq)}."
            + _history_clause(dict(look, ranks=mine["ranks"], versus=look.get("versus") or other["ranks"])))


_ONE_RANK = ("while the other ranks went on to collectives it never joins: take that decision on every rank "
             "(agree on the condition with an all_reduce) or end the whole job")


def _advice_dead(f: DeadRank, look: LookFirst) -> str:
    rank = f.rank
    e = f.ranks.get(str(rank)) or {}
    how = exit_text(e)
    why = look.get("reason")
    ex: Exit = cast(Exit, e["exit"]) if isinstance(e.get("exit"), dict) else {}
    exc = ex.get("exception")
    at = (exit_location if ex.get("how") in EXIT_CALLS else user_location)(e["stack"]) if e.get("stack") else None
    if ex.get("at_exit") and not f.waiting and not f.failed:
        return (f"Nothing waits for rank {rank}: its program had finished. A signal this late comes from native "
                f"threads still running as Python shuts down (gloo's, when a process group outlives "
                f"destroy_process_group or is never destroyed); its log has the stack.")
    if why == "interrupted":
        return (f"Look first at what sent rank {rank} {ex.get('signal') or 'its signal'} (Ctrl-C, the launcher or "
                f"the scheduler)" + (f": it was at {at}" if at else "") + ".")
    if why == "error" and exc:
        return (f"Look first at rank {rank}'s error, {exc}" + (f", raised at {at}" if at else "")
                + " (its log has the traceback).")
    if why == "exit":
        code = ex.get("code")
        if ex.get("how") in EXIT_CALLS:
            name = str(ex["how"]).removesuffix("()")
            arg = repr(first_line(str(ex["message"]), 60)) if ex.get("message") else code
            there = f"{at}, where rank {rank} called" if at else f"where rank {rank} calls"
            return f"Look first at {there} {name}({arg}) on its own, {_ONE_RANK}."
        return (f"Look first at where rank {rank} raises SystemExit({code}) (colltrace sees sys.exit, exit() and "
                f"os._exit calls, not a raise), on its own, {_ONE_RANK}.")
    if why == "native_exit":
        return (f"Look first at rank {rank}'s log: a native library called exit({ex.get('code')}), ending the process "
                f"without Python's own ending.")
    if why == "returned":
        return (f"Look first at why rank {rank}'s program ended while the others still call collectives: a loop "
                f"or a data size that differs between ranks (uneven inputs), or an early return on one rank.")
    if why == "stack" and e.get("stack"):
        return f"Look first at why rank {rank} {how} at {at}."
    if why == "signal":
        return f"Look first at why rank {rank} {how}: its log (faulthandler prints the Python stack there)."
    if why == "exited" or e.get("state") == EXITED:
        return f"Look first at why rank {rank} {how}: its log."
    return f"Look first at why rank {rank} {how}: its log, and the kernel log (dmesg) for the OOM killer."


def _advice_deadlock(f: Deadlock, look: LookFirst) -> str:
    cycle = f.cycle
    if not cycle:
        return ""
    first = cycle[0]
    waiting, missing = first.get("waiting") or [], first.get("missing") or []
    if len(classes(f, waiting, key=where)) == 1:
        loc = call_site((f.ranks.get(str(look.get("rank"))) or {}).get("frames")) or locations_text(f, waiting)
    else:
        loc = locations_text(f, waiting)
    others = [c for c in cycle[1:] if set(c.get("waiting") or []) & set(missing)]
    if first.get("p2p"):
        peer = first.get("peer")
        text = (f"Look first at {loc}: rank {look.get('rank')}'s {first.get('op')} with rank {peer} is never matched, "
                f"because rank {peer} waits in {others[0]['op'] if others else 'something else'} itself.")
    else:
        instead = (f" (waiting in {call_at(others[0]['op'], others[0].get('seq'), others[0]['group'])} instead)"
                   if others else "")
        if setup_kind(first.get("group")):
            text = (f"Look first at {loc}: {call_at(first.get('op'), first.get('seq'), first.get('group'))} is a call "
                    f"that {rank_word(missing)} never {verb_for(missing, 'makes', 'make')}{instead}.")
        else:
            text = (f"Look first at {loc}: {first.get('op')} on group {first.get('group')} is a collective that "
                    f"{rank_word(missing)} never {verb_for(missing, 'calls', 'call')}{instead}.")
    return text + _history_clause(dict(look, ranks=waiting, versus=missing))


def _thread_deaths(e: RankPart) -> list[dict]:
    return [x for x in e.get("thread_exceptions") or [] if isinstance(x, dict)]


def _thread_death_advice(e: RankPart, who: str, goal: str) -> str:
    """A rank one of whose threads died of an exception: that is the first cause (the main thread
    then waits for what the thread would have done)."""
    x = _thread_deaths(e)[-1]
    at = user_location(x.get("frames")) or "its thread"
    return (f"Look first at {at}: {who}'s thread {x.get('thread') or '?'} died of {x.get('type')} "
            f"({first_line(x.get('message') or '')}), and {who} waits at {where(e)} instead of reaching {goal}.")


def _advice_stall(f: Stall, look: LookFirst) -> str:
    table = f.ranks
    waiting = f.waiting
    sample = sample_entry(f, waiting)
    op, g, seq = sample.get("op") or "collective", f.group.get("name"), f.seq
    why = look.get("reason")
    if why == "backend":
        return (f"Look first at the backend on {rank_word(waiting)} ({op} #{seq} on group {g} at "
                f"{locations_text(f, waiting)}): every member entered it but it never completes; check the NCCL/gloo "
                f"logs, GPU health and the network.")
    if why == "gpu_queue":
        late = look.get("ranks") or waiting
        return (f"Look first at what {rank_word(late)} queued on {verb_for(late, 'its', 'their')} GPU before "
                f"{op} #{seq} on group {g} at {locations_text(f, late)}: a kernel that does not finish (or runs long) "
                f"holds the stream, and the collective behind it never starts.")
    goal = f"{op} #{seq} on group {g}"
    goal = op_phrase(f, sample) if setup_kind(g) else f"{op} #{seq} on group {g}"
    if why == "store_key":
        rs = look.get("ranks") or waiting
        return (f"Look first at {where(table.get(str(look.get('rank'))) or sample)}, where {rank_word(rs)} "
                f"{verb_for(rs, 'waits', 'wait')} for key {store_key(g, sample)!r} of the job's store: which rank was "
                f"to set it, and why it has not (where each other rank is, above).")
    if why in ("left", "new"):
        rs, vs = look.get("ranks") or waiting, look.get("versus") or []
        loc = call_site((table.get(str(look.get("rank"))) or {}).get("frames")) or "the call"
        return (f"Look first at {loc}: {rank_word(rs)} {verb_for(rs, 'enters', 'enter')} {goal} there, and "
                f"{rank_word(vs)} never {verb_for(vs, 'does', 'do')}."
                + _history_clause(dict(look, ranks=rs, versus=vs)))
    rs = look.get("ranks") or []
    e = table.get(str(look.get("rank"))) or {}
    who = rank_word(rs)
    if e.get("state") in (UNREADABLE, UNKNOWN):
        return (f"Look first at {who}: {its_word(rs)} trace could not be read, and {goal} waits for "
                f"{verb_for(rs, 'it', 'them')}.")
    if _thread_deaths(e):
        return _thread_death_advice(e, who, goal)
    if e.get("frames") or e.get("state") in PENDING_STATES:
        return (f"Look first at {where(e)}, where {who} {verb_for(rs, 'is', 'are')}: "
                f"{verb_for(rs, 'it never reaches', 'they never reach')} {goal}.")
    pid = e.get("pid")
    hint = f" (py-spy dump --pid {pid} on its host shows where it is)" if pid else ""
    if e.get("stack_errors"):
        hint = f" (no live stack: {'; '.join(map(str, e['stack_errors']))})"
    return (f"Look first at what {who} {verb_for(rs, 'does', 'do')} after {its_word(rs)} last collective{hint}: "
            f"{verb_for(rs, 'it never reaches', 'they never reach')} {goal}.")


def _advice_p2p(f: Stall | UnmatchedP2P, look: LookFirst) -> str:
    table = f.ranks
    a, c = f.rank, f.peer
    op = f.op or ((table.get(str(a)) or {}).get("op"))
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


def advice(finding: Finding) -> str:
    """The "Look first at ..." sentence, from the finding's look_first facts (a finding of a kind
    this version does not know keeps the advice it came with)."""
    look = finding.look_first
    if look is None:
        return finding.advice
    loader = finding.loader if isinstance(finding, DuplicateData) else None
    if look.get("reason") == "data_split" and loader is not None:
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
    if isinstance(finding, Mismatch):
        return _advice_mismatch(finding, look)
    if isinstance(finding, DeadRank):
        return _advice_dead(finding, look)
    if isinstance(finding, Deadlock):
        return _advice_deadlock(finding, look)
    if isinstance(finding, UnmatchedP2P) or (isinstance(finding, Stall) and finding.p2p):
        return _advice_p2p(finding, look)
    if isinstance(finding, Stall):
        return _advice_stall(finding, look)
    return finding.advice
