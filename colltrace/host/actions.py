"""What a host does about a hang (COLLTRACE_ON_HANG): `dump` writes every local rank's stacks,
`abort` also ends the ranks so the job exits instead of waiting for the timeout.

Each finding is acted on once, when it is certain, whatever came before it: a stall about
ranks still computing is only reported, and the deadlock it turns into is acted on at once.
Abort never waits on one rank after another: the stacks at the hang are already in the
records and the findings, and the extra dumps are taken for every rank at the same time, under
one short deadline, before the ranks are ended."""
from __future__ import annotations

import os
import signal
import threading
import time

from colltrace.analysis import HANG_KINDS
from colltrace.host import probes
from colltrace.model.finding import DeadRank, Finding, Stall, UnmatchedP2P
from colltrace.model.schema import WAITING
from colltrace.reporters.phrases import not_taken_note
from colltrace.tracefile import endings
from colltrace.words import rank_word

ABORT_DUMP_S = 0.5    # abort: the stack dumps get this long, all at once, then the ranks are ended
DUMP_S = 10.0         # dump: nothing is ended, the dumps may take their time (still at once)


class OnHang:
    def __init__(self, settings, node, outputs):
        self.settings = settings
        self.node = node
        self.outputs = outputs
        self.aborted = False
        self.ending: dict | None = None   # {"why", "finding", "at", "ranks": {rank: pid} signalled} once abort acted
        self._acted: set[str] = set()    # the leader: the findings acted on (by key)
        self._dumped: set[str] = set()   # every host: the reasons it dumped stacks for

    def due(self, findings: list[Finding]) -> tuple[str, str | None] | None:
        """The leader's decision: (why, the finding's key) to act on now, or None. Certain hangs
        are acted on at once, each once, even after a stall was reported; a stall only once every
        rank it waits for is frozen (or after COLLTRACE_ABORT_STALL_S): a rank still computing is
        reported, never killed."""
        if self.aborted:
            return None
        for f in findings:
            key = f.key
            if f.kind not in HANG_KINDS or key in self._acted:   # duplicate data is no hang
                continue
            ok, why = act_on(f, self.settings.on_hang, self.settings.abort_stall_s)
            if ok:
                self._acted.add(key)
                return why, key
        return None

    def act(self, why: str, finding: str | None = None) -> None:
        """On this host's ranks: dump their stacks (once per reason); abort: end them too, once."""
        mode = self.settings.on_hang
        if mode not in ("dump", "abort") or self.aborted:
            return
        pids = self.node.pids()
        texts: dict[int, str] = {}
        deadline = ABORT_DUMP_S if mode == "abort" else DUMP_S
        dumped = why not in self._dumped
        if dumped:
            self._dumped.add(why)
            texts = self._dump_all(pids, deadline, native=mode != "abort")   # Python frames: ~0.1 s a rank
        if mode == "abort":
            self.aborted = True
            self._end(pids, why, finding)
        if dumped:
            for rank in sorted(pids):
                self.outputs.stacks(rank, texts.get(rank) or not_taken_note(deadline))

    def _dump_all(self, pids: dict[int, int], deadline_s: float, native: bool) -> dict[int, str]:
        """Every rank's stacks, taken at the same time; those not done by the deadline are left
        (their threads are daemons and write nothing)."""
        out: dict[int, str] = {}

        def take(rank: int, pid: int) -> None:
            try:
                out[rank] = probes.dump_text(self.node.dir, rank, pid, self.node.traces[rank].meta, native=native)
            except Exception:   # a rank gone meanwhile, a probe failing: its records still tell
                pass

        threads = [threading.Thread(target=take, args=(r, p), name=f"colltrace-dump-{r}", daemon=True)
                   for r, p in pids.items()]
        for t in threads:
            t.start()
        end = time.monotonic() + deadline_s
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        return dict(out)

    def _end(self, pids: dict[int, int], why: str, finding: str | None) -> None:
        """Record the ending (so every reader tells it as it happened), then end the ranks. The
        ending names the ranks signalled, none where none was left running (a launcher ended them
        first): no reader is told colltrace ended a rank it did not."""
        self.ending = {"why": why, "finding": finding, "at": time.time(), "ranks": {}}
        if pids:
            self._record(pids)
        for rank, pid in sorted(pids.items()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue   # gone meanwhile: not ended by colltrace
            self.ending["ranks"][rank] = pid
        ended = self.ending["ranks"]
        if len(ended) < len(pids):
            self._record(ended)
        gone = sorted(set(pids) - set(ended))
        if ended:
            self.outputs.say(f"colltrace: COLLTRACE_ON_HANG=abort ({why}): ended {rank_word(sorted(ended))} (SIGKILL)"
                             + (f"; {rank_word(gone)} had ended already" if gone else ""))
        else:
            self.outputs.say(f"colltrace: COLLTRACE_ON_HANG=abort ({why}): no rank left running on this host; "
                             "colltrace ended none")

    def _record(self, pids: dict[int, int]) -> None:
        """ended-<host>.json: written before the ranks are signalled, so that their deaths are
        never taken for findings; rewritten (or removed) for those that had ended already."""
        ending = self.ending
        assert ending is not None   # only _end calls it, once it has set the ending
        try:
            if pids:
                endings.write(self.node.dir, self.node.host_name(), ending["why"], ending["finding"], pids,
                              at=ending["at"])
            else:
                os.unlink(endings.path(self.node.dir, self.node.host_name()))
        except OSError:
            pass   # a full folder: the ranks are ended all the same, the findings already tell why


# -- what COLLTRACE_ON_HANG=abort may end -----------------------------------------------------------
def _waited_for(finding: Finding) -> list[int]:
    """The ranks a stall (or an unmatched p2p op) waits for: judged by their activity."""
    if isinstance(finding, UnmatchedP2P):
        return [int(r) for r in finding.missing_ranks]
    if isinstance(finding, Stall) and not finding.p2p:
        return sorted({int(r) for r in finding.missing_ranks + (finding.unknown_ranks or [])})
    return []


def missing_states(finding: Finding) -> dict:
    """{rank: its activity state} for the ranks a stall waits for ({} for other findings)."""
    table = finding.ranks
    out = {}
    for r in _waited_for(finding):
        a = (table.get(str(r)) or {}).get("activity")
        out[str(r)] = a.get("state") if isinstance(a, dict) else None
    return out


def act_on(finding: Finding, on_hang: str, abort_stall_s: float = 0.0) -> tuple[bool, str]:
    """Whether COLLTRACE_ON_HANG acts on this finding now, and why. warn and dump act on every
    hang; abort acts on certain ones (mismatch, deadlock, dead rank) at once; on a collective every
    member entered that does not complete only past COLLTRACE_ABORT_STALL_S (nothing makes that
    certain); and on a stall only when every rank it waits for is frozen (none moves, none
    waits for I/O), or once it has lasted COLLTRACE_ABORT_STALL_S (when set). A rank that cannot
    be observed at all (another host without a watchdog, no trace) counts as frozen, as before.
    A rank that died at interpreter exit, after its program finished, is reported and never acted
    on while no rank waits for it (the other ranks are finishing too). A stall whose missing rank
    just entered a collective elsewhere is not acted on: it is about to become certain or end."""
    kind = finding.kind or "hang"
    if isinstance(finding, DeadRank) and (finding.exit or {}).get("at_exit") and not finding.waiting \
            and not finding.failed:
        return False, kind   # it died as its interpreter ended, its program done: no one is kept waiting
    if on_hang == "abort" and isinstance(finding, Stall) and finding.stage == "completion":
        # Every member entered and it has not completed: slow GPU work queued ahead, a first call's
        # set-up, or a real hang; nothing makes it certain. Ended only past COLLTRACE_ABORT_STALL_S.
        if abort_stall_s and finding.waited_s >= abort_stall_s:
            return True, f"{kind} for {finding.waited_s:.0f} s >= COLLTRACE_ABORT_STALL_S"
        return False, kind
    states = missing_states(finding)
    if on_hang != "abort" or not states:
        return True, kind
    table = finding.ranks
    if any((table.get(r) or {}).get("state") == WAITING for r in states):
        # A rank the stall waits for has just entered another collective: within a moment the
        # wait settles into something certain (a cycle, a mismatch) or ends. Not frozen.
        return False, kind
    waited = finding.waited_s if isinstance(finding, (Stall, UnmatchedP2P)) else 0.0
    if abort_stall_s and waited >= abort_stall_s:
        return True, f"{kind} for {waited:.0f} s >= COLLTRACE_ABORT_STALL_S"
    if all(s in ("frozen", None) for s in states.values()):
        frozen = sorted(int(r) for r, s in states.items() if s == "frozen")
        return True, (f"{kind}: rank{'s' if len(frozen) != 1 else ''} {','.join(map(str, frozen))} frozen"
                      if frozen else kind)
    return False, kind
