"""The page's model, built from one Reading: findings as the CLI's paragraphs and stack classes,
ranks as classes with rank ranges, each group's members by how far they got, recent
collectives per class of ranks, and who makes everyone wait.

Plain data, served as JSON at /api/view and rendered by the template and by the page's script.
Its size grows with the number of distinct behaviours in the job, not with its number of ranks:
1,024 ranks waiting in the same collective are one row.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any

from colltrace.model.finding import Finding
from colltrace.model.schema import IN_FLIGHT, UNREADABLE, WAITING
from colltrace.reporters import native, phrases, stacks
from colltrace.reporters import text as report
from colltrace.reporters.locations import located
from colltrace.words import counted, format_ranks, frame_text, short_ranks

MAX_RANK_CLASSES = 40      # rows of the rank view; the rest are counted
MAX_GROUPS = 24            # groups listed; groups beyond that whose members are in step are counted
MAX_TIMELINE_ROWS = 16
TIMELINE_RECORDS = 12      # recent collectives per timeline row
PENDING = (WAITING, IN_FLIGHT)
GONE = ("dead", "exited")
STRAGGLER_ROWS = 8         # ranks in the lag view
STRAGGLER_LAGS = 120       # the latest collectives in it
LAG_CLASSES_MS = (2, 10, 30, 100, 300)   # a lag cell's shade: class b0 (under 2 ms) to b5


def _ranks_text(ranks: list[int]) -> str:
    return short_ranks(ranks) if len(ranks) > 1 else format_ranks(ranks)


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _span(values: list[float]) -> list[float] | None:
    """[min, max] of the values present, rounded for display."""
    vs = [v for v in values if v is not None]
    return [round(min(vs), 3), round(max(vs), 3)] if vs else None


def _int_ranks(table: dict | None) -> list[tuple[int, dict]]:
    out = []
    for key, entry in (table or {}).items():
        try:
            out.append((int(key), entry if isinstance(entry, dict) else {}))
        except (TypeError, ValueError):
            continue
    return sorted(out, key=lambda x: x[0])


# -- findings -----------------------------------------------------------------------------------
def _stack_classes(finding: Finding) -> tuple[list[dict], str | None]:
    """The finding's stack classes, from the reporter's data (the CLI's text is rendered from
    the same rows): [{"ranks", "stack"}], and the "N more classes" note."""
    rows, more = stacks.stack_classes(finding)
    note = f"{more['classes']} more classes ({more['ranks']} ranks)" if more else None
    return [{"ranks": row["ranks_text"], "stack": row["stack"]} for row in rows], note


def finding_view(finding: Finding) -> dict:
    try:
        text = report.paragraph(finding)
        if finding.superseded_by:   # a stall that turned into something certain
            text = report.superseded_line(finding) + " " + text
    except Exception:  # a finding written by another version: its own summary still says it
        text = str(finding.summary or finding.kind or "finding")
    try:
        stacks, more = _stack_classes(finding)
    except Exception:   # a finding written by another version: no stack classes, the rest still shown
        stacks, more = [], None
    # Read from findings.jsonl or the store, a finding of another version may hold anything here.
    group = finding.group if isinstance(finding.group, dict) else {}
    missing = finding.missing_ranks if isinstance(finding.missing_ranks, list) else []
    return {"kind": str(finding.kind or "finding"), "key": str(finding.key or text[:80]),
            "detected_at": _num(finding.detected_at), "group": group.get("name"), "seq": finding.seq,
            "missing_ranks": format_ranks(missing) if all(isinstance(r, int) for r in missing) else "",
            "paragraph": text, "stacks": stacks, "more_stacks": more, "native": _native_frames(finding),
            "look_first": finding.look_first if isinstance(finding.look_first, dict) else None}


def _native_frames(finding: Finding) -> list[dict]:
    """Every native frame of the finding's ranks: [{"rank", "caption", "frames": [line, ...]}]."""
    out = []
    ranks = finding.ranks if isinstance(finding.ranks, dict) else {}
    for rank, e in ranks.items():
        frames = native.valid(e.get("native_frames")) if isinstance(e, dict) else []
        if not frames:
            continue
        exc = native.exception_text(e.get("native_exception"))
        out.append({"rank": str(rank),
                    "caption": f"native frames of rank {rank}, innermost first" + (f"; {exc}" if exc else ""),
                    "frames": [line.strip() for line in native.lines(frames, indent="")]})
    return sorted(out, key=lambda x: int(x["rank"]) if x["rank"].lstrip("-").isdigit() else 0)


