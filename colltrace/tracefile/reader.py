"""Reads a trace folder into plain data: records per rank and the analyzer's snapshot.

No torch import: this runs on a laptop holding files copied from a cluster. Used
incrementally by the watchdog (RankTrace.poll) and once by `colltrace dump/analyze`.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import re
import time
from typing import Any, cast

from colltrace import origins
from colltrace.errors import InputError
from colltrace.model import build, schema
from colltrace.model.schema import COMPLETED, EXIT_CALLS, FAILED, IN_FLIGHT, WAITING, Snapshot
from colltrace.tracefile import asks, batchlog, endings, layout, native, ringfile, samples
from colltrace.tracefile.damage import Damage, recorded_findings
from colltrace.tracefile.ringfile import (
    COMPLETE,
    ENTER,
    F_ASYNC,
    F_CAPTURED,
    F_DIGEST,
    F_DONE,
    F_P2P,
    F_START,
    F_UNOBSERVED,
    FAIL,
    RETURN,
    STARTED,
    UNTRACED,
    WAIT,
    WAITED,
)
from colltrace.words import group_desc

SETUP_KEPT = 256   # setup records (group creations, lasting store waits) kept past the window
FATAL_SIGNALS = {
    "Segmentation fault": ("SIGSEGV", -11),
    "Aborted": ("SIGABRT", -6),
    "Bus error": ("SIGBUS", -7),
    "Floating point exception": ("SIGFPE", -8),   # faulthandler's words up to Python 3.12
    "Floating-point exception": ("SIGFPE", -8),   # Python 3.13's
    "Illegal instruction": ("SIGILL", -4),
}


class TraceError(InputError):
    """A folder or file that cannot be read as a colltrace trace (one clear line)."""


def rank_files(directory: str) -> dict[int, str]:
    if not os.path.isdir(directory):
        raise TraceError(f"{directory}: no such folder")
    out = {}
    for path in glob.glob(os.path.join(directory, layout.RINGS)):
        rank = layout.ring_rank(path)
        if rank is not None:
            out[rank] = path
    return dict(sorted(out.items()))


def parse_fault(text: str, roots: dict | None = None) -> dict | None:
    """faulthandler's report -> {"signal", "code", "frames"} (innermost last). `roots`: the
    rank's (its meta record), to tell which thread holds the user's frames."""
    if not text.strip():
        return None
    signal = code = None
    for needle, (name, c) in FATAL_SIGNALS.items():
        if f"Fatal Python error: {needle}" in text:
            signal, code = name, c
            break
    # faulthandler lists every thread; the one that took the signal is "Current thread".
    threads: list[dict[str, Any]] = []
    for m in re.finditer(r"(Current thread|Thread) (0x[0-9a-f]+)[^\n]*\(most recent call first\):\n"
                         r"((?:  File .*\n?)+)", text):
        frames = [{"file": f.group(1), "line": int(f.group(2)), "func": f.group(3)}
                  for f in re.finditer(r'File "([^"]+)", line (\d+) in (\S+)', m.group(3))]
        frames.reverse()
        threads.append({"thread": m.group(2), "current": m.group(1) == "Current thread", "frames": frames})
    current = next((t for t in threads if t["current"]), threads[0] if threads else None)
    user_frames = origins.for_roots(roots).user_frames
    if current is not None and not user_frames(current["frames"]):
        # The signal hit a thread with none of the user's frames (gloo's SIGABRT lands wherever;
        # colltrace's own poller): show the thread that has them. faulthandler lists the newest
        # thread first, so the main thread is the last.
        current = next((t for t in reversed(threads) if user_frames(t["frames"])), current)
    frames = current["frames"] if current else []
    return {"signal": signal, "code": code, "frames": frames, "threads": threads,
            "thread": current["thread"] if current else None}


def _failed_with(r: dict, err: dict) -> None:
    """A failed record's reason (docs/findings.md: `reason`; `error` too), from its "error" line."""
    r["error"] = r["reason"] = (f"{err.get('type')}: {err.get('message')}" if err.get("type")
                                else str(err.get("message")))


