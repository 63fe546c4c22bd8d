"""Where the dashboard's data comes from. Each source's read() gives a Reading: a plain snapshot
(docs/design.md) and findings (docs/findings.md), the same data the CLI works from.

- FolderSource: a trace folder. While the job's ranks run on this host it reads their rings
  incrementally and watches their processes, as the watchdog does; once they are gone it reads
  the folder post-mortem, as `colltrace analyze` does.
- StoreSource: a running job's c10d TCPStore (HOST:PORT), where the watchdogs publish one
  summary per node; works from any machine that can reach the store.
- WatchdogSource: inside the leader watchdog (COLLTRACE_DASHBOARD): its latest round.

A source raises SourceError (one line) when it has nothing to show; it never blocks forever
(the store client times out) and reads nothing a request names.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from colltrace import config, verdict
from colltrace.errors import InputError
from colltrace.host import storelink
from colltrace.model import build
from colltrace.model.build import merge
from colltrace.model.finding import Finding
from colltrace.model.schema import Snapshot
from colltrace.tracefile import layout, reader

if TYPE_CHECKING:
    from colltrace.host.nodeview import NodeView

LIVE, POST_MORTEM = "live", "post-mortem"
STALE_PUBLISH_S = 10.0   # store summaries older than this: the job's watchdogs stopped publishing


class SourceError(InputError):
    """Nothing to show, and why (one line)."""


@dataclass
class Reading:
    snap: Snapshot
    findings: list[Finding]                              # the analysis of this snapshot
    now: float                                           # the time the snapshot describes
    mode: str = LIVE                                     # live | post-mortem
    reported: list[Finding] = field(default_factory=list)   # what the watchdog has reported so far
    note: str | None = None                              # shown beside the data (e.g. the store is gone)


def _read_jsonl(path: str) -> list[Finding]:
    """findings.jsonl as the watchdog wrote it; a torn last line (being written) is skipped."""
    out: list[Finding] = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    out.append(Finding.from_json(obj))
    except OSError:
        pass
    # the file is append-only: a stall that turned into a deadlock is marked by the later line
    by = {k: f.key for f in out if isinstance(f.supersedes, list) for k in f.supersedes}
    for finding in out:
        if finding.key in by:
            finding.superseded_by = by[finding.key]
    return out


class FolderSource:
    kind = "folder"

    def __init__(self, directory: str, stall_s: float | None = None):
        self.dir = os.path.abspath(directory)
        self.label = self.dir
        self.stall_s = stall_s
        self._node: NodeView | None = None   # while the ranks run here
        self._post: tuple | None = None    # (folder signature, Reading) post-mortem
        self._saved: tuple | None = None   # (mtime, snapshot.json) for live stacks

    def _signature(self) -> tuple:
        # Post-mortem files change rarely: re-read (4 MiB rings) only when something changed.
        with os.scandir(self.dir) as it:
            return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in it if e.is_file()))

    def read(self) -> Reading:
        try:
            files = reader.rank_files(self.dir)
        except reader.TraceError as exc:
            raise SourceError(str(exc)) from None
        has_saved = os.path.exists(os.path.join(self.dir, layout.SNAPSHOT))
        if not files and not has_saved:
            raise SourceError(f"{self.dir}: no colltrace trace files ({layout.RINGS}) in this folder yet; "
                              "waiting for the job's ranks")
        if files:
            live = self._read_live()
            if live is not None:
                return live
        return self._read_post_mortem()

    def _read_live(self) -> Reading | None:
        from colltrace.host.nodeview import NodeView  # no torch: files and psutil only

        if self._node is None:
            # Only this host's processes can be watched; ranks elsewhere are read post-mortem.
            self._node = NodeView(self.dir, job=None, host=config.load().host)
        node = self._node
        node.poll()
        self._drop_older_jobs(node)
        if not node.traces or node.all_gone():
            return None
        now = time.time()
        snap = merge([node.summary()], now)
        self._add_live_stacks(snap)
        findings = verdict.findings_of(snap, self._stall_s(snap), now)
        return Reading(snap, findings, now, LIVE, _read_jsonl(os.path.join(self.dir, layout.FINDINGS)))

    @staticmethod
    def _drop_older_jobs(node: NodeView) -> None:
        """A reused folder may hold an older job's ranks: watch the newest job's only."""
        started: dict[Any, Any] = {}   # job id -> its ranks' latest start time
        for tr in node.traces.values():
            job = tr.meta.get("job")
            started[job] = max(started.get(job, 0), tr.meta.get("started", 0))
        if len(started) > 1:
            newest = max(started, key=started.__getitem__)
            for rank in [r for r, tr in node.traces.items() if tr.meta.get("job") != newest]:
                node.traces.pop(rank)
                node.ignored.add(rank)

    def _add_live_stacks(self, snap: Snapshot) -> None:
        """The watchdog's py-spy stacks (in its snapshot.json): where ranks in no collective are."""
        path = os.path.join(self.dir, layout.SNAPSHOT)
        try:
            mtime = os.stat(path).st_mtime_ns
            if self._saved is None or self._saved[0] != mtime:
                with open(path) as f:
                    self._saved = (mtime, json.load(f))
        except (OSError, ValueError):
            return
        build.add_saved_stacks(snap, self._saved[1])

    def _read_post_mortem(self) -> Reading:
        try:
            sig = self._signature()
        except OSError as exc:
            raise SourceError(f"{self.dir}: {exc.strerror}") from None
        if self._post is not None and self._post[0] == sig:
            return self._post[1]
        try:
            snap = cast(Snapshot, reader.load_snapshot(self.dir))   # annotated as a plain dict there
        except reader.TraceError as exc:
            raise SourceError(str(exc)) from None
        if not snap["ranks"]:
            raise SourceError(f"{self.dir}: no rank could be read from this folder")
        now = snap["taken_at"]
        reading = Reading(snap, verdict.findings_of(snap, self._stall_s(snap), now), now, POST_MORTEM,
                          _read_jsonl(os.path.join(self.dir, layout.FINDINGS)))
        self._post = (sig, reading)
        return reading

    def _stall_s(self, snap: Snapshot) -> float:
        return self.stall_s if self.stall_s is not None else reader.job_stall_s(snap)