# -- ranks ----------------------------------------------------------------------------------------
def rank_state(entry: dict, now: float) -> dict:
    """One rank as the rank view shows it: its process status, its current collective (the
    blocking one it waits in, else the newest one in flight), where, and for how long."""
    status = str(entry.get("status") or "unknown")
    records = [r for r in entry.get("records") or [] if isinstance(r, dict)]
    pending = [r for r in records if r.get("state") in PENDING]
    current = (next((r for r in reversed(pending) if r.get("state") == WAITING), None)
               or (pending[-1] if pending else None))
    heartbeat = _num(entry.get("heartbeat"))
    out: dict[str, Any] = {"status": status, "state": "idle", "op": None, "group": None, "seq": None, "peer": None,
                           "where": None, "waiting_s": None, "heartbeat_age_s": None}
    if status not in GONE and status != UNREADABLE and heartbeat:
        out["heartbeat_age_s"] = max(0.0, now - heartbeat)
    if current is not None:
        out.update(state=current.get("state"), op=current.get("op"), group=current.get("group"),
                   seq=current.get("seq"), peer=current.get("peer") if current.get("p2p") else None,
                   where=located(current.get("frames"), entry.get("roots")))
        entered = _num(current.get("entered_at"))
        if entered is not None and status not in GONE:
            out["waiting_s"] = max(0.0, now - entered)
    elif entry.get("stack"):
        out["where"] = located(entry.get("stack"), entry.get("roots"))   # live stack: where a rank in no collective is
    if status == UNREADABLE:
        out["where"] = str(entry.get("error") or "unreadable")
    # how it ended: "ended by colltrace (abort: deadlock) at 14:37:17", "died of SIGSEGV", ...
    out["ending"] = phrases.exit_text(entry) + native.place(entry) if status in GONE else None
    return out


def rank_view(snap: dict, now: float) -> dict:
    status: dict[str, int] = {}
    state: dict[str, int] = {}
    classes: dict[tuple, dict] = {}
    ranks = _int_ranks(snap.get("ranks"))
    for rank, entry in ranks:
        s = rank_state(entry, now)
        status[s["status"]] = status.get(s["status"], 0) + 1
        state[s["state"]] = state.get(s["state"], 0) + 1
        # Ranks blocked in the same collective form one class; others are classed by what they
        # run and where, whatever their group and number (their ranges are shown instead).
        key: tuple = (s["status"], s["ending"], s["state"], s["op"], s["where"])
        if s["state"] == WAITING:
            key += (s["group"], s["seq"], s["peer"])
        c = classes.get(key)
        if c is None:
            c = classes[key] = {"sample": s, "ranks": [], "groups": set(), "seqs": [], "waiting": [], "heartbeat": []}
        c["ranks"].append(rank)
        if s["group"] is not None:
            c["groups"].add(str(s["group"]))
        if isinstance(s["seq"], int):
            c["seqs"].append(s["seq"])
        c["waiting"].append(s["waiting_s"])
        c["heartbeat"].append(s["heartbeat_age_s"])
    rows = []
    for c in sorted(classes.values(), key=lambda c: c["ranks"][0]):
        s = c["sample"]
        groups = sorted(c["groups"])
        seqs = sorted(set(c["seqs"]))
        rows.append({
            "ranks": _ranks_text(c["ranks"]), "count": len(c["ranks"]), "first": c["ranks"][0],
            "status": s["status"], "ending": s["ending"],
            "alive": {"alive": True, "dead": False, "exited": False}.get(s["status"]),
            "state": s["state"], "op": s["op"],
            "group": groups[0] if len(groups) == 1 else (f"{len(groups)} groups" if groups else None),
            "seq": (str(seqs[0]) if len(seqs) == 1 else f"{seqs[0]}–{seqs[-1]}") if seqs else None,
            "peer": s["peer"], "where": s["where"],
            "waiting_s": _span(c["waiting"]), "heartbeat_age_s": _span(c["heartbeat"]),
        })
    shown = rows[:MAX_RANK_CLASSES]
    hidden = rows[MAX_RANK_CLASSES:]
    summary = (f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''} · processes: "
               + ", ".join(f"{n} {k}" for k, n in sorted(status.items()))
               + " · collectives: " + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(state.items())))
    return {"total": len(ranks), "status": status, "state": state, "summary": summary if ranks else "no rank yet",
            "classes": shown,
            "more": {"classes": len(hidden), "ranks": sum(r["count"] for r in hidden)} if hidden else None}


