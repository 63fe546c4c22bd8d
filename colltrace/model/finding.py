"""A finding (docs/findings.md): one confirmed problem, typed, one dataclass per kind.

The analyzer builds them; the reporters, the watchdog, the commands and the dashboard read their
attributes. JSON is for where a finding leaves the process (findings.jsonl, `analyze --json`, the
store, the dashboard's API): `to_json()` gives the very dict docs/findings.md describes (its keys
in the order they have always been written, a key left out where it always was), and
`Finding.from_json()` reads one back, of whatever version: keys it does not know are kept in
`extra`, keys it knows but the object lacked stay absent, so `to_json(from_json(d)) == d`.

Per-rank entries, `look_first`, `cycle`, `classes` and the like stay JSON-ready dicts: they are
passed through as recorded (their keys: the TypedDicts of colltrace/model/parts.py). Each field
has one stage that writes it: the analyzer the facts, `reporters.text.summarize` the `summary`
and `advice` (on a copy), `callsites.samekind` the `same_kind` call sites and the watchdog
`supersedes` / `superseded_by` (in place: the findings it has reported are the ones that change).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, cast

from colltrace.model.parts import (
    CycleStep,
    FailedCall,
    GroupRef,
    Loader,
    LookFirst,
    MismatchClass,
    RankPart,
    SameKindSite,
    UntracedNote,
    WaitingCall,
)
from colltrace.model.schema import Exit, Record

# The keys every finding starts with and ends with, in the order they are written.
HEAD = ("kind", "key", "detected_at", "summary", "advice", "group", "seq", "missing_ranks", "ranks", "groups")
TAIL = ("look_first", "behind", "unreadable_ranks", "unreadable", "supersedes", "same_kind", "superseded_by")


@dataclass(kw_only=True)
class Finding:
    kind: str = ""
    key: str = ""
    detected_at: float = 0.0
    summary: str = ""             # the paragraph: reporters.text.summarize
    advice: str = ""              # its "Look first at ..." sentence alone
    group: GroupRef = field(default_factory=cast("Callable[[], GroupRef]", dict))   # {} until the analyzer sets it
    seq: int | None = None
    missing_ranks: list[int] = field(default_factory=list)
    ranks: dict[str, RankPart] = field(default_factory=dict)  # rank (a string) -> its entry
    groups: dict[str, GroupRef] = field(default_factory=dict)  # every group mentioned, by name
    look_first: LookFirst | None = None
    behind: list[int] | None = None                           # ranks stuck only because of this one
    unreadable_ranks: list[int] | None = None
    unreadable: dict[str, str] | None = None
    supersedes: list[str] | None = None                       # the watchdog's
    same_kind: list[SameKindSite] | None = None               # callsites.samekind's
    superseded_by: str | None = None                          # the watchdog's
    extra: dict[str, Any] = field(default_factory=dict)       # keys this version does not know
    absent: frozenset[str] = field(default=frozenset(), repr=False)   # required keys the JSON read lacked

    # Fields written only when set (None, or False for `p2p`, means the key is absent).
    OPTIONAL: ClassVar[frozenset[str]] = frozenset(TAIL)

    def own_keys(self) -> tuple[str, ...]:
        """This kind's keys, in the order the analyzer has always written them."""
        return ()

    def to_json(self) -> dict:
        """The finding as docs/findings.md describes it (its nested dicts shared, not copied)."""
        out: dict[str, Any] = {}
        for name in HEAD + self.own_keys() + TAIL:
            if name in self.absent:
                continue
            v = getattr(self, name)
            if name in self.OPTIONAL and (v is None or v is False):
                continue
            out[name] = v
        if self.extra:
            out.update(self.extra)
        return out

    @staticmethod
    def from_json(d: dict) -> Finding:
        """The finding a JSON object describes, by its kind (an unknown kind: a plain Finding)."""
        cls = KINDS.get(str(d.get("kind")), Finding)
        known = {f.name for f in fields(cls) if f.name not in ("extra", "absent")}
        made = cls(**{k: v for k, v in d.items() if k in known})
        made.absent = frozenset(k for k in HEAD + made.own_keys() if k not in d and k not in cls.OPTIONAL)
        # Whatever to_json would not give back as it was (a key of another version, a key this
        # kind writes only in other cases, an optional key written as null) is kept as it came.
        back = made.to_json()
        made.extra = {k: v for k, v in d.items() if k not in back or back[k] is not v}
        return made


