"""The analyzer's view of one snapshot (docs/design.md): validated ranks and groups, and the
lookups every verdict shares.

A malformed rank entry makes that rank unreadable, never the analysis. Everything beyond the
pending records is read lazily, so a 16k-rank snapshot costs about one pass over its records.
"""
from __future__ import annotations

import bisect
import contextlib
import gc
import re
from typing import Any

from colltrace import origins
from colltrace.model import schema
from colltrace.model.schema import COMPLETED, DEAD, EXITED, FAILED, IN_FLIGHT, PENDING, UNREADABLE, WAITING

PENDING_OR_FAILED = PENDING | {FAILED}
# What the backend runs for a p2p op -> what the peer must post to match it.
MATCHING_OP = {"send": "recv", "recv": "send", "batch_p2p": "batch_p2p"}
# A rank killed from outside within this many seconds after another rank ended (or this many
# before) is part of a teardown, not a problem of its own.
TEARDOWN_S = 2.0
TEARDOWN_LEAD_S = 0.5
# Ops whose tensors legitimately differ in shape across ranks (uneven splits).
UNEVEN_OPS = frozenset(("alltoall", "alltoallbase"))   # backend op names without "_"


@contextlib.contextmanager
def without_gc():
    """A pass over a snapshot makes many small objects and no reference cycles: the cyclic
    collector would only walk the (large) snapshot again and again (at 16,384 ranks a view took
    0.3 s with it off and 1.2 s with it on)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Unreadable(Exception):
    """This rank's entry cannot be used; the message says why."""


def to_int(x) -> int:
    if isinstance(x, bool) or x is None:
        raise TypeError(f"not an integer: {x!r}")
    return int(x)


def is_object_op(op: str) -> bool:
    # all_gather_object & co carry pickled bytes: no tensor shapes to compare
    return op.endswith("_object") or op.endswith("_object_list")


def _as(kind: type, x):
    """x read leniently as `kind` (int or float): as it is, or from text or another number holding
    one; None for None, a bool, or anything else."""
    if x is None or isinstance(x, bool):
        return None
    if type(x) is kind:
        return x
    try:
        return kind(x)
    except (TypeError, ValueError):
        return None


def _int_or_none(x) -> int | None:
    return _as(int, x)


def _time_or_none(x) -> float | None:
    return _as(float, x)


def _record(r) -> dict | None:
    """A record as every lookup reads it, checked once: a table whose "group" is a string, "seq"
    (and "seq_end" where given) an integer, "entered_at"/"returned_at" a number or None, "peer" and
    "root" an integer or None, "dtypes" a list or None. What the recorder writes is that already
    (the very dict is kept, shared with the snapshot); a record another tool wrote with numbers as
    text is copied so; one that cannot be read so is None (left out: no lookup could use it)."""
    if type(r) is not dict:
        return None
    g, s, end, peer, root = r.get("group"), r.get("seq"), r.get("seq_end", 0), r.get("peer"), r.get("root")
    t0, t1, dt = r.get("entered_at"), r.get("returned_at"), r.get("dtypes")
    if (type(g) is str and type(s) is int and type(end) is int and (peer is None or type(peer) is int)
            and (root is None or type(root) is int) and (t0 is None or type(t0) is float or type(t0) is int)
            and (t1 is None or type(t1) is float or type(t1) is int) and (dt is None or type(dt) is list)):
        return r
    seq = _int_or_none(s)
    if g is None or seq is None:
        return None
    fixed = dict(r, group=str(g), seq=seq, peer=_int_or_none(peer), root=_int_or_none(root),
                 entered_at=_time_or_none(t0), returned_at=_time_or_none(t1),
                 dtypes=dt if isinstance(dt, list) else None)
    if "seq_end" in r:
        fixed["seq_end"] = _int_or_none(r["seq_end"])
        if fixed["seq_end"] is None:
            return None
    for k in ("peer", "root", "entered_at", "returned_at", "dtypes"):
        if k not in r:
            del fixed[k]
    return fixed


def _untraced(u) -> dict | None:
    """A Flight Recorder entry the rank's trace lists untraced: "group" a string, "seq" an integer."""
    if type(u) is not dict:
        return None
    if type(u.get("group")) is str and type(u.get("seq")) is int:
        return u
    seq = _int_or_none(u.get("seq"))
    return None if u.get("group") is None or seq is None else dict(u, group=str(u["group"]), seq=seq)