# -- groups -------------------------------------------------------------------------------------
def group_view(snap: dict) -> dict:
    """Per group, its members classed by the last collective number they entered and completed:
    the laggard is the class behind the others."""
    table = snap.get("ranks") or {}
    rows: list[dict[str, Any]] = []
    for name, g in sorted((snap.get("groups") or {}).items(), key=lambda kv: _natural(str(kv[0]))):
        if not isinstance(g, dict):
            continue
        members = sorted({m for m in g.get("ranks") or [] if isinstance(m, int)})
        classes: dict[tuple, list[int]] = {}
        for m in members:
            e = table.get(str(m))
            key: tuple[int | None, int | None, str | None]
            if not isinstance(e, dict):
                key = (None, None, "no trace")
            else:
                p = (e.get("progress") or {}).get(str(name)) or {}
                status = e.get("status")
                key = (int(p.get("entered") or 0), int(p.get("completed") or 0),
                       status if status in GONE or status == UNREADABLE else None)
            classes.setdefault(key, []).append(m)
        entered = [k[0] for k in classes if k[0] is not None]
        top = max(entered, default=0)
        top_done = max((k[1] for k in classes if k[1] is not None), default=0)
        member_rows = []
        for (ent, done, note), rs in sorted(classes.items(), key=lambda kv: kv[1][0]):
            behind = (top - ent) if ent is not None else None
            member_rows.append({"ranks": _ranks_text(rs), "count": len(rs), "entered": ent, "completed": done,
                                "behind": behind, "note": note, "says": _member_says(note, behind, ent, done)})
        in_step = len(classes) == 1 and not any(k[2] for k in classes)
        rows.append({"name": str(name), "desc": str(g.get("desc") or ""), "size": len(members),
                     "ranks": _ranks_text(members), "entered": top, "completed": top_done,
                     "in_step": in_step, "members": member_rows})
    # Groups with a laggard first (most behind, then largest), then the rest in name order.
    rows.sort(key=lambda r: (True, 0, 0) if r["in_step"] else
              (False, -max((m["behind"] or 0 for m in r["members"]), default=0), -r["size"]))
    shown = [r for r in rows if not r["in_step"]][:MAX_GROUPS]
    room = max(0, MAX_GROUPS - len(shown))
    in_step_rows = [r for r in rows if r["in_step"]]
    shown += in_step_rows[:room]
    return {"rows": shown, "total": len(rows),
            "hidden": {"groups": len(rows) - len(shown),
                       "in_step": len(in_step_rows) - len(in_step_rows[:room])} if len(rows) > len(shown) else None}


def _member_says(note, behind, entered, completed) -> str:
    """A member class's states in words, one place for the page and its script: "dead, waiting in #3"."""
    parts = [note] if note else []
    if behind:
        parts.append(f"behind by {behind}")
    elif entered is not None and completed is not None and entered > completed:
        parts.append(f"waiting in #{entered}")
    return ", ".join(parts)


def _natural(s: str):
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


