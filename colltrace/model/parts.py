"""The nested parts of a finding (colltrace/model/finding.py): what its group, its rank entries,
`look_first`, `cycle`, `classes` and the like hold, as TypedDicts. Plain dicts at run time, built
by the analyzer (colltrace/analysis/) and read by the reporters, the watchdog and the dashboard;
the types only say which keys a reader may find. A part that is a snapshot record reuses
colltrace/model/schema.py's types. docs/findings.md describes every key.
"""
from __future__ import annotations

from typing import TypedDict

from colltrace.model.schema import Exit, Record


class GroupRef(TypedDict):
    """A group as a finding names it (its `group`, each of its `groups`)."""
    name: str | None   # None: the finding concerns no group (a rank dead outside any collective)
    desc: str
    ranks: list[int]   # global ranks


class QueuedCall(TypedDict):
    """A call the CPU queued behind a rank's pending one (its entry's `queued`)."""
    op: str | None
    seq: int
    state: str
    frames: list


class Parked(TypedDict):
    """Where a rank's thread waits for its pending call (its entry's `parked`)."""
    since: float | None
    frames: list | None


class _LoaderAt(TypedDict):
    file: str | None
    line: int | None
    func: str | None


class Loader(_LoaderAt, total=False):
    """The DataLoader a rank read its last sampled batch from (duplicate_data): the user's line."""
    before_init: bool
    sampler: str
    distributed: bool
    num_replicas: int


class RankPart(Record, total=False):
    """One rank's entry in a finding (its `ranks`): the record it is in, as recorded, or where it
    is instead, and what is known of its process (colltrace/analysis/evidence.py entry())."""
    status: str                  # the rank's status (schema's ALIVE, EXITED, DEAD, ...)
    host: str
    pid: int
    exit: Exit | None
    died_at: float | None
    stack: list
    native_frames: list
    native_exception: dict
    native_other_thread: bool
    waited_s: float              # in a pending call: for how long
    queued: list[QueuedCall]
    queued_count: int
    parked: Parked
    ended: str                   # the backend ended its wait: "timeout" | "abort"
    waiting_for: list[int]
    note: str                    # in no collective, without a live stack
    stack_at: float | None
    stack_via: str
    stack_errors: dict
    activity: dict
    thread_exceptions: list
    in_flight: list[Record | None]   # async work it issued, not completed (compact records)
    last: Record                 # its last record (compact)
    digest: str | None           # duplicate_data: the input's digest
    loader: Loader               # duplicate_data (batches): where it read it


class _Side(TypedDict):
    ranks: list[int]
    rank: int


class _LookFirstBase(TypedDict):
    ranks: list[int]
    rank: int | None
    reason: str


class LookFirst(_LookFirstBase, total=False):
    """Which ranks to look at first, and why (a finding's `look_first`)."""
    versus: list[int]            # the ranks it differs from
    sides: list[_Side]           # undecided: each class of ranks
    key: str                     # deadlock: the collective of the cycle to look at first
    user_frame: int | None       # index, in its rank's frames, of the user's innermost own frame
    framework_frame: int | None  # and of the framework call it went through


class _ClassBase(TypedDict):
    ranks: list[int]
    op: str
    backend_op: str


class MismatchClass(_ClassBase, total=False):
    """Ranks that called the same (a mismatch's `classes`): the op and every differing field."""
    members: list
    detail: str | None
    shapes: list[list]
    dtypes: list
    reduce_op: str | None
    root: int | None
    untraced: bool               # named by the Flight Recorder: the trace did not see it


class _CycleBase(TypedDict):
    key: str
    group: str
    seq: int
    p2p: bool
    op: str
    waiting: list[int]
    missing: list[int]


class CycleStep(_CycleBase, total=False):
    """One collective of a deadlock's wait-for cycle (its `cycle`)."""
    peer: int | None
    posted: int | None


class WaitingCall(TypedDict):
    """A collective waiting for a dead rank (dead_rank's `waiting`)."""
    key: str
    group: str
    seq: int
    op: str
    p2p: bool
    ranks: list[int]
    waited_s: float


class FailedCall(TypedDict):
    """A collective that failed because a rank is gone (dead_rank's `failed`)."""
    group: str
    seq: int
    op: str | None
    p2p: bool
    missing: bool                # the dead rank never entered it
    ranks: list[int]
    error: str | None


class UntracedNote(TypedDict):
    """Counted-but-unseen collectives right before the one at issue (`untraced_before`)."""
    group: str
    ranks: list[int]
    count: int


class _SiteBase(TypedDict):
    file: str
    line: int
    func: str
    op: str
    group: str                   # "default", or the group expression's source text


class SameKindSite(_SiteBase, total=False):
    """Another call site that would block like the finding's collective (`same_kind`,
    colltrace/callsites/samekind.py)."""
    may_be_default: str | bool