def ending_of(exit_rec: dict | None, status: dict | None, exception: dict | None) -> tuple[dict | None, list]:
    """How a rank ended, from what it wrote (colltrace/rank/exits.py): its exit record (what Python
    knew at atexit, or as os._exit was called: the exit call with its code and line, or a return),
    the status its process gave exit() after finalization (the code to believe), the exception
    its main thread died of. Returns the snapshot's `exit` (None: no ending written) and the frames
    of the exit call (innermost last; [] where none was seen).

    `how`: sys.exit, exit(), quit(), os._exit (the call, at the line of its frames); exception;
    signal (SIGINT after a KeyboardInterrupt: Python ends itself with it); return (code 0);
    SystemExit (raised without a call colltrace saw: its code from the status); native (exit() in
    native code: Python's own ending never ran). `pending`: the status is not written yet (it
    comes after finalization), and until it is a return cannot be told from `raise SystemExit(n)`."""
    code = status["code"] if status is not None else None
    at = (exit_rec or {}).get("t") or (status or {}).get("t")
    how = exit_rec.get("how") if exit_rec is not None else None
    if exception is not None and how in (None, "exception", "signal"):
        if exception.get("type") == "KeyboardInterrupt":
            return {"signal": "SIGINT", "how": "signal", "exception": "KeyboardInterrupt", "at": at}, []
        return {"code": 1 if code is None else code, "how": "exception", "at": at,
                "exception": f"{exception.get('type')}: {exception.get('message')}"}, []
    if exit_rec is None:
        return ({"code": code, "how": "native", "at": at} if status is not None else None), []
    if how is None:   # a trace written before colltrace told endings apart
        return {"code": 0 if code is None else code, "at": at}, []
    if how == "signal":
        return {"signal": exit_rec.get("signal"), "how": how, "at": at}, []
    noted = exit_rec.get("code")
    if code is not None and code != noted:
        # the program returned and raised SystemExit; or the call noted was caught and it went on
        return {"code": code, "how": "SystemExit" if code else "return", "at": at}, []
    info = {"code": noted, "how": how, "at": at}
    frames: list = []
    if how in EXIT_CALLS:
        frames = [f for f in exit_rec.get("frames") or [] if isinstance(f, dict)]
        if exit_rec.get("message"):
            info["message"] = str(exit_rec["message"])
    elif code is None and exit_rec.get("status_follows"):
        info["pending"] = True
    return info, frames