# -- timeline ---------------------------------------------------------------------------------------
def _event(r: dict, now: float, alive: bool, roots=None) -> dict:
    entered = _num(r.get("entered_at"))
    done = _num(r.get("completed_at"))
    out = {"op": str(r.get("op") or "?"), "group": r.get("group"), "seq": r.get("seq"), "seq_end": r.get("seq_end"),
           "state": str(r.get("state") or "?"), "p2p": bool(r.get("p2p")), "peer": r.get("peer"),
           "count": r.get("count") or 1, "entered_at": entered, "duration_s": None, "waiting_s": None,
           "where": located(r.get("frames"), roots)}
    if entered is not None and done is not None:
        out["duration_s"] = max(0.0, done - entered)
    elif entered is not None and r.get("state") in PENDING and alive:
        out["waiting_s"] = max(0.0, now - entered)
    return out


def timeline_view(snap: dict, now: float) -> dict:
    """The last collectives of each rank, ranks with the same sequence of collectives in one row."""
    rows: dict[tuple, dict] = {}
    for rank, entry in _int_ranks(snap.get("ranks")):
        recs = [r for r in entry.get("records") or [] if isinstance(r, dict)][-TIMELINE_RECORDS:]
        sig = tuple((r.get("op"), r.get("group"), r.get("seq"), r.get("state")) for r in recs)
        row = rows.get(sig)
        if row is None:
            alive = entry.get("status") not in GONE
            rows[sig] = {"ranks": [rank], "events": [_event(r, now, alive, entry.get("roots")) for r in recs]}
        else:
            row["ranks"].append(rank)
    ordered = sorted(rows.values(), key=lambda r: r["ranks"][0])
    out = [{"ranks": _ranks_text(r["ranks"]), "count": len(r["ranks"]), "events": r["events"]}
           for r in ordered[:MAX_TIMELINE_ROWS]]
    hidden = ordered[MAX_TIMELINE_ROWS:]
    return {"rows": out,
            "more": {"rows": len(hidden), "ranks": sum(len(r["ranks"]) for r in hidden)} if hidden else None}


def straggler_view(late) -> dict:
    """Who makes everyone wait (host/latecomers.py's window): the table, and for each rank named
    (or, with nobody named, the ranks most often last) its arrival lag per collective, oldest first."""
    if late is None:
        return {"rows": [], "lags": [], "window_s": None}
    rows = [{"rank": s["rank"], "collectives": s["collectives"], "of": s["of"], "lag_ms": round(1000 * s["lag_s"], 1),
             "waited_s": s["waited_for_s"], "share": round(100 * s["late_share"]),
             "where": frame_text(s["where"][0]) if s.get("where") else None} for s in late.current]
    arrivals = sorted(late.arrivals(), key=lambda a: a.times[0][0])[-STRAGGLER_LAGS:]
    last = Counter(a.last for a in arrivals if a.lag_s > 0)
    shown = [r["rank"] for r in rows] or [r for r, _ in last.most_common(STRAGGLER_ROWS)]
    per = [a.lags() for a in arrivals]   # each collective's lags, computed once for every row
    lags = []
    for r in shown[:STRAGGLER_ROWS]:
        ms = [1000 * lag[r] for lag in per if r in lag]
        lags.append({"rank": r, "cells": [[round(x, 1), sum(x >= b for b in LAG_CLASSES_MS)] for x in ms]})
    return {"rows": rows, "lags": lags, "window_s": late.window_s}


# -- the page -----------------------------------------------------------------------------------------
def build(reading, source, late=None) -> dict:
    snap, now = reading.snap, reading.now
    findings = [finding_view(f) for f in reading.findings]
    current = {f.key for f in reading.findings}
    earlier = [finding_view(f) for f in reading.reported if f.key not in current]
    n = len(findings)
    ranks = rank_view(snap, now)
    if n:
        headline = counted(n, "finding")   # the words `colltrace run` and `analyze` use
    elif reading.mode == "live":
        headline = f"No findings so far ({counted(ranks['total'], 'rank')} watched)"
    else:
        headline = "No findings in this trace"
    return {
        "source": {"kind": source.kind, "label": source.label},
        "mode": reading.mode, "taken_at": now, "generated_at": time.time(), "note": reading.note,
        "verdict": {"problems": n, "headline": headline},
        "findings": findings, "earlier": earlier,
        "ranks": ranks, "groups": group_view(snap), "timeline": timeline_view(snap, now),
        "stragglers": straggler_view(late),
    }
