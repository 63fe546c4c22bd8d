"""Findings as text a person can act on: one paragraph per finding (the words of each kind here;
its parts from the modules beside this one: phrases, locations, stacks, activity, advice), the
report and the verdict that `colltrace analyze`, report.txt and the watchdog's stderr share.

Everything here reads the finding alone (what findings.jsonl holds of it), so the same text
comes from a live watchdog and from `colltrace analyze` on a copied folder.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from colltrace.analysis.culprits import Explanation
from colltrace.analysis.desync import Desync
from colltrace.model.finding import Deadlock, DeadRank, DuplicateData, Finding, Mismatch, Stall, UnmatchedP2P
from colltrace.model.parts import MismatchClass, RankPart
from colltrace.model.schema import (
    COMPLETED,
    DEAD,
    EXIT_CALLS,
    EXITED,
    FAILED,
    IN_FLIGHT,
    INTERRUPTED,
    LOCAL_SYNC,
    UNKNOWN,
    UNREADABLE,
    WAITING,
)
from colltrace.reporters.activity import activity_clause
from colltrace.reporters.advice import advice
from colltrace.reporters.culprits import culprit_paragraph
from colltrace.reporters.locations import classes, exit_location, locations_text, user_location, where
from colltrace.reporters.native import live_clause, render_native_frames
from colltrace.reporters.native import place as native_place
from colltrace.reporters.phrases import (
    PENDING_STATES,
    behind_clause,
    capitalized,
    clock,
    died_since,
    exit_text,
    first_line,
    group_phrase,
    natural_key,
    number_phrase,
    op_phrase,
    sample_entry,
    seconds,
    setup_kind,
    shape_text,
    untraced_clause,
    verb_for,
    who_phrase,
)
from colltrace.reporters.stacks import render_stack_classes
from colltrace.reporters.stragglers import render_stragglers
from colltrace.reporters.warnings import render_warnings
from colltrace.words import and_list, counted, frame_text_of, group_label, rank_word, sorted_ranks


def _where_instead(finding: Finding, rs: list[int], e: RankPart) -> str:
    """What ranks that did not arrive are doing instead (one clause)."""
    who = rank_word(rs)
    state = e.get("state")
    if state == UNREADABLE:
        return f"{who} could not be read ({e.get('error') or 'unreadable'})"
    if state == UNKNOWN:
        return f"{who} {verb_for(rs, 'has', 'have')} no trace in this snapshot (another host, or not started)"
    if state in (DEAD, EXITED):
        text = f"{who} {exit_text(e)}{native_place(e)}"
        if e.get("op"):
            text += f" in {op_phrase(finding, e, full_group=False)} at {where(e)}"
        return text
    if state in PENDING_STATES:
        text = f"{who} {verb_for(rs, 'is', 'are')} in {op_phrase(finding, e)} at {where(e)}"
        if e.get("waiting_for"):
            text += f", waiting for {rank_word(e['waiting_for'])}"
        return text
    if e.get("frames"):
        text = (f"{who} {verb_for(rs, 'is', 'are')} in no blocking collective: {verb_for(rs, 'its', 'their')} "
                f"live stack is at {where(e)}")
        text += live_clause(e)
        flight = [x for x in e.get("in_flight") or [] if isinstance(x, dict)]
        if flight:
            x = flight[-1]
            text += f" (its {op_phrase(finding, x, full_group=False)} issued at {where(x)} is still in flight)"
        return text
    text = f"{who} {verb_for(rs, 'is', 'are')} in no collective (no live stack available"
    last = e.get("last")
    if isinstance(last, dict) and last.get("op"):
        text += (f"; {verb_for(rs, 'its', 'their')} last collective was {last.get('op')} #{last.get('seq')} on group "
                 f"{last.get('group')} at {where(last)}, {last.get('state')}")
    return text + ")"


def _missing_text(finding: Finding, ranks) -> str:
    cs = classes(finding, ranks)
    parts = [_where_instead(finding, rs, e) for rs, e in cs[:6]]
    if len(cs) > 6:
        parts.append(f"{sum(len(rs) for rs, _ in cs[6:])} more ranks elsewhere")
    return "; ".join(parts)


def _waiters_clause(finding: Finding, ranks, verb_s="waits", verb_p="wait", prep="in") -> str:
    """"ranks 0-6 wait in barrier #5 on group 0 (...) at checkpoint.py:302 (save)"."""
    sample = sample_entry(finding, ranks)
    prep = f" {prep}" if prep else ""
    return (f"{who_phrase(finding, ranks, sample.get('group'))} {verb_for(ranks, verb_s, verb_p)}{prep} "
            f"{op_phrase(finding, sample)} at {locations_text(finding, ranks)}{_run_ahead(sample)}")


def _run_ahead(e: RankPart) -> str:
    """" (queued behind it: broadcast #3 at a.py:16 and all_reduce #4 at a.py:17; they wait for it at
    a.py:18)": where the CPU ran ahead to after an async call (NCCL), and where it parks."""
    out = []
    queued = [q for q in e.get("queued") or [] if isinstance(q, dict)]
    if queued:
        more = int(e.get("queued_count") or len(queued)) - len(queued)
        calls = [f"{q.get('op')} #{q.get('seq')} at {where(q)}" for q in queued]
        if more > 0:
            calls.insert(0, f"{more} more")
        out.append(f"queued behind it: {and_list(calls)}")
    parked = e.get("parked")
    if isinstance(parked, dict) and parked.get("frames"):
        out.append(f"waiting for it at {where(parked)}")
    return f" ({'; '.join(out)})" if out else ""