def _progress(prog: dict) -> dict[str, tuple[int | None, int]]:
    """{group: (entered, completed)}: entered None where it cannot be read (the records tell then),
    completed 0."""
    out = {}
    for g, p in prog.items():
        if type(p) is dict:
            e, c = p.get("entered"), p.get("completed")
            out[str(g)] = (e if type(e) is int else _int_or_none(e), c if type(c) is int else (_int_or_none(c) or 0))
        else:
            out[str(g)] = (None, 0)
    return out


class Rec:
    """One pending record, validated. `raw` is the snapshot's own dict (shared, not copied)."""

    __slots__ = ("raw", "rank", "id", "group", "seq", "op", "backend_op", "p2p", "peer", "state",
                 "entered_at", "thread", "key", "parked", "parked_at", "queued", "unobserved", "ended")

    def __init__(self, rank: int, raw: dict):
        self.raw = raw
        self.rank = rank
        self.id = raw.get("id")
        self.group = g = raw["group"]
        if type(g) is not str:
            self.group = str(g)
        self.seq = seq = raw["seq"]
        if type(seq) is not int:
            self.seq = to_int(seq)
        op = raw.get("op")
        self.op = op = op if type(op) is str and op else str(op or "unknown")
        bop = raw.get("backend_op")
        self.backend_op = bop = bop if type(bop) is str and bop and bop != "unknown" else op
        peer = raw.get("peer")
        self.peer = peer if peer is None or type(peer) is int else to_int(peer)
        # send_object_list / recv_object_list are recorded as non-p2p ops on the group with the
        # peer as root: they pair with one rank like send/recv, so they are treated as p2p.
        self.p2p = p2p = bool(raw.get("p2p")) or bop == "send" or bop == "recv"
        if p2p and self.peer is None and raw.get("root") is not None:
            self.peer = to_int(raw["root"])
        self.state = raw["state"]
        t = raw["entered_at"]
        self.entered_at = t if type(t) is float else float(t)
        th = raw.get("thread")
        self.thread = th if type(th) is str else str(th or "")
        self.key: Any = None  # the wait graph's Key this record waits in (analysis/waitgraph.py)
        # Since when the rank is parked behind it: a thread waits on it (Work.wait, wait_tensor),
        # or on a later call on its group, which cannot finish first (NCCL runs a group's work in
        # order); None: it may still be running ahead.
        w = raw.get("wait")
        since = w.get("since") if type(w) is dict else None
        self.parked: float | None = (float(since) if isinstance(since, (int, float)) and not isinstance(since, bool)
                                     else None)
        self.parked_at: list | None = w.get("frames") if self.parked is not None and type(w) is dict else None   # where
        if self.parked is None and self.state == IN_FLIGHT and raw.get("returned_at") is None:
            # an async call that has not returned: the rank is inside it (a communicator's lazy
            # set-up waits for every member; gloo connects a group at its first call)
            self.parked = self.entered_at
        self.queued: list[Rec] = []   # later calls on its group, queued behind it
        self.unobserved = raw.get("unobserved") is True   # nothing reports its completion
        self.ended: str | None = None  # the backend ended its wait: "timeout" | "abort"

    @property
    def per_pair_seq(self) -> bool:
        """p2p records numbered per pair (real p2p); object p2p carry the group's number."""
        return bool(self.raw.get("p2p"))


