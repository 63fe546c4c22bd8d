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

from colltrace import origins
from colltrace.tracefile import asks, batchlog, endings, ringfile, samples
from colltrace.tracefile.damage import Damage, recorded_findings
from colltrace.tracefile.ringfile import COMPLETE, ENTER, F_ASYNC, F_DIGEST, F_DONE, F_P2P, FAIL, RETURN, UNTRACED
from colltrace.errors import InputError
from colltrace.model import build, schema
from colltrace.model.schema import COMPLETED, IN_FLIGHT

RANK_FILE = re.compile(r"rank-(\d+)\.ring$")
FATAL_SIGNALS = {
    "Segmentation fault": ("SIGSEGV", -11),
    "Aborted": ("SIGABRT", -6),
    "Bus error": ("SIGBUS", -7),
    "Floating point exception": ("SIGFPE", -8),
    "Illegal instruction": ("SIGILL", -4),
}


class TraceError(InputError):
    """A folder or file that cannot be read as a colltrace trace (one clear line)."""


def rank_files(directory: str) -> dict[int, str]:
    if not os.path.isdir(directory):
        raise TraceError(f"{directory}: no such folder")
    out = {}
    for path in glob.glob(os.path.join(directory, "rank-*.ring")):
        m = RANK_FILE.search(path)
        if m:
            out[int(m.group(1))] = path
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
    threads = []
    for m in re.finditer(r"(Current thread|Thread) (0x[0-9a-f]+)[^\n]*\(most recent call first\):\n((?:  File .*\n?)+)", text):
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
    return {"signal": signal, "code": code, "frames": frames, "threads": threads}


class RankTrace:
    """One rank's records, assembled from its ring and definitions files."""

    def __init__(self, directory: str, rank: int, window: int | None = 512):
        self.rank = rank
        self.directory = directory
        base = os.path.join(directory, f"rank-{rank:05d}")
        self.ring = ringfile.RingReader(base + ".ring")
        self.defs = ringfile.DefsReader(base + ".defs.jsonl")
        self.fault_path = base + ".fault.txt"
        self.meta: dict = {}
        self.exit: dict | None = None
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
        self.progress: dict[str, dict] = {}
        self.window = window
        self.error: str | None = None
        self._fault: dict | None = None
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
                self.groups[int(d["id"])] = {"name": str(d["name"]), "desc": d.get("desc", ""),
                                             "ranks": [int(r) for r in d["ranks"]], "backend": d.get("backend", "")}
            elif k == "thread":
                self.threads[int(d["id"])] = str(d.get("name", ""))
            elif k == "meta":
                self.meta = d
                # a restarted rank: forget the previous incarnation
                self.records.clear()
                self.open.clear()
                self.progress.clear()
                self.batches = batchlog.BatchLog()
            elif k == "exit":
                self.exit = d
            elif k == "exception":
                if d.get("fatal") is False:
                    self.thread_exceptions = (self.thread_exceptions + [d])[-4:]
                else:
                    self.exception = d
            elif k == "error":
                self.errors[int(d["rec"])] = d
            elif k == "note":
                self.notes.append(str(d.get("text", "")))
            elif k in batchlog.KINDS:
                self.batches.apply(d)
        except (KeyError, TypeError, ValueError):
            self.defs.bad_lines += 1

    def frames(self, stack_id: int) -> list[dict]:
        cached = self.stacks.get(stack_id)
        if cached is None:
            return []
        if cached and isinstance(cached[0], dict):
            return cached
        out = []
        for cid, line in reversed(cached):   # stored innermost first; contract: innermost last
            c = self.codes.get(cid, {})
            out.append({"file": c.get("file", "?"), "line": line, "func": c.get("func", "?")})
        self.stacks[stack_id] = out
        return out

    # -- slots ----------------------------------------------------------------------------
    def poll(self) -> int:
        """Read what was written since the last call; returns how many slots were new."""
        try:
            if self.ring.reopened():
                self.__init__(os.path.dirname(self.ring.path), self.rank, self.window)
            # The fault report before the ring: a rank seen dead is then never seen short of what
            # it wrote before it died (its last collective returned, say).
            self._read_fault()
            slots = self.ring.poll()        # slots first: every def they use is already written
            for d in self.defs.poll():
                self._apply_def(d)
        except (OSError, ringfile.RingFormatError) as exc:
            self.error = str(exc)
            return 0
        self.samples.poll()
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
                "state": IN_FLIGHT if is_async else "waiting", "async": is_async,
                "entered_at": t, "returned_at": None, "completed_at": None,
                "shapes": [list(x) for x in sig.get("shapes", [])], "dtypes": list(sig.get("dtypes", [])),
                "reduce_op": sig.get("reduce_op"), "root": root if root is not None and root >= 0 else None,
                "count": 1, "thread": self.threads.get(tid, ""), "frames": self.frames(stack_id),
            }
            if flags & F_DIGEST:
                r["digest"] = f"{a32:08x}"
                self.digests = True
            self._add(r)
            self.open[rec_id] = r
            if not p2p:
                self._bump(r["group"], "entered", seq)
        elif kind == UNTRACED:
            group = self._group_name(gid)
            r = {"id": -(self._untraced + 1), "rank": self.rank, "group": group, "seq": seq, "seq_end": seq + aux - 1,
                 "op": "untraced", "backend_op": "untraced", "p2p": False, "peer": None, "state": COMPLETED,
                 "async": False, "entered_at": t, "returned_at": t, "completed_at": t, "shapes": [], "dtypes": [],
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
                if flags & F_DONE:
                    self._complete(r, t)
                else:
                    r["state"] = "in_flight"
            elif kind == COMPLETE:
                self._complete(r, t)
            elif kind == FAIL:
                r["state"] = "failed"
                r["returned_at"] = t
                err = self.errors.get(rec_id)
                if err:
                    r["error"] = f"{err.get('type')}: {err.get('message')}"
                self.open.pop(rec_id, None)

    def _add(self, r: dict) -> None:
        self.records[r["id"]] = r
        if self.window is not None:
            while len(self.records) > self.window:
                self.records.popitem(last=False)

    def _complete(self, r: dict, t: float) -> None:
        r["state"] = "completed"
        r["completed_at"] = t
        self.open.pop(r["id"], None)
        if r["p2p"]:
            return
        self._bump(r["group"], "completed", r["seq_end"])
        # Work on one group completes in order: earlier in-flight ops on it are done too.
        for other in list(self.open.values()):
            if other["group"] == r["group"] and not other["p2p"] and other["seq"] < r["seq"] and other["state"] == IN_FLIGHT:
                other["state"] = "completed"
                other["completed_at"] = other["completed_at"] or t
                self.open.pop(other["id"], None)

    # -- views ----------------------------------------------------------------------------
    def all_records(self) -> list[dict]:
        recs = list(self.records.values())
        seen = {r["id"] for r in recs}
        recs.extend(r for r in self.open.values() if r["id"] not in seen)
        recs.sort(key=lambda r: (r["entered_at"], r["id"]))
        return recs

    def fault(self) -> dict | None:
        """faulthandler's report, as read by the last poll() (before the ring: see poll)."""
        if self._fault is not None and self._fault.get("roots") is None and self.meta.get("roots"):
            # read before the meta record: pick the thread again, with the rank's own roots
            self._fault = dict(parse_fault(self._fault["text"], self.meta["roots"]), text=self._fault["text"],
                               roots=self.meta["roots"])
        if self._fault is None:
            return None
        return {k: v for k, v in self._fault.items() if k not in ("text", "roots")}

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
        fault = self.fault()
        if fault and fault.get("signal"):
            info = {"signal": fault["signal"], "code": fault["code"]}
            if self.exit is not None:
                # after its exit record: the program had finished, the interpreter was shutting
                # down (gloo aborts there when its threads outlive Python); no collective is left
                info["at_exit"] = True
            return "dead", info
        if self.exception is not None:
            # the main thread's uncaught exception: the rank is ending (code 1) even while its
            # interpreter still shuts down, and others waiting for it must hear why now
            return "exited", {"code": 1, "exception": f"{self.exception.get('type')}: {self.exception.get('message')}"}
        if self.exit is not None:
            return "exited", {"code": 0}
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
            digests=self.digests, untraced=asks.untraced_since(self.flight_recorder(), progress),
            fault=self.fault(), exception=self.exception, thread_exceptions=self.thread_exceptions,
            batches=self.batches.entry(self.frames), samples=self.samples.entry(samples_since))


