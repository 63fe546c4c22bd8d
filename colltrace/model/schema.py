"""The snapshot's shape: its state words as constants, its parts as TypedDicts, and its JSON
round trip with validation. Plain dicts throughout (the analyzer and the files use them as they
are); the types say what a dict holds. docs/design.md describes every field."""
from __future__ import annotations

import json
from typing import TypedDict, TypeGuard

from colltrace.errors import InputError

VERSION = 1

# a record's state: where one rank is with one collective
WAITING = "waiting"        # a blocking call has not returned
IN_FLIGHT = "in_flight"    # async work (or a returned blocking call the backend has not finished)
COMPLETED = "completed"
FAILED = "failed"
PENDING = frozenset((WAITING, IN_FLIGHT))

# a rank's status: its process
ALIVE = "alive"
EXITED = "exited"          # ended by itself (returned, raised, exit code)
DEAD = "dead"              # killed by a signal, or gone without a trace
UNKNOWN = "unknown"        # not observed (post-mortem, no live view)
UNREADABLE = "unreadable"  # its trace cannot be read (a full disk stopped it, a torn file)
ENDED = frozenset((EXITED, DEAD))

# how a rank that exited ended (its entry's exit["how"]; tracefile/reader.py ending_of)
EXIT_CALLS = ("sys.exit", "exit()", "quit()", "os._exit")   # a call, at the line its frames give
RAISED = "SystemExit"     # raised without a call colltrace saw: the code from the exit status
RETURNED = "return"       # its program ran to its end (code 0)
NATIVE_EXIT = "native"    # exit() in native code: no Python ending ran
INTERRUPTED = "signal"    # Python ended itself with a signal (SIGINT after KeyboardInterrupt)
RAISED_ERROR = "exception"
# groups no process group stands for (colltrace/rank/setup.py): the job's group creations, those a
# group's members make alone ("setup:" + their ranks), the waits on a key of the job's store
SETUP_GROUP = "setup"
SETUP_LOCAL = "setup:"
STORE_WAIT = "store:"
# A local group creation torch counts among the job's (rank/setup.py): its record's detail
LOCAL_SYNC = "use_local_synchronization=True"

# a rank's state in a finding: a record state, a rank status, or
NOT_IN_COLLECTIVE = "not_in_collective"   # then its frames are its live stack


class Frame(TypedDict, total=False):
    file: str
    line: int
    func: str
    origin: str        # user | framework | internal (colltrace/origins.py)
    package: str


class _GroupBase(TypedDict):
    name: str          # the same on every rank
    desc: str
    ranks: list        # global ranks


class Group(_GroupBase, total=False):
    timeout_s: float   # the backend's collective timeout: its abort ends a wait this long
    any_of: bool       # a wait any member ends (a key of the job's store someone sets), not all together


class Record(TypedDict, total=False):
    id: int
    rank: int
    group: str
    seq: int
    seq_end: int
    op: str            # the API called; "untraced" for counted gaps
    backend_op: str
    p2p: bool
    peer: int | None
    state: str         # WAITING, IN_FLIGHT, COMPLETED or FAILED
    entered_at: float
    returned_at: float | None
    completed_at: float | None
    started_at: float | None   # a CUDA collective's start event seen reached; None: not (yet), or unknown
    start_event: bool  # present (True) where a start event was recorded: started_at None means not started
    captured: bool     # present (True): captured into a CUDA graph, runs at replays unseen
    shapes: list
    dtypes: list
    frames: list
    failed_at: float   # FAILED: when the call raised or its work ended in an error or a timeout
    error: str         # FAILED: the reason, as the backend said it
    unobserved: bool   # nothing reports its completion (a functional collective)
    wait: dict         # a thread parks for it: {"since", "frames" (where it waits), "thread"}
    setup: bool        # a call that synchronizes ranks without being a collective (group creation, a store wait)
    members: list      # setup: the ranks it asks for (absent: every rank of its group)
    detail: str        # setup: what else it asks for (a split, a store key), compared across ranks


class Exit(TypedDict, total=False):
    """How a rank ended (a RankEntry's exit)."""
    code: int | None     # its process's exit code (the status it gave exit(), where written)
    how: str                # EXIT_CALLS, RAISED, RETURNED, NATIVE_EXIT, INTERRUPTED or RAISED_ERROR
    at: float | None     # when it wrote its ending
    message: str            # sys.exit("text")
    exception: str          # "ValueError: bad batch"
    pending: bool           # a return whose exit status is still to come
    signal: str | None   # SIGSEGV (faulthandler), SIGINT (KeyboardInterrupt), or None: killed
    at_exit: bool           # the signal came after its program had finished
    note: str               # gone without a trace
    ended_by: str           # "colltrace": COLLTRACE_ON_HANG=abort ended it (with why, at, finding)
    why: str                # ended_by: why it acted (host/actions.py; tracefile/endings.py exit_info)
    finding: str | None     # ended_by: the finding's key