class RankView:
    """One readable rank: its status, its current pending records and lazy lookups."""

    def __init__(self, rank: int, entry, timeouts: dict[str, float] | None = None):
        """timeouts: each group's collective timeout, where the snapshot knows it."""
        if not isinstance(entry, dict):
            raise Unreadable("entry is not a table")
        self.rank = rank
        self.timeouts = timeouts or {}
        self.entry = entry
        self.status = str(entry.get("status") or "unknown")
        self.host = entry.get("host")
        self.pid = entry.get("pid")
        # where this rank's torch, stdlib and packages are: tells its own frames from the rest
        self.origins = origins.for_roots(entry.get("roots"))
        if self.status == UNREADABLE:
            raise Unreadable(str(entry.get("error") or "unreadable"))
        ex = entry.get("exit")
        self.exit = ex if isinstance(ex, dict) else None
        recs = entry.get("records")
        recs = [] if recs is None else recs
        if not isinstance(recs, list):
            raise TypeError("'records' is not a list")
        self._raw_records = recs
        self._records: list[dict] | None = None   # checked when first read (records)
        self._fixed: dict[int, dict] = {}         # id(raw record) -> its checked copy, one per record
        prog = entry.get("progress")
        prog = {} if prog is None else prog
        if not isinstance(prog, dict):
            raise TypeError("'progress' is not a table")
        self._progress = _progress(prog)
        self.stack = _frames(entry.get("stack"))
        untraced = entry.get("untraced")
        self.untraced = [x for x in map(_untraced, untraced) if x is not None] if isinstance(untraced, list) else []
        fault = entry.get("fault")
        if not self.stack and isinstance(fault, dict):
            self.stack = _frames(fault.get("frames"))
        # where it died in native code (or, alive, where its main thread is), innermost first
        self.native = _frames(entry.get("native_frames"))
        exc = entry.get("native_exception")
        self.native_exception = exc if isinstance(exc, dict) else None
        self.native_other_thread = entry.get("native_other_thread") is True
        self.dead = self.status in (DEAD, EXITED)
        # died of its own fatal signal (faulthandler saw it), as opposed to killed from outside
        self.fatal = self.status == DEAD and bool(self.exit and self.exit.get("signal"))
        died = entry.get("died_at")
        self.died_at = float(died) if isinstance(died, (int, float)) and not isinstance(died, bool) else None
        self._entered: dict[str, int] = {}
        self._posted: dict[tuple, int | None] = {}
        self._last_active: float | None = None
        self._complete: bool | None = None
        try:  # the common case, at C speed: every record a dict with a state
            chosen = [r for r in recs if r["state"] != COMPLETED]
        except (KeyError, TypeError):
            chosen = [r for r in recs if type(r) is dict and r.get("state") != COMPLETED]
        chosen = [self._pending_record(r) for r in chosen if r.get("state") in PENDING_OR_FAILED] if chosen else chosen
        self.failed = [r for r in chosen if r["state"] == FAILED]
        # The backend ended its last wait (a timeout; NCCL's watchdog abort): the rank's ending is
        # the hang's consequence, and what it waited in is where the hang is.
        self.ended_by: str | None = None
        self._live = [r for r in chosen if r["state"] != FAILED]
        self.pending: list[Rec] = []
        # failed by the backend's timeout: the snapshot decides whether that ended a hang (the
        # waits stand) or a wait for a rank already gone (failures because of it): JobView._timeouts
        self.timed_out = [r for r in self.failed if timed_out(r.get("error"))]
        self.end_waits([])
        if self.fatal_abort(self.pending):
            self.ended_by = "abort"
            for r in self.pending:
                r.ended = "abort"
        self.classify(teardown=False)

    def _checked(self, raw) -> dict | None:
        """_record(raw), the same object each time it is asked (identity tells a record apart)."""
        r = _record(raw)
        if r is not None and r is not raw:
            r = self._fixed.setdefault(id(raw), r)
        return r

    def _pending_record(self, raw: dict) -> dict:
        r = self._checked(raw)
        if r is None:   # where it waits is the point of the rank's entry: without it, the rank is unreadable
            raise ValueError(f"a {raw.get('state')} record without a group and number: {sorted(raw)}")
        return r

    @property
    def records(self) -> list[dict]:
        """Every record that can be read (view._record), oldest first; checked once, when first
        read: most passes read only the pending ones (a 16,384-rank trace holds a million)."""
        if self._records is None:
            self._records = [r for r in map(self._checked, self._raw_records) if r is not None]
        return self._records

    def classify(self, teardown: bool) -> None:
        """Set what its death means. A rank killed from outside (no fatal signal of its own) as
        part of a teardown (the job killed by the scheduler, torchrun ending the others after a
        failure, COLLTRACE_ON_HANG=abort) keeps its last state: it was waiting when it died, and
        that wait still tells the story; so does a rank the backend ended in a wait (its timeout,
        NCCL's watchdog abort). A rank that crashed, exited, or was killed alone while the job
        lives is a sink (it will never enter anything again) and a cause of its own."""
        killed = self.status == DEAD and not self.fatal
        self.teardown = (killed and teardown) or (self.dead and self.ended_by is not None)
        self.frozen = self.teardown and bool(self.pending)
        self.sink = self.dead and not self.frozen
        self.cause = self.dead and not self.teardown       # worth a dead_rank finding when waited for
        self.alone = (self.fatal and not self.teardown) or (killed and not teardown)  # worth one even if nobody waits

    def end_waits(self, failed: list[dict]) -> None:
        """Of these failed calls, the ones that failed after the rank's last entry become what
        the rank was still waiting in when the backend gave up (its timeout: gloo's "Timed out
        waiting", NCCL's watchdog; or a peer the timeout ended first): they stand as waits, which
        the post-mortem judges as the hang they were, not as failures of their own. Sets pending."""
        out = []
        if failed:
            last = self.last_entered
            out = [r for r in failed if self.failed_at(r) >= last]
        recs = []
        for raw in out:
            rec = Rec(self.rank, raw)
            rec.state = WAITING
            rec.ended = "timeout"
            recs.append(rec)
        if recs:
            self.ended_by = "timeout"
            gone = {id(r) for r in out}
            self.failed = [r for r in self.failed if id(r) not in gone]
        self.pending = self._current_pending([Rec(self.rank, r) for r in self._live], recs)

    @property
    def last_entered(self) -> float:
        return max((_time_or_none(r.get("entered_at")) or 0.0 for r in self.records), default=0.0)

    @staticmethod
    def failed_at(r: dict) -> float:
        return _time_or_none(r.get("failed_at")) or _time_or_none(r.get("returned_at")) or 0.0

    def waits_ended_at(self) -> float | None:
        """When the backend ended this rank's wait (its first failure or its death), if it did."""
        times = [self.ended_at(r) for r in self.pending if r.ended]
        return min(times) if times else None

    def fatal_abort(self, pending: list[Rec]) -> bool:
        """Died of SIGABRT in a wait as long as its group's timeout: NCCL's watchdog ending the
        wait (TORCH_NCCL_ASYNC_ERROR_HANDLING's default), not a crash of its own."""
        if not (self.fatal and (self.exit or {}).get("signal") == "SIGABRT" and pending and self.died_at is not None):
            return False
        timeouts = self.timeouts
        for r in pending:
            t = timeouts.get(r.group)
            if t is not None and self.died_at - r.entered_at >= t - ABORT_SLACK_S:
                return True
        return False

    def ended_at(self, r: Rec) -> float:
        """When the backend ended the wait in r: its failure, else the rank's death."""
        t = _time_or_none(r.raw.get("failed_at")) if r.ended == "timeout" else None
        return t if t is not None else (self.died_at or r.entered_at)

    def _current_pending(self, pend: list[Rec], ended: list[Rec] | None = None) -> list[Rec]:
        out = self._open(pend) + (ended or [])
        return _queue(out) if len(out) > 1 else out

    def _open(self, pend: list[Rec]) -> list[Rec]:
        if not pend:
            return pend
        waiting = [r for r in pend if r.state == WAITING]
        if len(waiting) > 1:
            # a thread is in one blocking call at a time: an older "waiting" one has returned
            latest: dict[str, Rec] = {}
            for r in waiting:
                have = latest.get(r.thread)
                if have is None or (r.entered_at, _id(r)) > (have.entered_at, _id(have)):
                    latest[r.thread] = r
            keep = set(map(id, latest.values()))
            pend = [r for r in pend if r.state != WAITING or id(r) in keep]
        # its group completed this number or a later one: done, whatever the record says
        return [r for r in pend if r.p2p or r.seq > self.completed(r.group)]

    # -- lazy lookups -------------------------------------------------------------------------
    def completed(self, group: str) -> int:
        p = self._progress.get(group)
        return p[1] if p is not None else 0

    def entered(self, group: str) -> int:
        """Highest collective number this rank entered on the group (whole run)."""
        v = self._entered.get(group)
        if v is None:
            p = self._progress.get(group)
            v = p[0] if p is not None and p[0] is not None else self._entered_from_records(group)
            self._entered[group] = v
        return v

    def _entered_from_records(self, group: str) -> int:
        best = 0
        for r in self.records:
            if r["group"] == group and not r.get("p2p"):
                best = max(best, r.get("seq_end", r["seq"]), r["seq"])
        return best

    def groups_mentioned(self) -> set[str]:
        out = set(str(g) for g in self._progress)
        out.update(r.group for r in self.pending)
        return out

    @property
    def last_active(self) -> float:
        """When the rank last entered or returned from a traced call (its own thread's doing)."""
        if self._last_active is None:
            t = 0.0
            for r in self.records:
                t = max(t, r.get("entered_at") or 0.0, r.get("returned_at") or 0.0)
            self._last_active = float(t)
        return self._last_active

    @property
    def window_complete(self) -> bool:
        """Whether the records go back to the rank's first one (ids start at 1)."""
        if self._complete is None:
            self._complete = any(r.get("id") == 1 for r in self.records)
        return self._complete

    def posted(self, op: str, toward: int) -> int | None:
        """Highest per-pair number of `op` this rank posted toward rank `toward`; None when it
        cannot be told (older records are not in the window)."""
        key = (op, toward)
        if key in self._posted:
            return self._posted[key]
        best = None
        for r in self.records:
            if r.get("p2p") and r.get("backend_op") == op and r.get("peer") == toward:
                best = max(best or 0, r["seq"])
        if best is None and self.window_complete:
            best = 0
        self._posted[key] = best
        return best

    def posted_since(self, op: str, toward: int, since: float) -> bool | None:
        """Object p2p (no per-pair number): did this rank post `op` toward `toward` at or after
        `since`? None when its window does not reach back that far."""
        oldest = None
        for r in self.records:
            t = r.get("entered_at")
            if t is None:
                continue
            oldest = t if oldest is None else min(oldest, t)
            if r.get("backend_op") == op and toward in (r.get("peer"), r.get("root")) and t >= since - 1e-6:
                return True
        if self.window_complete or (oldest is not None and oldest <= since):
            return False
        return None

    def record_at(self, group: str, seq: int) -> dict | None:
        """The collective record covering number `seq` on the group, newest first; else what the
        Flight Recorder says the rank entered there untraced; None if neither holds it."""
        for r in reversed(self.records):
            if r["group"] != group or r.get("p2p") or r.get("backend_op") in ("send", "recv"):
                continue
            s = r["seq"]
            end = max(s, r.get("seq_end", s))
            if s <= seq <= end:
                return r
            if end < seq:
                break
        return self.untraced_at(group, seq)

    def untraced_at(self, group: str, seq: int) -> dict | None:
        """A record for a collective the rank entered without colltrace seeing it (DDP's C++
        all-reduce), as its Flight Recorder names it; where it is is its live stack."""
        for u in self.untraced:
            if u["group"] != group or u["seq"] != seq:
                continue
            op = str(u.get("op") or "unknown")
            dtypes = u.get("dtypes")
            return {"id": None, "rank": self.rank, "group": group, "seq": seq, "seq_end": seq, "op": op,
                    "backend_op": str(u.get("backend_op") or op.replace("_", "")), "p2p": False, "peer": None,
                    "state": WAITING, "async": False, "entered_at": _time_or_none(u.get("t")) or 0.0,
                    "returned_at": None, "completed_at": None, "shapes": u.get("shapes") or [],
                    "dtypes": dtypes if isinstance(dtypes, list) else [], "reduce_op": None, "root": None,
                    "count": 1, "thread": "", "frames": self.stack or [], "untraced": True}
        return None

    def record_before(self, group: str, seq: int) -> dict | None:
        """The collective record just before number `seq` on the group."""
        return self.record_at(group, seq - 1) if seq > 1 else None

    def last_record(self) -> dict | None:
        for r in reversed(self.records):
            if r.get("op") != "untraced":
                return r
        return None


