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
from colltrace.reporters.phrases import not_taken_note
from colltrace.words import format_ranks
from colltrace.tracefile import endings

ABORT_DUMP_S = 0.5    # abort: the stack dumps get this long, all at once, then the ranks are ended
DUMP_S = 10.0         # dump: nothing is ended, the dumps may take their time (still at once)


class OnHang:
    def __init__(self, settings, node, outputs):
        self.settings = settings
        self.node = node
        self.outputs = outputs
        self.aborted = False
        self.ending: dict | None = None   # {"why", "finding", "at"} once this host ended its ranks
        self._acted: set[str] = set()    # the leader: the findings acted on (by key)
        self._dumped: set[str] = set()   # every host: the reasons it dumped stacks for

    def due(self, findings: list[dict]) -> tuple[str, str | None] | None:
        """The leader's decision: (why, the finding's key) to act on now, or None. Certain hangs
        are acted on at once, each once, even after a stall was reported; a stall only once every
        rank it waits for is frozen (or after COLLTRACE_ABORT_STALL_S): a rank still computing is
        reported, never killed."""
        if self.aborted:
            return None
        for f in findings:
            key = f.get("key")
            if f.get("kind") not in HANG_KINDS or key in self._acted:   # duplicate data is no hang
                continue
            ok, why = probes.act_on(f, self.settings.on_hang, self.settings.abort_stall_s)
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
        """Record the ending (so every reader tells it as it happened), then end the ranks."""
        self.ending = {"why": why, "finding": finding, "at": time.time()}
        try:
            endings.write(self.node.dir, self.node.host_name(), why, finding, pids, at=self.ending["at"])
        except OSError:
            pass   # a full folder: the ranks are ended all the same, the findings already tell why
        self.outputs.say(f"colltrace: COLLTRACE_ON_HANG=abort ({why}): ending ranks {format_ranks(sorted(pids))}")
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