def _unreadable(finding: Finding) -> str:
    u = finding.unreadable_ranks or []
    return f" Could not read {rank_word(u)}: the analysis did not see {verb_for(u, 'it', 'them')}." if u else ""


def _setup_call_text(c: MismatchClass) -> str:
    """One class of a group creation's mismatch: "new_group of ranks 0-1", "DeviceMesh (its new_group
    of rank 0)"."""
    op, bop = str(c.get("op") or "?"), c.get("backend_op")
    if c.get("members"):
        asked = f"of {rank_word(c['members'])}"
    else:
        asked = "of its members alone" if c.get("detail") == LOCAL_SYNC else "of every rank"
    text = f"{op} {asked}" if not bop or bop == op else f"{op} (its {bop} {asked})"
    if c.get("detail") is not None:
        text += f" ({c['detail']})"
    return text


def _call_text(c: MismatchClass) -> str:
    """One mismatch class: "all_gather_object (allgather) with shape 4x8, bfloat16"."""
    if "members" in c:
        return _setup_call_text(c)
    op = str(c.get("op") or "?")
    backend = c.get("backend_op")
    text = op
    if backend and backend.replace("_", "") != op.replace("_", ""):
        text += f" ({backend})"
    extra = []
    if "shapes" in c:
        extra.append(f"shape {shape_text(c['shapes'])}")
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


_DIFFERS = {"members": "the ranks asked for", "detail": "what they asked for"}


def _mismatch(f: Mismatch) -> str:
    g = f.group.get("name")
    parts = [f"{rank_word(c.get('ranks'))} called {_call_text(c)} at {locations_text(f, c.get('ranks'))}"
             for c in f.classes]
    differs = [_DIFFERS.get(d, d.replace("_", " ")) for d in f.differs or ["?"]]
    where = group_phrase(f, g) if setup_kind(g) is None else None
    text = (f"Mismatch: {f'collective #{f.seq} on {where}' if where else number_phrase(g, f.seq)} is not the same "
            f"call on every rank: " + "; ".join(parts) + f". They differ in {and_list(differs)}.")
    if setup_kind(g) == "job":
        text += (" torch needs every rank of the job to make the same groups in the same order, members or not: it "
                 "names a group by how many were made before it, and ranks that part here wait for each other in "
                 "the next group they make.")
    m = f.missing_ranks
    if m:
        text += f" {capitalized(rank_word(m))} {verb_for(m, 'has', 'have')} not reached it yet."
    return text + untraced_clause(f)


def _deadlock(f: Deadlock) -> str:
    clauses = []
    for item in f.cycle:
        waiting, missing = item.get("waiting") or [], item.get("missing") or []
        if item.get("p2p"):
            clauses.append(_waiters_clause(f, waiting) + f", whose matching op {rank_word(missing)} "
                                                         f"{verb_for(missing, 'has', 'have')} not posted")
        else:
            clauses.append(_waiters_clause(f, waiting) + f" for {rank_word(missing)}, which "
                                                         f"{verb_for(missing, 'has', 'have')} not entered it")
    groups = sorted({str(i.get("group")) for i in f.cycle}, key=natural_key)
    if any(setup_kind(g) for g in groups):   # a group creation or a store wait in the cycle
        named = [f"group {g}" if setup_kind(g) is None else number_phrase(g, next(
            i.get("seq") for i in f.cycle if str(i.get("group")) == g)) for g in groups]
        head = f"Deadlock across {and_list(named)}: "
    else:
        head = (f"Deadlock across groups {and_list(groups)}: " if len(groups) > 1
                else f"Deadlock on group {and_list(groups or ['?'])}: ")
    text = head + ": ".join(clauses) + (f". Nobody in this cycle can proceed (the longest has waited "
                                        f"{seconds(f.waited_s)}).")
    dead = [int(r) for r, e in f.ranks.items() if e.get("state") in (DEAD, EXITED)]
    text += died_since(f, sorted(dead))
    return text + behind_clause(f)


