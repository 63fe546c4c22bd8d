"""The one builder of snapshots: a rank's entry from its trace, a host's view of it (liveness,
live stacks), host summaries merged, entries compacted for the store, a saved snapshot laid over
the files. Every snapshot the analyzer, the watchdog, the CLI and the dashboard see is made here.

Plain data in and out, no I/O, no torch. A host summary is {"host", "t", "groups", "ranks":
{rank: entry}}; the snapshot format is in docs/design.md, its words in model/schema.py.
"""
from __future__ import annotations

from colltrace import origins
from colltrace.model import arrivals
from colltrace.model.schema import ALIVE, DEAD, ENDED, PENDING, UNKNOWN, UNREADABLE, WAITING, Snapshot, empty, is_clock

SUSPECT_AFTER_S = 0.5   # others have waited this long: fetch the missing rank's live stack
RECENT_COMPLETED = 4    # completed records per rank sent through the store (pending ones always)
RECENT_SETUP = 8        # ... and completed group creations (rank/setup.py), which later ones are compared with
FRAMES_NEAR_USER = 12   # frames kept around the innermost user frame when compacting


NO_TRACE_NOTE = "gone without a trace: killed (SIGKILL/SIGTERM) or exited in native code"
# native frames too: the watchdog named them on the rank's own host, where its libraries are
SAVED_LIVE_KEYS = ("status", "exit", "died_at", "stack", "stack_at", "pid", "host", "native_frames", "native_exception")


def unreadable_entry(rank: int, error: str) -> dict:
    """A rank whose trace cannot be read: judged unreadable, never dead or stuck at its last record."""
    return {"rank": rank, "status": UNREADABLE, "error": error, "records": [], "progress": {},
            "pid": None, "host": None, "exit": None, "died_at": None, "heartbeat": None,
            "stack": None, "stack_at": None, "fault": None}


def rank_entry(rank: int, meta: dict, status: str, exit_info, *, heartbeat, progress: dict, records: list,
               lost_slots: int = 0, roots_ok: bool = False, digests: bool = False, untraced=None,
               fault=None, exception=None, thread_exceptions=None, batches=None, samples=None,
               exit_frames=None) -> dict:
    """One rank's entry from what its files say (tracefile/reader.py reads them)."""
    entry = {
        "rank": rank, "pid": meta.get("pid"), "host": meta.get("host"), "job": meta.get("job"),
        "status": status, "exit": exit_info, "died_at": None,
        "heartbeat": heartbeat or None, "error": None,
        "progress": {g: dict(p) for g, p in progress.items()},
        "records": records, "stack": None, "stack_at": None,
        "fault": None, "lost_slots": lost_slots, "stall_s": meta.get("stall_s"),
    }
    if roots_ok:
        entry["roots"] = meta["roots"]   # where its torch, stdlib and packages are
    if digests:
        entry["digests"] = True
    if untraced:
        # Entered without colltrace seeing it (DDP's C++ all-reduces): the Flight Recorder says
        # what, and the rank has entered those numbers, whatever the trace alone says.
        entry["untraced"] = untraced
        for u in untraced:
            p = entry["progress"].setdefault(u["group"], {"entered": 0, "completed": 0})
            p["entered"] = max(p["entered"], u["seq"])
    if fault:
        entry["fault"] = fault
        if fault["frames"]:
            entry["stack"] = fault["frames"]
        if fault.get("native_frames"):
            entry["native_frames"] = fault["native_frames"]   # innermost first (tracefile/native.py)
            if fault.get("native_other_thread"):
                entry["native_other_thread"] = True   # another thread's than the Python stack shown
        if fault.get("native_exception"):
            entry["native_exception"] = fault["native_exception"]
    if exception:
        entry["exception"] = exception
        if not entry["stack"] and exception.get("frames"):
            entry["stack"] = exception["frames"]   # where it raised: the line the report names
    if exit_frames and not entry["stack"]:
        entry["stack"] = exit_frames   # where it called sys.exit (os._exit, exit()): the line the report names
    if thread_exceptions:
        entry["thread_exceptions"] = thread_exceptions
    if batches:
        entry["batches"] = batches   # sampled inputs of its data-parallel models (tracefile/batchlog.py)
    if samples:
        entry["samples"] = samples   # its stack while the others waited for it (tracefile/samples.py)
    return entry