class RankEntry(TypedDict, total=False):
    rank: int
    pid: int | None
    host: str | None
    status: str        # ALIVE, EXITED, DEAD, UNKNOWN or UNREADABLE
    exit: Exit | None
    died_at: float | None
    heartbeat: float | None
    error: str | None
    progress: dict     # group -> {"entered": N, "completed": N}
    records: list      # Record, oldest first
    stack: list | None
    stack_at: float | None
    fault: dict | None
    native_frames: list         # where it died (or, alive, where its main thread is) in native code, innermost first
    native_exception: dict      # the uncaught C++ exception behind its abort: {"type", "what"}
    native_other_thread: bool   # its native frames are a thread's without Python frames, not the stack's
    job: str | None
    lost_slots: int             # ring slots overwritten before they were read
    stall_s: float | None    # the rank's own COLLTRACE_STALL_S
    roots: dict                 # where its torch, stdlib and packages are (origins.py)
    digests: bool               # some record carries an input digest
    untraced: list              # entered without colltrace seeing it (the Flight Recorder's entries)
    exception: dict             # the exception its main thread died of
    thread_exceptions: list     # other threads' exceptions
    batches: dict               # sampled inputs of its data-parallel models
    samples: dict               # its stack while others waited for it: {"stacks", "at", "gc", "cpu"}
    stack_via: str              # how its live stack was taken
    stack_errors: dict          # why the other routes to its stack failed
    activity: dict              # progressing, blocked in I/O or frozen (host/probes.py)
    vital: bool                 # a large job's vitals only (host/tree.py)
    flight_recorder: dict       # a rank read from a Flight Recorder dump: {"version", "source"} (tracefile/frdump.py)


class _SnapshotBase(TypedDict):
    version: int
    taken_at: float
    groups: dict       # name -> Group
    ranks: dict        # str(rank) -> RankEntry


class Snapshot(_SnapshotBase, total=False):
    clocks: dict       # host -> [its clock minus the leader's, error bound] (host/clock.py); multi-host live jobs
    arrivals: dict     # group -> digests of who came when (model/arrivals.py); live jobs of more than 512 ranks
    source: dict       # where a post-mortem snapshot came from: {"kind": "flight_recorder", "path"}
    #                    (tracefile/frdump.py)
    findings: list     # the findings reported live, as JSON (snapshot.json, `colltrace dump --from-store`)


def is_clock(v) -> TypeGuard[list]:
    """A host's clock as the snapshot's `clocks` (and a summary's `clock`) hold it: [offset, bound]."""
    return isinstance(v, list) and len(v) == 2 and all(type(x) in (int, float) for x in v)


class SnapshotError(InputError):
    """Text that is not a colltrace snapshot (one line: what is wrong)."""


def empty(taken_at: float = 0.0) -> Snapshot:
    return {"version": VERSION, "taken_at": float(taken_at), "groups": {}, "ranks": {}}


def dumps(snap: Snapshot) -> str:
    return json.dumps(snap, default=str)


def loads(text: str | bytes, where: str = "snapshot") -> Snapshot:
    """A snapshot from JSON, checked enough that every reader can walk it: SnapshotError if not."""
    try:
        snap = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{where}: not a readable snapshot ({exc})") from None
    validate(snap, where)
    return snap


def validate(snap, where: str = "snapshot") -> None:
    if not isinstance(snap, dict) or not isinstance(snap.get("ranks"), dict):
        raise SnapshotError(f"{where}: not a colltrace snapshot (no 'ranks' table)")
    if not isinstance(snap.get("groups", {}), dict):
        raise SnapshotError(f"{where}: not a colltrace snapshot ('groups' is not a table)")
    for rank, entry in snap["ranks"].items():
        if not str(rank).lstrip("-").isdigit() or not isinstance(entry, dict):
            raise SnapshotError(f"{where}: rank {rank!r} is not a rank number with an entry")
        if not isinstance(entry.get("records", []), list):
            raise SnapshotError(f"{where}: rank {rank}: 'records' is not a list")