class RankTrace:
    """One rank's records, assembled from its ring and definitions files."""

    def __init__(self, directory: str, rank: int, window: int | None = 512, until: float | None = None):
        """until: the time colltrace acted on the job (COLLTRACE_ON_HANG=abort); what ended a call
        after it (the failure of a peer's call once colltrace ended a rank) is its own doing, not read."""
        self.rank = rank
        self.directory = directory
        self.until = until
        self.polled_at: float | None = None
        base = layout.rank_base(directory, rank)
        self.ring = ringfile.RingReader(base + ".ring")
        self.defs = ringfile.DefsReader(base + ".defs.jsonl")
        self.fault_path = base + ".fault.txt"
        self.native_path = native.native_path(directory, rank)
        self.native_info: dict = {}   # the rank's {"k": "native"} record: what it keeps of native frames
        self.meta: dict = {}
        self.exit: dict | None = None
        self.exit_status: dict | None = None   # the status the process gave exit(), after finalization
        self.exception: dict | None = None
        self.thread_exceptions: list[dict] = []   # non-main threads that died of an exception
        self.notes: list[str] = []
        self.errors: dict[int, dict] = {}
        self.groups: dict[int, dict] = {}
        self.sigs: dict[int, dict] = {}
        self.codes: dict[int, dict] = {}
        self.stacks: dict[int, list] = {}
        self.threads: dict[int, str] = {}
        self.records: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self.open: dict[int, dict] = {}          # entered, not finished: kept past the window
        self.setup_kept: dict[int, dict] = {}    # setup calls (group creation) out of the window: kept
        self.progress: dict[str, dict] = {}
        self._done_max: dict[str, int] = {}   # per group: the highest number seen completed
        self.window = window
        self.error: str | None = None
        self._fault: dict | None = None
        self._native: tuple | None = None   # (size read, pid, the last crash it says) of rank-N.native.txt
        self._fr: tuple | None = None   # (mtime, the Flight Recorder dump) read from rank-N.fr.json
        self.last_event_t = 0.0   # time of the newest slot read: a live stack older than it is stale
        self.digests = False   # some record carries an input digest (COLLTRACE_DIGEST)
        self.batches = batchlog.BatchLog()   # sampled inputs of data-parallel models
        self.samples = samples.SampleLog(base + ".samples.jsonl")   # its stack while others waited for it
        self._untraced = 0

    # -- definitions ----------------------------------------------------------------------
    def _apply_def(self, d: dict) -> None:
        k = d.get("k")
        try:
            if k == "code":
                self.codes[int(d["id"])] = d
            elif k == "stack":
                self.stacks[int(d["id"])] = d["frames"]
            elif k == "sig":
                self.sigs[int(d["id"])] = d
            elif k == "group":
                self.groups[int(d["id"])] = {"name": str(d["name"]), "desc": group_desc(d.get("desc")),
                                             "ranks": [int(r) for r in d["ranks"]], "backend": d.get("backend", "")}
                if isinstance(d.get("timeout_s"), (int, float)):
                    self.groups[int(d["id"])]["timeout_s"] = float(d["timeout_s"])
                if d.get("any_of") is True:   # a wait any member may end (a key of the job's store)
                    self.groups[int(d["id"])]["any_of"] = True
            elif k == "thread":
                self.threads[int(d["id"])] = str(d.get("name", ""))
            elif k == "meta":
                self.meta = d
                # a restarted rank: forget the previous incarnation
                self.records.clear()
                self.open.clear()
                self.setup_kept.clear()
                self.progress.clear()
                self._done_max.clear()
                self.batches = batchlog.BatchLog()
            elif k == "exit" and self._this_process(d):
                self.exit = d
            elif k == "status" and self._this_process(d):
                self.exit_status = {"code": int(d["code"]), "t": d.get("t")}
            elif k == "exception":
                if d.get("fatal") is False:
                    self.thread_exceptions = (self.thread_exceptions + [d])[-4:]
                else:
                    self.exception = d
            elif k == "error":
                rec = int(d["rec"])
                self.errors[rec] = d
                r = self.records.get(rec)
                if r is not None and r["state"] == FAILED and not r.get("error"):
                    _failed_with(r, d)   # its FAIL slot was read before this line was written
            elif k == "note":
                self.notes.append(str(d.get("text", "")))
            elif k == "native":
                self.native_info = d
            elif k in batchlog.KINDS:
                self.batches.apply(d)
        except (KeyError, TypeError, ValueError):
            self.defs.bad_lines += 1

    def _this_process(self, d: dict) -> bool:
        """A line of this rank's process, not of an earlier one still shutting down as a restarted
        rank took its file over (one written before lines said their pid: yes)."""
        return d.get("pid") is None or self.meta.get("pid") in (None, d["pid"])

    def frames(self, stack_id: int) -> list[dict]:
        cached = self.stacks.get(stack_id)
        if cached is None:
            return []
        if cached and isinstance(cached[0], dict):
            return cached
        out = []
        for cid, line in reversed(cached):   # stored innermost first; contract: innermost last
            c = self.codes.get(cid, {})
            f = {"file": c.get("file", "?"), "line": line, "func": c.get("func", "?")}
            if isinstance(c.get("qualname"), str):   # its code object's traits (origins.code_traits)
                f["qualname"] = c["qualname"]
                if c.get("wraps") is True:
                    f["wraps"] = True
            out.append(f)
        self.stacks[stack_id] = out
        return out

    # -- slots ----------------------------------------------------------------------------
    def poll(self) -> int:
        """Read what was written since the last call; returns how many slots were new."""
        polled_at = time.time()
        try:
            if self.ring.reopened():
                type(self).__init__(self, os.path.dirname(self.ring.path), self.rank, self.window, self.until)
            # The fault report before the ring: a rank seen dead is then never seen short of what
            # it wrote before it died (its last collective returned, say).
            self._read_fault()
            self._read_native()
            slots = self.ring.poll()        # slots first: every def they use is already written
            for d in self.defs.poll():
                self._apply_def(d)
        except (OSError, ringfile.RingFormatError) as exc:
            self.error = str(exc)
            return 0
        self.samples.poll()
        self.polled_at = polled_at   # what was written before this moment has been read
        for s in slots:
            self._apply_slot(s)
        if slots:
            self.last_event_t = max(self.last_event_t, slots[-1][10])
        return len(slots)

    def _group_name(self, gid: int) -> str:
        g = self.groups.get(gid)
        return g["name"] if g else f"?{gid}"

    def _bump(self, group: str, key: str, seq: int) -> None:
        p = self.progress.get(group)
        if p is None:
            p = self.progress[group] = {"entered": 0, "completed": 0}
        if seq > p[key]:
            p[key] = seq

    def _apply_slot(self, s: tuple) -> None:
        kind, flags, _, gid, sig_id, stack_id, tid, a32, seq, aux, t, rec_id, _ = s
        if self.until is not None and t > self.until and kind in (COMPLETE, FAIL, WAITED):
            return
        r: dict | None
        if kind == ENTER:
            sig = self.sigs.get(sig_id, {})
            p2p = bool(flags & F_P2P)
            is_async = bool(flags & F_ASYNC)
            root = sig.get("root", -1)
            peer = sig.get("peer", -1) if p2p else -1
            r = {
                "id": rec_id, "rank": self.rank, "group": self._group_name(gid), "seq": seq, "seq_end": seq,
                "op": sig.get("op", "unknown"), "backend_op": sig.get("backend_op", "unknown"),
                "p2p": p2p, "peer": peer if peer is not None and peer >= 0 else None,
                "state": IN_FLIGHT if is_async else WAITING, "async": is_async,
                "entered_at": t, "returned_at": None, "completed_at": None, "started_at": None,
                "shapes": [list(x) for x in sig.get("shapes", [])], "dtypes": list(sig.get("dtypes", [])),
                "reduce_op": sig.get("reduce_op"), "root": root if root is not None and root >= 0 else None,
                "count": 1, "thread": self.threads.get(tid, ""), "frames": self.frames(stack_id),
            }
            if flags & F_DIGEST:
                r["digest"] = f"{a32:08x}"
                self.digests = True
            if flags & F_START:   # a CUDA start event: started_at stays None until the GPU reaches the call
                r["start_event"] = True
            if sig.get("setup"):   # a call that synchronizes ranks without being a collective (rank/setup.py)
                r["setup"] = True
                if sig.get("members") is not None:
                    r["members"] = list(sig["members"])
                if sig.get("detail") is not None:
                    r["detail"] = sig["detail"]
            self._add(r)
            self.open[rec_id] = r
            if not p2p:
                self._bump(r["group"], "entered", seq)
        elif kind == UNTRACED:
            group = self._group_name(gid)
            r = {"id": -(self._untraced + 1), "rank": self.rank, "group": group, "seq": seq, "seq_end": seq + aux - 1,
                 "op": "untraced", "backend_op": "untraced", "p2p": False, "peer": None, "state": COMPLETED,
                 "async": False, "entered_at": t, "returned_at": t, "completed_at": t, "started_at": None,
                 "shapes": [], "dtypes": [],
                 "reduce_op": None, "root": None, "count": aux, "thread": "", "frames": []}
            self._untraced += 1
            self._add(r)
            self._bump(group, "entered", r["seq_end"])
            self._bump(group, "completed", r["seq_end"])
        else:
            r = self.open.get(rec_id) or self.records.get(rec_id)
            if r is None:
                return  # its ENTER was overwritten in the ring
            if kind == RETURN:
                r["returned_at"] = t
                if not r["p2p"]:
                    r["seq_end"] = max(aux, r["seq"])
                    self._bump(r["group"], "entered", r["seq_end"])
                if flags & F_CAPTURED:
                    # captured into a CUDA graph: nothing ran; it runs at replays, unseen. Not a
                    # completion of the group's earlier work either.
                    r["captured"] = True
                    r["state"], r["completed_at"] = COMPLETED, t
                    self.open.pop(rec_id, None)
                    if not r["p2p"]:
                        self._ended(r)
                elif flags & F_DONE:
                    self._complete(r, t)
                elif r["state"] != FAILED:
                    r["state"] = IN_FLIGHT
                    if flags & F_UNOBSERVED:
                        r["unobserved"] = True
            elif kind == STARTED:
                if r["started_at"] is None:
                    r["started_at"] = t
            elif kind == COMPLETE:
                if r["state"] != FAILED:
                    self._complete(r, t)
            elif kind == FAIL:
                r["state"] = FAILED
                if r["returned_at"] is None:
                    r["returned_at"] = t
                r["failed_at"] = t   # a wait it failed in stays: where the program waited for it
                self.open.pop(rec_id, None)
                if not r["p2p"]:
                    self._ended(r, completed=False)
                err = self.errors.get(rec_id)
                if err:
                    _failed_with(r, err)
                self.open.pop(rec_id, None)
            elif kind == WAIT:
                if r["state"] not in (COMPLETED, FAILED):
                    # the line the program waits for this call at (Work.wait, wait_tensor)
                    r["wait"] = {"since": t, "frames": self.frames(stack_id), "thread": self.threads.get(tid, "")}
            elif kind == WAITED and r["state"] != FAILED:
                r.pop("wait", None)

    def _ended(self, r: dict, completed: bool = True) -> None:
        """A collective of the group finished (completed, or failed: never counted done). The
        group's "completed" is the highest number below which every traced one has ended: a
        later op completing first (gloo runs a group's works on several threads) never makes
        an older one that still waits look done."""
        group = r["group"]
        done = self._done_max.get(group, 0)
        if completed and r["seq_end"] > done:
            done = self._done_max[group] = r["seq_end"]
        for other in self.open.values():
            if other["group"] == group and not other["p2p"] and other["seq"] <= done and other is not r:
                done = other["seq"] - 1
        self._bump(group, "completed", done)

    def _add(self, r: dict) -> None:
        self.records[r["id"]] = r
        if self.window is not None:
            while len(self.records) > self.window:
                _, old = self.records.popitem(last=False)
                if old.get("setup"):   # few, and what later group creations are compared with
                    self.setup_kept[old["id"]] = old
                    if len(self.setup_kept) > SETUP_KEPT:
                        self.setup_kept.pop(next(iter(self.setup_kept)))

    def _complete(self, r: dict, t: float) -> None:
        r["state"] = COMPLETED
        r["completed_at"] = t
        if r.get("start_event") and r["started_at"] is None:
            r["started_at"] = t   # finished before the poller saw it start: it started by then
        self.open.pop(r["id"], None)
        if r["p2p"]:
            return
        self._ended(r)
        r.pop("wait", None)
        # An earlier op on the group whose completion nothing reports (a functional collective
        # never waited on): a later one completing means the group moved past it. Ops with a Work
        # or an event of their own are told by it alone: gloo runs a group's works on several
        # threads, and a failed or timed-out one must never read "completed".
        for other in list(self.open.values()):
            if (other.get("unobserved") and other["group"] == r["group"] and not other["p2p"]
                    and other["seq"] < r["seq"] and other["state"] == IN_FLIGHT):
                other["state"] = COMPLETED
                other["completed_at"] = other["completed_at"] or t
                if other.get("start_event") and other["started_at"] is None:
                    other["started_at"] = other["completed_at"]
                self.open.pop(other["id"], None)

    # -- views ----------------------------------------------------------------------------
    def all_records(self) -> list[dict]:
        recs = list(self.records.values())
        seen = {r["id"] for r in recs}
        recs.extend(r for r in self.open.values() if r["id"] not in seen)
        recs.extend(r for r in self.setup_kept.values() if r["id"] not in seen and r["id"] not in self.open)
        recs.sort(key=lambda r: (r["entered_at"], r["id"]))
        return recs

    def fault(self) -> dict | None:
        """faulthandler's report, as read by the last poll() (before the ring: see poll), with the
        native frames colltrace's own handler kept (`native_frames`, innermost first, and
        `native_exception`: the uncaught C++ exception behind an abort). A fatal signal the
        program's own handler survived is no fault; one it may still survive is `native_pending`."""
        if self._fault is not None and self._fault.get("roots") is None and self.meta.get("roots"):
            # read before the meta record: pick the thread again, with the rank's own roots
            # (the text parsed before: blank text is never kept, so parse_fault gives a dict)
            self._fault = dict(cast(dict, parse_fault(self._fault["text"], self.meta["roots"])),
                               text=self._fault["text"], roots=self.meta["roots"])
        fault = None if self._fault is None else {k: v for k, v in self._fault.items() if k not in ("text", "roots")}
        crash = self._native_crash()
        if crash is None:
            return fault
        if crash["signal"] is None:   # std::terminate wrote the exception; no handler of ours saw the abort
            if fault is not None and crash["native_exception"]:
                fault["native_exception"] = crash["native_exception"]
            return fault
        if self._survived(crash):
            return None   # the program's own handler let it go on: not where it is, nor how it ended
        # still being written (colltrace's handler, then faulthandler's down the chain): the rank
        # is told dead once its process is gone, with all of it, not at the first line
        writing = not crash["complete"]
        if crash.get("earlier_survived") or fault is None or not fault.get("signal"):
            # faulthandler's text (if any) is about a fault the rank lived through
            writing = writing or bool(self.native_info.get("faulthandler"))   # colltrace's: its text comes next
            fault = {"signal": crash["signal"], "code": crash["code"], "frames": [], "threads": []}
        fault["native_frames"] = crash["native_frames"]
        shown = fault.get("thread")
        if shown and crash.get("thread") and int(shown, 16) != crash["thread"]:
            # the thread that crashed has no frames of the user's (a library's own thread): the
            # Python frames shown are another thread's, not the caller of these native frames
            fault["native_other_thread"] = True
        if crash["native_exception"]:
            fault["native_exception"] = crash["native_exception"]
        if crash["returned"] is None and (writing or crash["signal"] in (self.native_info.get("own_handlers") or ())):
            fault["native_pending"] = True   # the program's handler runs: dead once its process is gone
        return fault

    def _survived(self, crash: dict) -> bool:
        """The program's own handler let the rank go on after this fatal signal: it said so, or
        the rank wrote its exit or its exception after it (siglongjmp out of the handler)."""
        if crash["returned"] is not None:
            return True
        t = crash.get("t") or 0.0
        later = [d.get("t") for d in (self.exit, self.exception) if d]
        return bool(t) and any(isinstance(x, (int, float)) and x > t for x in later)

    def _read_native(self) -> None:
        try:
            size = os.path.getsize(self.native_path)
        except OSError:
            return
        if self._native is not None and self._native[0] == size and self._native[1] == self.meta.get("pid"):
            return
        try:
            with open(self.native_path, errors="replace") as f:
                text = f.read()
        except OSError:
            return
        pid = self.meta.get("pid")
        blocks = [b for b in native.parse(text) if b["what"] == "crash" and (pid is None or b["pid"] == pid)]
        crash = native.crash(text, pid)
        if crash is not None:
            crash["earlier_survived"] = any(b["returned"] is not None for b in blocks[:-1])
        self._native = (size, pid, crash)

    def _native_crash(self) -> dict | None:
        if self._native is not None and self._native[1] != self.meta.get("pid"):
            self._read_native()   # read before the meta record: the rank's own process only
        return self._native[2] if self._native is not None else None

    def _read_fault(self) -> None:
        if self._fault is not None and self._fault.get("signal"):
            return   # a fatal signal's report is final
        try:
            with open(self.fault_path, errors="replace") as f:
                text = f.read()
            roots = self.meta.get("roots")
            parsed = parse_fault(text, roots)
            self._fault = dict(parsed, text=text, roots=roots) if parsed else None
        except FileNotFoundError:
            pass

    def flight_recorder(self) -> dict | None:
        """The rank's last Flight Recorder dump, if it is newer than anything in its trace (an
        older one describes a past the trace has moved beyond)."""
        path = asks.fr_dump_path(os.path.dirname(self.ring.path), self.rank)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return None
        if self._fr is None or self._fr[0] != mtime:
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                data = None
            self._fr = (mtime, data if isinstance(data, dict) else None)
        data = self._fr[1]
        if data is None or not isinstance(data.get("t"), (int, float)) or data["t"] < self.last_event_t:
            return None
        return data

    def status(self) -> tuple[str, dict | None]:
        """What the files alone say about how this rank ended."""
        info: dict | None
        fault = self.fault()
        if fault and fault.get("signal"):
            info = {"signal": fault["signal"], "code": fault["code"]}
            if self.exit is not None:
                # after its exit record: the program had finished, the interpreter was shutting
                # down (gloo aborts there when its threads outlive Python); no collective is left
                info["at_exit"] = True
            return "dead", info
        info, _ = ending_of(self.exit, self.exit_status, self.exception)
        if info is not None:
            return "exited", info
        ended = endings.cached(self.directory).get(self.rank)
        if ended is not None and ended["pid"] in (None, self.meta.get("pid")):
            return "dead", endings.exit_info(ended)   # colltrace ended it (COLLTRACE_ON_HANG=abort)
        return "unknown", None

    def damage(self) -> list[Damage]:
        """What of this rank's files could not be read, and what that costs (post-mortem: a
        folder copied from a cluster may arrive cut short)."""
        out = []
        ring, defs, r = self.ring, self.defs, self.rank
        if self.error:
            reason = self.error.split(": ", 1)[1] if self.error.startswith(ring.path + ": ") else self.error
            out.append(Damage(ring.path, reason, r, f"rank {r} is judged unreadable"))
        elif ring.cut:
            have, want = ring.cut
            reason = f"cut short ({have} of {want} bytes): {ring.readable} of its {ring.slots} slots are there"
            if ring.newest_lost:
                out.append(Damage(ring.path, reason, r, f"its newest records may be past the cut ({ring.cut_lost} "
                                                        f"slots lost): rank {r} is judged unreadable"))
            else:
                out.append(Damage(ring.path, reason, r, "every slot it had written is read"))
        if defs._partial.strip():
            out.append(Damage(defs.path, f"its last line is cut short ({len(defs._partial)} bytes, no line end)", r,
                              self._defs_cost()))
        if defs.bad_lines:
            n = defs.bad_lines
            out.append(Damage(defs.path, f"{n} line{'s are' if n != 1 else ' is'} not readable definitions", r,
                              self._defs_cost()))
        return out

    def _defs_cost(self) -> str:
        return (f"records name what it no longer defines: rank {self.rank} is judged unreadable" if self.defs_lost()
                else "every record read is whole")

    def defs_lost(self) -> bool:
        """Whether a record names a definition its definitions file lost (a group, a signature)."""
        if not (self.defs._partial.strip() or self.defs.bad_lines):
            return False
        return any(r["group"].startswith("?") or r["op"] == "unknown" for r in self.all_records())

    def snapshot_entry(self, samples_since: float | None = None) -> dict:
        """samples_since: the stack samples taken from then on (the live exchange sends the newest
        few seconds each round); None: every sample kept."""
        # A rank whose tracing stepped aside (its folder filled up) runs on unseen: judged as
        # unreadable, never as dead or stuck at its last record. `dump` still shows its records.
        # So is one whose ring was cut short past where it last wrote: where it is, is lost.
        error = self.error or (self.ring.stopped and "tracing stopped on this rank (its trace folder is full)") or (
            self.ring.cut and self.ring.newest_lost and "its ring file is cut short: its newest records are lost")
        if error:
            return build.unreadable_entry(self.rank, error)
        status, exit_info = self.status()
        progress = {g: dict(p) for g, p in self.progress.items()}
        return build.rank_entry(
            self.rank, self.meta, status, exit_info, heartbeat=self.ring.heartbeat, progress=progress,
            records=self.all_records(), lost_slots=self.ring.lost, roots_ok=origins.valid_roots(self.meta.get("roots")),
            digests=self.digests, untraced=asks.untraced_since(self.flight_recorder(), progress, before=self.polled_at),
            fault=self.fault(), exception=self.exception, thread_exceptions=self.thread_exceptions,
            exit_frames=ending_of(self.exit, self.exit_status, self.exception)[1],
            batches=self.batches.entry(self.frames), samples=self.samples.entry(samples_since))