def host_entry(entry: dict, *, keep_records: int, died_at: float | None, live_stack=None,
               last_event_t: float = 0.0, activity=None) -> dict:
    """What the host adds to a rank's entry from watching it: the recent records (open ones
    always), dead or alive from its process, its live stack while the rank has done nothing since
    it was taken, and its activity (progressing, blocked in I/O, frozen).
    live_stack: (taken at, frames, route, why other routes failed[, native frames]) or None."""
    e = entry
    recs = e["records"]
    if len(recs) > keep_records:
        # open ones, and the rank's group creations: what a later one is compared with
        e["records"] = ([r for r in recs[:-keep_records] if r["state"] in PENDING or r.get("setup")]
                        + recs[-keep_records:])
    if died_at is not None:
        e["died_at"] = died_at
        settled(e)   # gone: no status will come now
        if e["status"] == UNKNOWN:
            e["status"] = DEAD
            e["exit"] = {"signal": None, "note": NO_TRACE_NOTE}
    elif e["status"] == UNKNOWN:
        e["status"] = ALIVE
    elif e["status"] == DEAD and (e.get("fault") or {}).get("native_pending"):
        # a fatal signal the program handles itself, and its process lives: its handler may let
        # it go on (tracefile/reader.py); dead once the process is gone
        e["status"], e["exit"] = ALIVE, None
        if e.get("stack") is e["fault"].get("frames"):
            e["stack"] = None   # the fault's stack is not where it is, if it goes on
        e["fault"] = None
        e.pop("native_frames", None)
        e.pop("native_exception", None)
    if live_stack and e["status"] == ALIVE and live_stack[0] >= last_event_t:
        # only while the rank has done nothing since it was taken
        e["stack_at"], e["stack"] = live_stack[0], live_stack[1]
        e["stack_via"] = live_stack[2]
        if len(live_stack) > 4 and live_stack[4]:
            e["native_frames"] = live_stack[4]   # the main thread's native frames then (host/probes.py)
    elif live_stack and live_stack[3] and e["status"] == ALIVE and not e.get("stack"):
        e["stack_errors"] = live_stack[3]
    if activity is not None and e["status"] == ALIVE:
        e["activity"] = activity
    return e


def settled(entry: dict) -> None:
    """An ending whose exit status was still to come (tracefile/reader.py ending_of's "pending"),
    taken as it stands: the process is gone, or the files are all there is."""
    ex = entry.get("exit")
    if isinstance(ex, dict) and ex.get("pending"):
        entry["exit"] = {k: v for k, v in ex.items() if k != "pending"}


def groups_of(tables) -> dict[str, dict]:
    """The job's groups from each rank's group table (every rank names a group the same)."""
    out: dict[str, dict] = {}
    for table in tables:
        for g in table.values():
            have = out.setdefault(g["name"], {"name": g["name"], "desc": g["desc"], "ranks": g["ranks"]})
            if "timeout_s" in g and "timeout_s" not in have:
                have["timeout_s"] = g["timeout_s"]   # the backend's: its abort ends a wait this long
            if g.get("any_of"):
                have["any_of"] = True   # any member ends its waits (a key of the job's store)
    return out


