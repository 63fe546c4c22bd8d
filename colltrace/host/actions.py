"""What a host does about a hang (COLLTRACE_ON_HANG), once: `dump` writes every local rank's
stacks, `abort` also ends the ranks so the job exits instead of waiting for the timeout."""
from __future__ import annotations

import os
import signal

from colltrace.analysis import HANG_KINDS
from colltrace.host import probes
from colltrace.reporters.text import format_ranks


class OnHang:
    def __init__(self, settings, node, outputs):
        self.settings = settings
        self.node = node
        self.outputs = outputs
        self.aborted = False
        self.decided = False       # the leader decided to act (once per watchdog)
        self._dumped = False

    def due(self, findings: list[dict]) -> str | None:
        """The leader's decision: why to act now, or None. Certain hangs are acted on at once; a
        stall only once every rank it waits for is frozen (or after COLLTRACE_ABORT_STALL_S): a
        rank still computing is reported, never killed."""
        if self.decided:
            return None
        for f in findings:
            if f.get("kind") not in HANG_KINDS:   # duplicate data is no hang
                continue
            ok, why = probes.act_on(f, self.settings.on_hang, self.settings.abort_stall_s)
            if ok:
                self.decided = True
                return why
        return None

    def act(self, why: str) -> None:
        """On this host's ranks, once: dump their stacks; abort: end them too."""
        if self.settings.on_hang in ("dump", "abort") and not self._dumped:
            self._dumped = True
            for rank, pid in self.node.pids().items():
                self.outputs.stacks(rank, probes.dump_text(self.node.dir, rank, pid, self.node.traces[rank].meta))
        if self.settings.on_hang == "abort" and not self.aborted:
            self.aborted = True
            pids = self.node.pids()
            self.outputs.say(f"colltrace: COLLTRACE_ON_HANG=abort ({why}): ending ranks {format_ranks(sorted(pids))}")
            for pid in pids.values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