def _id(r: Rec):
    return r.id if isinstance(r.id, int) else 0


def _queue(pend: list[Rec]) -> list[Rec]:
    """Per group, the oldest collective not done is the one pending; later ones on the group are
    queued behind it (NCCL runs a group's work in order: after the CPU ran ahead they cannot
    finish first), never pending of their own. A rank parked in a later one (a blocking call, a
    wait) is parked behind the oldest: it cannot pass it. p2p ops keep their own entries."""
    heads: dict[str, Rec] = {}
    for r in pend:
        if not r.p2p:
            h = heads.get(r.group)
            if h is None or (r.seq, r.entered_at) < (h.seq, h.entered_at):
                heads[r.group] = r
    out = []
    for r in pend:
        h = heads.get(r.group) if not r.p2p else None
        if h is None or h is r:
            out.append(r)
            continue
        h.queued.append(r)
        since = r.entered_at if r.state == WAITING else r.parked
        if since is not None and h.state != WAITING and (h.parked is None or since < h.parked):
            h.parked = since
            h.parked_at = r.raw.get("frames") if r.state == WAITING else r.parked_at
    for h in heads.values():
        if len(h.queued) > 1:
            h.queued.sort(key=lambda r: (r.seq, _id(r)))
    out.sort(key=lambda r: (r.entered_at, _id(r)))
    return out