def job_stall_s(snap: Snapshot, default: float | None = None) -> float:
    """The job's own COLLTRACE_STALL_S (model/build.py), else `default`, else this environment's."""
    v = build.job_stall_s(snap)
    if v is not None:
        return v
    if default is not None:
        return default
    from colltrace import config

    return config.load().stall_s


def groups_of(traces) -> dict[str, dict]:
    return build.groups_of(tr.groups for tr in traces)


def _newest_job(traces: list[RankTrace]) -> list[RankTrace]:
    """A folder reused across runs may hold ranks of an older job: keep the newest job's."""
    jobs: dict[str, Any] = {}   # job -> its ranks' latest start time
    for tr in traces:
        job = ringfile.shared_job(tr.meta.get("job"))   # hosts of one job sharing this folder agree on it
        jobs[job] = max(jobs.get(job, 0), tr.meta.get("started", 0))
    if len(jobs) <= 1:
        return traces
    newest = max(jobs, key=jobs.__getitem__)
    return [tr for tr in traces if ringfile.shared_job(tr.meta.get("job")) == newest or tr.error]


def load_traces(directory: str, window: int | None = None, until: float | None = None) -> list[RankTrace]:
    files = rank_files(directory)
    if not files and not os.path.exists(os.path.join(directory, layout.SNAPSHOT)):
        raise TraceError(f"{directory}: no colltrace trace files ({layout.RINGS}) in this folder")
    traces = []
    for rank in files:
        tr = RankTrace(directory, rank, window=window, until=until)
        tr.poll()
        traces.append(tr)
    return _newest_job(traces)