@dataclass(kw_only=True)
class Mismatch(Finding):
    kind: str = "mismatch"
    differs: list[str] = field(default_factory=list)      # op, shapes, dtypes, reduce_op, root
    classes: list[MismatchClass] = field(default_factory=list)   # ranks grouped by what they called
    untraced_before: list[UntracedNote] | None = None

    OPTIONAL = Finding.OPTIONAL | {"untraced_before"}

    def own_keys(self) -> tuple[str, ...]:
        return ("differs", "classes", "untraced_before")


@dataclass(kw_only=True)
class Deadlock(Finding):
    kind: str = "deadlock"
    cycle: list[CycleStep] = field(default_factory=list)  # every collective of the wait-for cycle
    waited_s: float = 0.0

    def own_keys(self) -> tuple[str, ...]:
        return ("cycle", "waited_s")


@dataclass(kw_only=True)
class DeadRank(Finding):
    kind: str = "dead_rank"
    rank: int = -1
    exit: Exit | None = None
    died_at: float | None = None
    last_collective: Record | None = None   # compact: evidence.compact_record
    waiting: list[WaitingCall] = field(default_factory=list)   # the collectives waiting for it
    failed: list[FailedCall] = field(default_factory=list)    # the collectives that failed because of it
    also_missing: list[int] | None = None
    waited_s: float | None = None

    OPTIONAL = Finding.OPTIONAL | {"also_missing", "waited_s"}

    def own_keys(self) -> tuple[str, ...]:
        return ("rank", "exit", "died_at", "last_collective", "waiting", "failed", "also_missing", "waited_s")


@dataclass(kw_only=True)
class Stall(Finding):
    kind: str = "stall"
    stage: str = ""               # arrival | completion | unverified (p2p)
    waited_s: float = 0.0
    waiting: list[int] = field(default_factory=list)
    unknown_ranks: list[int] | None = None
    untraced_before: list[UntracedNote] | None = None
    completed_ranks: list[int] | None = None
    not_started: list[int] | None = None   # completion: ranks whose GPU has not reached it (work queued ahead)
    # a p2p stall: the waiting side, its peer, the op, the peer's count of matching ops
    p2p: bool = False
    rank: int | None = None
    peer: int | None = None
    op: str | None = None
    posted: int | None = None

    OPTIONAL = Finding.OPTIONAL | {"unknown_ranks", "untraced_before", "completed_ranks", "not_started", "p2p"}

    def own_keys(self) -> tuple[str, ...]:
        if self.p2p:
            return ("stage", "p2p", "rank", "peer", "op", "posted", "waited_s")
        return ("stage", "waited_s", "waiting", "unknown_ranks", "untraced_before", "completed_ranks", "not_started")


@dataclass(kw_only=True)
class UnmatchedP2P(Finding):
    kind: str = "unmatched_p2p"
    p2p: bool = True
    rank: int = -1                # the side that waits
    peer: int | None = None       # the side that never posted the match
    op: str | None = None
    posted: int | None = None
    waited_s: float = 0.0

    def own_keys(self) -> tuple[str, ...]:
        return ("p2p", "rank", "peer", "op", "posted", "waited_s")


@dataclass(kw_only=True)
class DuplicateData(Finding):
    kind: str = "duplicate_data"
    source: str | None = None     # "batches": what the ranks fed their model; None: the gathers' inputs
    model: str | None = None
    op: str | None = None
    identical_calls: int = 0
    calls: int = 0
    seqs: list[int] = field(default_factory=list)
    digest: str | None = None
    loader: Loader | None = None

    OPTIONAL = Finding.OPTIONAL | {"source", "model", "op", "loader"}

    def own_keys(self) -> tuple[str, ...]:
        if self.source == "batches":
            return ("source", "model", "op", "identical_calls", "calls", "seqs", "digest", "loader")
        return ("calls", "identical_calls", "seqs", "digest", "source", "model", "op", "loader")


KINDS: dict[str, type[Finding]] = {"mismatch": Mismatch, "deadlock": Deadlock, "dead_rank": DeadRank,
                                   "stall": Stall, "unmatched_p2p": UnmatchedP2P, "duplicate_data": DuplicateData}


def to_json(findings) -> list[dict]:
    """A list of findings as JSON-ready dicts."""
    return [f.to_json() for f in findings]


def from_json(items) -> list[Finding]:
    """Findings read back from JSON; anything that is not an object is skipped."""
    return [Finding.from_json(d) for d in items or () if isinstance(d, dict)]