def job_stall_s(snap: dict, default: float | None = None) -> float:
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
    jobs = {}
    for tr in traces:
        job = ringfile.shared_job(tr.meta.get("job"))   # hosts of one job sharing this folder agree on it
        jobs[job] = max(jobs.get(job, 0), tr.meta.get("started", 0))
    if len(jobs) <= 1:
        return traces
    newest = max(jobs, key=jobs.get)
    return [tr for tr in traces if ringfile.shared_job(tr.meta.get("job")) == newest or tr.error]


def load_traces(directory: str, window: int | None = None) -> list[RankTrace]:
    files = rank_files(directory)
    if not files and not os.path.exists(os.path.join(directory, "snapshot.json")):
        raise TraceError(f"{directory}: no colltrace trace files (rank-*.ring) in this folder")
    traces = []
    for rank in files:
        tr = RankTrace(directory, rank, window=window)
        tr.poll()
        traces.append(tr)
    return _newest_job(traces)


def read_saved(directory: str) -> dict | None:
    """snapshot.json, written by a live watchdog or `colltrace dump --from-store`; None if absent.
    Raises TraceError when it cannot be read."""
    path = os.path.join(directory, "snapshot.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            return schema.loads(f.read(), where=path)
    except OSError as exc:
        raise TraceError(f"{path}: not a readable snapshot ({exc})") from None
    except schema.SnapshotError as exc:
        raise TraceError(str(exc)) from None


def load_snapshot(directory: str, damage: list[Damage] | None = None) -> dict:
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
        path = os.path.join(directory, "snapshot.json")
        reason = str(exc).split(": ", 1)[1] if str(exc).startswith(path + ": ") else str(exc)
        damage.append(Damage(path, reason, cost="judged from the rank files alone"))
    traces = load_traces(directory) if files else []
    recorded, bad = recorded_findings(directory)
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
    return build.from_files(entries, groups_of(traces), saved, judged_at=_acted_on_at(directory, recorded))


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