def from_files(entries: dict, groups: dict, saved: dict | None, judged_at: float | None = None) -> dict:
    """The post-mortem snapshot: the entries read from the rank files, with what a live view
    saved (snapshot.json: liveness and live stacks) laid over them; taken at the last time
    anything was seen, or, where colltrace ended the job, when it judged it (`judged_at`: the
    time of the finding it acted on; what came after is its own doing), never before a record."""
    snap: dict = dict(empty())
    snap["groups"] = dict(groups)
    snap["ranks"] = dict(entries)
    if saved is not None:
        snap["groups"] = {**saved.get("groups", {}), **snap["groups"]}
        for rank, entry in saved["ranks"].items():
            mine = snap["ranks"].get(rank)
            if mine is None or mine["status"] == UNREADABLE:
                snap["ranks"][rank] = entry
                continue
            # the live view knows liveness and live stacks; the files know the final records, and
            # how a rank that wrote its ending ended (its exit status comes after the live view)
            for key in SAVED_LIVE_KEYS:
                if entry.get(key) is not None and not (key in ("status", "exit") and mine["status"] in ENDED):
                    mine[key] = entry[key]
        snap["taken_at"] = float(saved.get("taken_at") or 0.0)
        if isinstance(saved.get("clocks"), dict):   # the hosts' clock offsets the leader measured
            snap["clocks"] = saved["clocks"]
    last_seen, last_record = [snap["taken_at"]], [0.0]
    for e in snap["ranks"].values():
        settled(e)
        last_seen.append(e.get("heartbeat") or 0.0)
        last_record.extend(r.get("completed_at") or r.get("entered_at") or 0.0 for r in e.get("records", [])[-3:])
    snap["taken_at"] = max(last_seen + last_record) if judged_at is None else max([judged_at] + last_record)
    return snap


def add_saved_stacks(snap: Snapshot, saved: dict) -> None:
    """Live stacks a watchdog saved (its snapshot.json) for ranks that are alive and show none:
    where ranks in no collective are, for a reader that cannot take stacks itself."""
    ranks = saved.get("ranks") if isinstance(saved, dict) else None
    if not isinstance(ranks, dict):
        return
    for rank, entry in snap["ranks"].items():
        theirs = ranks.get(rank)
        if entry.get("status") == ALIVE and not entry.get("stack") and isinstance(theirs, dict) and theirs.get("stack"):
            entry["stack"], entry["stack_at"] = theirs["stack"], theirs.get("stack_at")
            for k in ("stack_via", "activity", "native_frames"):   # which route gave it; busy, frozen or blocked in I/O
                if theirs.get(k):
                    entry[k] = theirs[k]