# What the backend says when it gave up waiting: gloo ("Timed out waiting 8000ms", and "Application
# timeout caused pair closure" on the pair's other calls), NCCL ("Watchdog caught collective operation
# timeout", "NCCL communicator was aborted"). A peer gone ("Connection closed by peer") is not one.
_TIMED_OUT = re.compile(r"timed? ?out|timeout|watchdog|communicator was aborted|aborted by", re.IGNORECASE)
ABORT_SLACK_S = 1.0   # NCCL's watchdog polls: it aborts a little after the timeout, never before
CHAIN_SLACK_S = 1.0   # a peer's failure this long before a timed-out rank's (clocks, polls) is still its consequence


def timed_out(error) -> bool:
    """Whether a failed call's reason is the backend's timeout (or the abort that follows it)."""
    return isinstance(error, str) and _TIMED_OUT.search(error) is not None


def _frames(x) -> list | None:
    if not isinstance(x, list):
        return None
    return [f for f in x if isinstance(f, dict)]


class JobView:
    """The whole snapshot as the analyzer reads it (schema.Snapshot is the data): readable ranks
    (RankView), unreadable ones with the reason, groups."""

    def __init__(self, snap: schema.Snapshot):
        snap = snap if isinstance(snap, dict) else {}
        raw_groups = snap.get("groups")
        raw_groups = raw_groups if isinstance(raw_groups, dict) else {}
        self._raw_groups = raw_groups
        timeouts = {str(name): float(g["timeout_s"]) for name, g in raw_groups.items()
                    if isinstance(g, dict) and isinstance(g.get("timeout_s"), (int, float))
                    and not isinstance(g.get("timeout_s"), bool)}
        raw_ranks = snap.get("ranks")
        raw_ranks = raw_ranks if isinstance(raw_ranks, dict) else {}
        self.ranks: dict[int, RankView] = {}
        self.unreadable: dict[int, str] = {}
        for key, entry in raw_ranks.items():
            try:
                rank = to_int(key)
            except (TypeError, ValueError):
                try:
                    rank = to_int(entry.get("rank"))
                except Exception:   # any odd key or entry (another version's snapshot): this entry only
                    continue  # no rank number at all: nothing to attach it to
            try:
                self.ranks[rank] = RankView(rank, entry, timeouts)
            except Unreadable as exc:
                self.unreadable[rank] = str(exc)
            except Exception as exc:  # a malformed field: this rank only
                self.unreadable[rank] = f"malformed entry ({type(exc).__name__}: {exc})"
        self.ranks = dict(sorted(self.ranks.items()))
        self.unreadable = dict(sorted(self.unreadable.items()))
        self._timeouts()
        self._chain_endings()
        self._classify_deaths()
        self.groups: dict[str, dict] = {}
        for name, g in raw_groups.items():
            try:
                members = sorted({to_int(r) for r in g["ranks"]})
                self.groups[str(name)] = {"name": str(g.get("name", name)), "desc": str(g.get("desc") or ""),
                                          "ranks": members}
                if g.get("any_of") is True:   # any member ends its waits: a key of the job's store
                    self.groups[str(name)]["any_of"] = True
            except Exception:   # a malformed group entry, of any shape: this group only
                continue  # members then inferred from the ranks that mention it
        self._arrivals: dict[str, tuple] = {}

    def _timeouts(self) -> None:
        """A call the backend's timeout ended is a wait that stood until then (the post-mortem judges
        the hang it was), unless a member it waited for had already ended: then it failed because of
        that rank (its dead_rank finding lists it)."""
        gone = {}
        for r, v in self.ranks.items():
            if v.dead and not v.timed_out:
                t = _time_or_none((v.exit or {}).get("at")) or v.died_at
                if t is not None:
                    gone[r] = t
        for rank, v in self.ranks.items():
            if not v.timed_out:
                continue
            waits = []
            for raw in v.timed_out:
                peers = ([raw["peer"]] if raw.get("p2p") and raw.get("peer") is not None
                         else self.members_of(raw["group"]))
                t = v.failed_at(raw)
                if not any(p != rank and p in gone and gone[p] <= t for p in peers):
                    waits.append(raw)
            if waits:
                v.end_waits(waits)
                v.classify(teardown=False)

    def _chain_endings(self) -> None:
        """gloo: the first rank to time out leaves, and its peers' calls then fail with "Connection
        closed by peer": consequences of the same timeout, not failures of their own. A rank whose
        calls failed after its last entry, once a member of their group had its wait ended by the
        backend, had its wait ended too."""
        ended = {r: t for r, v in self.ranks.items() if v.ended_by and (t := v.waits_ended_at()) is not None}
        if not ended:
            return
        for rank, v in self.ranks.items():
            if v.ended_by or not v.failed:
                continue
            chained = []
            for raw in v.failed:
                peers = ([raw["peer"]] if raw.get("p2p") and raw.get("peer") is not None
                         else self.members_of(raw["group"]))
                t = v.failed_at(raw)
                if any(p != rank and p in ended and ended[p] <= t + CHAIN_SLACK_S for p in peers):
                    chained.append(raw)
            if chained:
                v.end_waits(chained)
                v.classify(teardown=False)

    def members_of(self, name: str) -> list[int]:
        """A group's members as the snapshot's table gives them (before the groups are checked)."""
        g = self._raw_groups.get(name)
        ranks = g.get("ranks") if isinstance(g, dict) else None
        try:
            return [to_int(r) for r in ranks] if isinstance(ranks, list) else list(self.ranks)
        except (TypeError, ValueError):
            return list(self.ranks)

    def _classify_deaths(self) -> None:
        """A rank killed from outside while another rank ended (up to TEARDOWN_S before it, or
        TEARDOWN_LEAD_S after) is part of a teardown; one killed alone is a problem of its own.
        Deaths are seen by a 10 Hz poll: ranks killed together land within a few tenths."""
        dead = [v for v in self.ranks.values() if v.dead]
        times = sorted(v.died_at for v in dead if v.died_at is not None)
        for v in dead:
            if v.status != DEAD or v.fatal:
                continue
            if (v.exit or {}).get("ended_by") == "colltrace":
                teardown = True   # ended by COLLTRACE_ON_HANG=abort: its wait tells the story
            elif v.died_at is None:
                teardown = len(dead) > 1
            else:
                lo = bisect.bisect_left(times, v.died_at - TEARDOWN_S)
                hi = bisect.bisect_right(times, v.died_at + TEARDOWN_LEAD_S)
                teardown = hi - lo > 1   # someone else ended in the window, itself excluded
            v.classify(teardown)

    def group(self, name: str) -> dict:
        g = self.groups.get(name)
        if g is None:
            members = sorted(r for r, v in self.ranks.items() if name in v.groups_mentioned())
            g = self.groups[name] = {"name": name, "desc": "", "ranks": members, "inferred": True}
        return g

    def members(self, name: str) -> list[int]:
        return self.group(name)["ranks"]

    def any_of(self, name: str) -> bool:
        """Whether any member, not every one, ends a wait in the group (a key of the job's store
        that some rank sets): such a wait is certain of nothing, and closes no cycle."""
        return self.group(name).get("any_of") is True

    def arrivals(self, name: str):
        """Members sorted by how far they entered the group, once per group."""
        a = self._arrivals.get(name)
        if a is None:
            known, unknown = [], []
            ranks = self.ranks
            for m in self.members(name):
                v = ranks.get(m)
                if v is None:
                    unknown.append(m)
                    continue
                p = v._progress.get(name)   # the common case inline: 16k members make a method call per member count
                e = p[0] if p is not None and p[0] is not None else v.entered(name)
                known.append((e, m))
            known.sort()
            a = self._arrivals[name] = (known, [e for e, _ in known], unknown)
        return a

    def missing(self, name: str, seq: int) -> tuple[list[int], list[int]]:
        """(members known not to have entered number `seq`, members that cannot be told)."""
        known, keys, unknown = self.arrivals(name)
        i = bisect.bisect_left(keys, seq)
        return sorted(m for _, m in known[:i]), unknown