def read_saved(directory: str) -> Snapshot | None:
    """snapshot.json, written by a live watchdog or `colltrace dump --from-store`; None if absent.
    Raises TraceError when it cannot be read."""
    path = os.path.join(directory, layout.SNAPSHOT)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            return schema.loads(f.read(), where=path)
    except OSError as exc:
        raise TraceError(f"{path}: not a readable snapshot ({exc})") from None
    except schema.SnapshotError as exc:
        raise TraceError(str(exc)) from None


def load_snapshot(directory: str, damage: list[Damage] | None = None) -> Snapshot:
    """The analyzer's input, from the files alone. A snapshot.json written by a live
    watchdog or `colltrace dump --from-store` supplies what files cannot (liveness, live stacks).
    damage: a list to add each damaged file to, with its reason; given, the folder is judged from
    what is readable (a snapshot.json cut short beside readable rings is one damaged file), and
    TraceError is raised only when nothing is. Not given: a damaged snapshot.json is a TraceError,
    as before."""
    files = rank_files(directory)
    try:
        saved = read_saved(directory)
    except TraceError as exc:
        if damage is None or not files:
            raise
        saved = None
        path = os.path.join(directory, layout.SNAPSHOT)
        reason = str(exc).split(": ", 1)[1] if str(exc).startswith(path + ": ") else str(exc)
        damage.append(Damage(path, reason, cost="judged from the rank files alone"))
    recorded, bad = recorded_findings(directory)
    judged_at = _acted_on_at(directory, recorded)
    traces = load_traces(directory, until=judged_at) if files else []
    if damage is not None:
        for tr in traces:
            damage.extend(tr.damage())
        damage.extend(bad)
        if traces and all(tr.error for tr in traces) and saved is None:
            raise nothing_readable(directory, damage)
    entries = {str(tr.rank): tr.snapshot_entry() for tr in traces}
    for tr in traces:   # post-mortem only: live, a line being written is not yet a lost one
        if tr.defs_lost():
            entries[str(tr.rank)] = build.unreadable_entry(tr.rank, "its definitions file is cut short: its records "
                                                                    "name what it lost")
    # build.from_files takes and returns the snapshot as a plain dict
    return cast(Snapshot, build.from_files(entries, groups_of(traces), cast("dict | None", saved),
                                           judged_at=judged_at))


def nothing_readable(directory: str, damage: list[Damage]) -> TraceError:
    """The one line for a folder none of whose files could be read (each reason on a warning line)."""
    if not damage:
        return TraceError(f"{directory}: nothing readable")
    names = [os.path.basename(d.file) for d in damage]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    first = next((d for d in damage if d.rank is not None), damage[0])
    return TraceError(f"{directory}: nothing readable, every file is damaged ({shown}); "
                      f"{os.path.basename(first.file)}: {first.reason}")


def _acted_on_at(directory: str, recorded: list[dict]) -> float | None:
    """When the finding colltrace ended the job for was made (COLLTRACE_ON_HANG=abort), from the
    folder's ended-*.json and findings.jsonl: what followed it is colltrace's doing, so the folder is
    judged as of then, and says what the live watchdog said (the same waits, to the tenth of a
    second). None when colltrace ended no rank or the finding is not recorded."""
    keys = {e.get("finding") for e in endings.read(directory).values()} - {None}
    times = [float(f["detected_at"]) for f in recorded
             if f.get("key") in keys and isinstance(f.get("detected_at"), (int, float))]
    return min(times) if times else None