class StoreSource:
    kind = "store"

    def __init__(self, address: str, stall_s: float | None = None, timeout_s: float = 5.0):
        try:
            self.host, self.port = storelink.parse_address(address)
        except storelink.StoreError as exc:
            raise SourceError(str(exc)) from None
        self.label = f"store {self.host}:{self.port}"
        self.stall_s = stall_s
        self.timeout_s = timeout_s
        self._link: storelink.StoreLink | None = None
        self._last: Reading | None = None

    def read(self) -> Reading:
        try:
            if self._link is None:
                self._link = storelink.StoreLink(self.host, self.port, timeout_s=self.timeout_s, follow_leader=True)
            summaries = self._link.node_summaries()
            reported = self._link.findings()
        except storelink.StoreError as exc:
            self._link = None   # reconnect next round
            if self._last is None:
                raise SourceError(str(exc)) from None
            # The job (and its store) may be gone: keep showing what was last seen, and say so.
            when = time.strftime("%H:%M:%S", time.localtime(self._last.now))
            return replace(self._last, note=f"{exc}; showing the state last read at {when}")
        if not summaries:
            if not self._link.followed:
                self._link = None   # the leader may not have announced itself yet: look again next round
            raise SourceError(f"the store at {self.host}:{self.port} holds no colltrace state yet "
                              "(is the job running with COLLTRACE=1?)")
        now = time.time()
        snap = merge(summaries, now)
        stall_s = self.stall_s if self.stall_s is not None else reader.job_stall_s(snap)
        note = None
        newest = max(float(s.get("t") or 0) for s in summaries)
        if now - newest > STALE_PUBLISH_S:
            note = f"the job's watchdogs last published {now - newest:.0f} s ago (job over, or its watchdogs stopped)"
        self._last = Reading(snap, verdict.findings_of(snap, stall_s, now), now, LIVE,
                             reported if isinstance(reported, list) else [])
        return replace(self._last, note=note)


class WatchdogSource:
    """The leader watchdog's own latest round (Watchdog.view()), read in its process."""

    kind = "watchdog"

    def __init__(self, watchdog):
        self.watchdog = watchdog
        self.label = f"watchdog of {os.path.abspath(watchdog.dir)}"

    def read(self) -> Reading:
        view = self.watchdog.view()
        if view is None or not view.snapshot.get("ranks"):
            raise SourceError("no rank has started yet: waiting for the job's first trace")
        return Reading(view.snapshot, view.findings, view.taken_at, LIVE, list(view.reported))