def _stall(f: Stall) -> str:
    table = f.ranks
    g = f.group.get("name")
    stage = f.stage
    waited = seconds(f.waited_s)
    if f.p2p:
        a, c = f.rank, f.peer
        e = table.get(str(a), {})
        text = f"Stall: rank {a} has waited {waited} in {op_phrase(f, e)} at {where(e)}"
        if stage == "completion":
            text += f"; rank {c} posted the matching op, but the transfer does not complete (transport or GPU)."
        else:
            text += f"; whether rank {c} posted the matching op cannot be told: its trace window is too short."
        if c is not None and str(c) in table:
            text += " " + capitalized(_where_instead(f, [int(c)], table[str(c)])) + "."
        return text + behind_clause(f)
    waiting = f.waiting
    if stage == "completion":
        sample = sample_entry(f, waiting)
        done = f.completed_ranks or []
        text = (f"Stall: every member of {group_phrase(f, g)} entered {sample.get('op', 'collective')} #{f.seq}"
                f" at {locations_text(f, waiting)}, but ")
        late = f.not_started or []
        if late:
            text += (f"the GPU of {rank_word(late)} has not reached it after {waited}: work queued ahead of it on "
                     f"{verb_for(late, 'its', 'their')} stream does not finish (a kernel that hangs or runs long), "
                     f"not the collective.")
            return text + untraced_clause(f) + behind_clause(f)
        if done:
            text += (f"only {rank_word(done)} completed it; {who_phrase(f, waiting, g)} "
                     f"{verb_for(waiting, 'has', 'have')} not, after {waited}")
        else:
            text += f"none has completed it after {waited}"
        text += ": the collective itself is hung (a GPU kernel that does not finish, a network or transport fault)."
        return text + untraced_clause(f) + behind_clause(f)
    missing = f.missing_ranks + (f.unknown_ranks or [])
    instead = _missing_text(f, missing)
    if setup_kind(g) == "store":   # any rank may set the key: where each other rank is instead
        text = (f"Stall: {_waiters_clause(f, waiting, f'has waited {waited}', f'have waited {waited}')}"
                f" for a key no rank has set. {capitalized(instead)}.")
    else:
        text = (f"Stall: {_waiters_clause(f, waiting, f'has waited {waited}', f'have waited {waited}')}"
                f" for {rank_word(missing)}, which {verb_for(missing, 'has', 'have')} not entered it. "
                f"{capitalized(instead)}.")
    dead = [r for r in waiting if (table.get(str(r)) or {}).get("state") in (DEAD, EXITED)]
    text += died_since(f, dead, ", still waiting")
    text += activity_clause(f, missing)
    return text + untraced_clause(f) + behind_clause(f)


def _unmatched(f: UnmatchedP2P) -> str:
    table = f.ranks
    a, c = f.rank, f.peer
    e = table.get(str(a), {})
    posted = f.posted
    want = {"send": "recv", "recv": "send"}.get(str(e.get("backend_op") or ""), "matching op")
    count = f" (it posted {posted} to rank {a} so far)" if isinstance(posted, int) else ""
    text = (f"Unmatched p2p: rank {a} has waited {seconds(f.waited_s)} in {op_phrase(f, e)} at {where(e)}, "
            f"but rank {c} has not posted the matching {want}{count}.")
    if c is not None and str(c) in table:
        text += " " + capitalized(_where_instead(f, [int(c)], table[str(c)])) + "."
    text += activity_clause(f, [int(c)]) if c is not None else ""
    return text + behind_clause(f)