def job_stall_s(snap: Snapshot) -> float | None:
    """The COLLTRACE_STALL_S the job ran with (each rank's entry carries it), so that an analysis
    after the fact agrees with the live one; None if no entry says."""
    for entry in (snap.get("ranks") or {}).values():
        v = entry.get("stall_s") if isinstance(entry, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
            return float(v)
    return None


def merge(summaries: list[dict], now: float) -> Snapshot:
    """One snapshot of these summaries (the first: this host's own); where hosts measured their
    clocks (host/clock.py), each host's offset to this one's as "clocks"."""
    snap = empty(now)
    for s in summaries:
        snap["groups"].update(s.get("groups") or {})
        snap["ranks"].update(s.get("ranks") or {})
    if summaries:
        clocks = clock_offsets(summaries[0].get("host"), summaries[1:], summaries[0].get("clocks"))
        if len(clocks) > 1:
            snap["clocks"] = clocks
        if any("arrivals" in s for s in summaries):   # a large job: who came last, digested (model/arrivals.py)
            snap["arrivals"] = arrivals.unite(summaries[0].get("arrivals"), summaries[1:])
    return snap


def clock_offsets(own_host, children: list[dict], own: dict | None = None) -> dict:
    """{host: [its clock minus this host's, error bound]} over a subtree (host/clock.py): this
    host at 0 (and the hosts `own` already holds, a subtree's); each child's host at the offset it
    measured to this one ("clock"); each host below a child at its offset to that child ("clocks")
    plus the child's, the bounds added. A child not measured yet adds nothing (its hosts' times
    are compared as they are)."""
    out: dict[str, list] = {str(h): v for h, v in (own or {}).items() if is_clock(v)}
    out.setdefault(str(own_host), [0.0, 0.0])
    for s in children:
        mine = s.get("clock")
        if not is_clock(mine) or s.get("host") is None:
            continue
        out.setdefault(str(s["host"]), [round(mine[0], 6), round(mine[1], 6)])
        below = s.get("clocks")
        for h, v in (below.items() if isinstance(below, dict) else ()):
            if is_clock(v):
                out.setdefault(str(h), [round(v[0] + mine[0], 6), round(v[1] + mine[1], 6)])
    return out


def compact_frames(frames: list[dict], roots: dict | None = None) -> list[dict]:
    """Keep the innermost frames and those around the innermost user frame: what reports show.
    `roots`: the rank's, which tell its own code from torch's and the frameworks'."""
    if len(frames) <= FRAMES_NEAR_USER + 4:
        return frames
    classify = origins.for_roots(roots).classify
    user = next((i for i in range(len(frames) - 1, -1, -1)
                 if classify(frames[i].get("file", ""))[0] == origins.USER and not origins.is_wrapper(frames[i])), None)
    keep = set(range(len(frames) - 4, len(frames)))
    if user is not None:   # and the call it makes, past the wrappers that pass it on
        keep.update(range(max(0, user - FRAMES_NEAR_USER + 1), (origins.called(frames, user) or user) + 1))
    return [frames[i] for i in sorted(keep)]


def compact_entry(entry: dict) -> dict:
    """A rank entry small enough to travel through the store once per PUBLISH_S."""
    e = dict(entry)
    recs = e.get("records") or []
    pending = [r for r in recs if r.get("state") in PENDING]
    done = [r for r in recs if r.get("state") not in PENDING and not r.get("setup")][-RECENT_COMPLETED:]
    done += [r for r in recs if r.get("state") not in PENDING and r.get("setup")][-RECENT_SETUP:]
    keep = sorted(pending + done, key=lambda r: (r.get("entered_at") or 0, r.get("id") or 0))
    roots = e.get("roots")
    e["records"] = [dict(r, frames=compact_frames(r.get("frames") or [], roots)) for r in keep]
    if e.get("stack"):
        e["stack"] = compact_frames(e["stack"], roots)
    return e


def suspects(snap: Snapshot, now: float) -> set[int]:
    """Ranks others have waited for a while that are in no collective: their live stack will
    be needed to say where they are instead. Each collective waited on is looked at once, not
    once per rank waiting in it (a world group's hang: N waiters, N members). A member seen from
    its vitals only (a large job: host/tree.py) is no suspect yet: its records did not travel, and
    its numbers may just lag; asked for in full (the root's `want`), it is judged then."""
    out = set()
    groups = snap["groups"]
    ranks = snap["ranks"]
    seen = set()
    for entry in ranks.values():
        for r in entry.get("records") or []:
            if r.get("state") not in PENDING or r.get("p2p") and r.get("peer") is None:
                continue
            if now - (r.get("entered_at") or now) < SUSPECT_AFTER_S:
                continue
            p2p = bool(r.get("p2p"))
            key = ("p2p", r["peer"]) if p2p else (r.get("group"), r.get("seq"))
            if key in seen:
                continue
            seen.add(key)
            members = [r["peer"]] if p2p else groups.get(r.get("group"), {}).get("ranks", [])
            for m in members:
                other = ranks.get(str(m))
                if other is None or other.get("status") not in (ALIVE, UNKNOWN) or other.get("vital"):
                    continue
                if not p2p and (other.get("progress") or {}).get(r["group"], {}).get("entered", 0) >= r["seq"]:
                    continue
                if not any(x.get("state") == WAITING for x in other.get("records") or []):
                    out.add(int(m))
    return out