def _dead_rank(f: DeadRank) -> str:
    table = f.ranks
    d = f.rank
    e = table.get(str(d), {})
    text = f"Dead rank: rank {d}"
    if e.get("host"):
        text += f" (on {e['host']})"
    called = (e.get("exit") or {}).get("how") in EXIT_CALLS + (INTERRUPTED,) and e.get("stack")
    text += f" {exit_text(e, at=exit_location(e['stack']) if called else None)}"
    in_native = native_place(e)   # where in native code, and the C++ exception behind an abort
    if in_native and e.get("native_other_thread"):   # a library's own thread crashed, not the Python line's
        text += in_native + " on a thread with no Python frames" + (
            f"; its main thread was at {user_location(e['stack'])}" if e.get("stack") else "")
    elif in_native:
        text += in_native + (f", called from {user_location(e['stack'])}" if e.get("stack") else "")
    elif e.get("stack") and not called:
        text += f"; it was at {user_location(e['stack'])} when it {'ended' if e.get('state') == EXITED else 'died'}"
    text += "."
    last = f.last_collective
    if last is not None and last.get("op"):
        state = {WAITING: "it died inside it", IN_FLIGHT: "still in flight", COMPLETED: "completed",
                 FAILED: "it failed"}.get(str(last.get("state")), last.get("state"))
        what = (op_phrase(f, last) if setup_kind(last.get("group")) else
                f"{last.get('op')} #{last.get('seq')} on {group_phrase(f, last.get('group'))}")
        text += f" Its last collective was {what} at {where(last)} ({state})."
    waits = f.waiting
    for w in waits:
        rs = w.get("ranks") or []
        sample = sample_entry(f, rs)
        text += (f" It leaves {who_phrase(f, rs, sample.get('group'))} waiting forever in {op_phrase(f, sample)} at "
                 f"{locations_text(f, rs)} ({seconds(w.get('waited_s'))} so far).")
    also = f.also_missing or []
    if also:
        described = [r for r in sorted_ranks(also) if str(r) in table]
        text += f" {capitalized(rank_word(also))} {verb_for(also, 'has', 'have')} not entered it either"
        text += f": {_missing_text(f, described)}." if described else "."
    for x in f.failed:
        rs = x.get("ranks") or []
        sample = sample_entry(f, rs)
        err = f" ({first_line(x.get('error'))})" if x.get("error") else ""
        text += (f" {capitalized(who_phrase(f, rs, sample.get('group')))} failed in {op_phrase(f, sample)} at "
                 f"{locations_text(f, rs)} because of it{err}.")
    if not waits and not f.failed:
        text += " No rank waits for it yet."
    return text + behind_clause(f)


def _duplicate(f: DuplicateData) -> str:
    if f.source == "batches":
        return _duplicate_batches(f)
    table = f.ranks
    rs = sorted_ranks(table)
    sample = sample_entry(f, rs)
    g = f.group.get("name")
    seqs = f.seqs
    span = f" (#{seqs[0]}-#{seqs[-1]})" if len(seqs) > 1 else ""
    return (f"Identical data: {rank_word(rs)} sent byte-identical {shape_text(sample.get('shapes'))} "
            f"{','.join(sample.get('dtypes') or []) or ''} tensors to {sample.get('op')} on {group_phrase(f, g)} at "
            f"{locations_text(f, rs)} in {f.identical_calls} of the last {f.calls} calls{span}. Ranks that "
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


def _duplicate_batches(f: DuplicateData) -> str:
    """What each rank fed its DDP/FSDP model (colltrace/analysis/batches.py)."""
    rs = sorted_ranks(f.ranks)
    sample = sample_entry(f, rs)
    g = f.group.get("name")
    loader = f.loader
    source = (_loader_clause(loader) if loader is not None and loader.get("line")
              else f"no DataLoader was seen feeding them; the batches reach the model at {where(sample)}")
    return (f"{rank_word(rs)} trained on identical batches in {f.identical_calls} of {f.calls} sampled "
            f"steps: {source}. Their {f.model or 'data-parallel'} model on {group_phrase(f, g)} is called at "
            f"{where(sample)}; ranks that split the data feed it different batches. This is no hang: the job goes "
            f"on, every one of these ranks repeating the same work.")


def summarize(findings: list[Finding]) -> list[Finding]:
    """The findings with their `advice` and `summary` (the paragraph) written: copies, the
    analyzer's own left as they were."""
    out = []
    for f in findings:
        try:
            words = advice(f)
        except Exception as exc:   # never lose a finding over its text
            words = f"(advice unavailable: {type(exc).__name__}: {exc})"
        said = dataclasses.replace(f, advice=words)
        said.summary = paragraph(said)   # the paragraph ends with that advice (kinds this version knows)
        out.append(said)
    return out


_RENDER: dict[type, Callable[[Any], str]] = {Mismatch: _mismatch, Deadlock: _deadlock, Stall: _stall,
                                             UnmatchedP2P: _unmatched, DeadRank: _dead_rank, DuplicateData: _duplicate}


def paragraph(finding: Finding) -> str:
    """The one-paragraph human summary of a finding (also its `summary` field)."""
    render = _RENDER.get(type(finding))
    if render is not None:
        body = render(finding)
    else:   # a kind this version does not know: the summary it came with
        body = finding.summary or f"{finding.kind}: collective #{finding.seq} on group {finding.group.get('name')}."
    text = advice(finding)
    if text:
        body += " " + text
    return body + _unreadable(finding)


def render_same_kind(f: Finding) -> str:
    """The finding's `same_kind` call sites (colltrace/callsites/samekind.py) as an indented list, or ""."""
    sites = f.same_kind
    if not sites:
        return ""
    who = rank_word(f.missing_ranks)
    g = f.group
    lines = [f"\nThe same kind elsewhere: {len(sites)} other call site{'s' if len(sites) != 1 else ''} on "
             f"{group_label(g)} that {who} would not join either, "
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


def render_report(findings: list[Finding]) -> str:
    """Every finding's paragraph and stack classes; "no findings" when there are none."""
    if not findings:
        return "colltrace: no findings"
    number = {f.key: i for i, f in enumerate(findings, 1)}
    gone = sum(1 for f in findings if f.superseded_by)
    n = len(findings) - gone
    out = [f"colltrace: {counted(n, 'finding')}"
           + (f" (and {gone} earlier stall{'s' if gone != 1 else ''} that turned into {'them' if n != 1 else 'it'})"
              if gone else "")]
    for i, f in enumerate(findings, 1):
        if f.superseded_by:
            out.append(f"[{i}] " + superseded_line(f, number.get(f.superseded_by)))
            continue
        block = f"[{i}] " + paragraph(f)
        classes_text = render_stack_classes(f)
        if classes_text:
            block += "\n" + classes_text
        native_text = render_native_frames(f)
        if native_text:
            block += "\n" + native_text
        block += render_same_kind(f)
        out.append(block)
    return "\n\n".join(out)


def superseded_line(f: Finding, by: int | None = None) -> str:
    """An earlier stall that turned into something certain: said in one line, not repeated."""
    ref = f"[{by}] below" if by is not None else str(f.superseded_by)
    return (f"Superseded by {ref}: the stall reported at {clock(f.detected_at)} "
            f"({first_line(f.summary or paragraph(f), 120)})")


def supersedes_line(f: Finding) -> str:
    """The line after a finding that replaces an earlier stall, on the job's stderr."""
    keys = f.supersedes or []
    return (f"colltrace: this {f.kind} is what the stall reported earlier ({', '.join(keys)}) turned into; "
            "that stall finding is superseded")


def headline(f: Finding, limit: int = 400) -> str:
    """A finding's first sentence: what `colltrace run` repeats after the job's own output."""
    text = str(f.summary or paragraph(f))
    m = re.search(r"[.!?](\s|$)", text)
    first = text[:m.start() + 1] if m else text
    return first if len(first) <= limit else first[:limit - 1].rsplit(" ", 1)[0] + " …"   # at a word's end


def render_verdict(findings: list[Finding], explanation: Explanation, warnings: Sequence[Desync] = (),
                   stragglers: Sequence[dict] = ()) -> str:
    """The whole verdict as `colltrace analyze` prints it and report.txt holds it: the culprits
    first; findings that are only work stuck behind them (NCCL queues a whole step behind one
    stuck rank) are counted, not printed (--json lists every one); then any silent desyncs, then
    the ranks that made the others wait (colltrace/analysis/stragglers.py)."""
    paragraph = culprit_paragraph(explanation)
    if not paragraph:
        text = render_report(findings)
    else:
        behind = set(explanation.consequences)
        shown = [f for f in findings if f.key not in behind]
        text = paragraph + "\n\n" + render_report(shown)
        if len(shown) < len(findings):
            text += (f"\n\n{len(findings) - len(shown)} more findings are collectives stuck behind the culprits "
                     f"on the other ranks (every member arrived; the work never completes): see --json.")
    if warnings:
        text += "\n\n" + render_warnings(warnings)
    if stragglers:
        text += "\n\n" + render_stragglers(stragglers)
    return text
