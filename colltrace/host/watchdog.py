"""The watchdog's loop: one process per host, outside the traced ranks; each round reads what
the host sees (host/nodeview.py), exchanges it with the other hosts (host/leader.py) and, on the
leader, analyzes the whole job, reports new findings (host/outputs.py) and acts on hangs
(host/actions.py). Embedders (`colltrace run`, the pytest guard, the dashboard) read its latest
view and subscribe to its rounds; nothing reaches into it.

    python -m colltrace.host --dir DIR --job JOB --host HOST
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

from colltrace import config, verdict
from colltrace.callsites import samekind
from colltrace.host.actions import OnHang, missing_states
from colltrace.host.latecomers import Latecomers
from colltrace.host.leader import Exchange
from colltrace.host.nodeview import NodeView, process_gone
from colltrace.host.outputs import Outputs
from colltrace.model import arrivals
from colltrace.model.build import merge, suspects
from colltrace.model.finding import Finding
from colltrace.model.schema import Snapshot
from colltrace.reporters.activity import activity_lines
from colltrace.reporters.stragglers import render_straggler_line
from colltrace.tracefile import layout

CERTAIN_KINDS = ("deadlock", "mismatch", "dead_rank")   # what a stall can turn into
SUPERSEDABLE = ("stall", "unmatched_p2p")
REJUDGE_S = 0.5               # a large job's unchanged input is judged again this often (SETTLE_S's and the
                              # death's wait fit)
REJUDGE_SHARE = 0.25          # ... or, where judging takes longer, at most this share of the watchdog's time
REJUDGE_MAX_S = 5.0           # ... and never less often than this (a threshold crossed, a host lost: this late at most)
WATCHDOG_NICE = 10            # scheduling priority of the watchdog's threads (0 = the ranks')


def rejudge_after(took: float) -> float:
    """How long an unchanged input's answer stands, given the CPU seconds judging it took."""
    return min(REJUDGE_MAX_S, max(REJUDGE_S, took / REJUDGE_SHARE))


class Kept:
    """An answer worked out from a large job's round, kept while what the round read is unchanged
    (Watchdog._input_key), for rejudge_after(the CPU it cost). `last`: (when, the key, the answer,
    its CPU seconds, what the key's ids point at: held, so that no id is reused while compared)."""

    def __init__(self):
        self.last: tuple | None = None

    def get(self, key: tuple | None, now: float, work, held):
        last = self.last
        if key is not None and last is not None and last[1] == key and now - last[0] < rejudge_after(last[3]):
            return last[2]
        took = time.thread_time()
        out = work()
        took = time.thread_time() - took
        self.last = (now, key, out, took, held) if key is not None else None   # a small job: every round
        return out


def _yield_cpu() -> None:
    """Run this thread (and the threads it starts) at a lower priority: where the ranks keep the
    cores busy the watchdog must not slow them; in a hang they wait, and the cores are its."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WATCHDOG_NICE)   # Linux: this thread
    except (AttributeError, OSError):
        pass


@dataclass(frozen=True)
class View:
    """The leader's latest round, read-only: the snapshot it judged, what it found then, and
    every finding reported so far (a problem reported earlier stays here after it is gone)."""
    snapshot: Snapshot
    findings: list[Finding]
    reported: list[Finding]
    taken_at: float


@dataclass(frozen=True)
class RankProcess:
    """A local rank's process as the watchdog knows it (the pytest guard ends these)."""
    rank: int
    pid: int | None
    started: float
    ended: bool        # its trace says it ended by itself (it may still be tearing down)


class Watchdog:
    """One per host. Every host publishes its summary; the host holding rank 0 (or the only
    host, when there is no store) is the leader and runs the global analysis.

    `start_dashboard`: a callable(watchdog) -> server, called once from a thread when
    settings.dashboard is set (colltrace_dashboard.server.start_for_watchdog); the watchdog
    itself never imports the dashboard."""

    def __init__(self, directory: str, job: str | None, host: str | None, settings: config.Settings,
                 once: bool = False, stream=None, store_address=None, start_dashboard=None):
        self.settings = settings
        self.dir = directory
        self.stream = stream or sys.stderr
        self.once = once
        self.node = NodeView(directory, job, host)
        self.outputs = Outputs(directory, self.stream)
        self.exchange = Exchange(self.node, store_address, self.stream)
        self.on_hang = OnHang(settings, self.node, self.outputs)
        self.latecomers = Latecomers(settings.straggler_share, settings.straggler_window_s)
        self.reported: set[str] = set()
        self.findings: list[Finding] = []   # every finding reported, in order
        self._states: dict[str, dict] = {}  # finding key -> its missing ranks' activity states, last said
        self._view: View | None = None
        self._suspected = Kept()   # build.suspects' answer on a large job (_suspects)
        self._judged = Kept()      # the findings, or None where not judgeable yet (_judge)
        self._subscribers: list = []
        self._start_dashboard = start_dashboard
        self.dashboard: object = None      # COLLTRACE_DASHBOARD: its server once started (False: failed or none)

    # -- what embedders use ------------------------------------------------------------------
    @property
    def leader(self) -> bool:
        return self.exchange.leader

    @property
    def aborted(self) -> bool:
        return self.on_hang.aborted

    def view(self) -> View | None:
        """The leader's latest round (None before the first, and on other hosts)."""
        return self._view

    def subscribe(self, callback) -> None:
        """callback(view, new_findings) after every leader round, from the watchdog's thread; an
        exception in it is reported once per round and never stops the watchdog."""
        self._subscribers.append(callback)

    def processes(self) -> list[RankProcess]:
        return [RankProcess(rank, tr.meta.get("pid"), float(tr.meta.get("started") or 0), tr.exit is not None)
                for rank, tr in list(self.node.traces.items())]

    def close(self) -> None:
        self.exchange.close()

    # -- one round --------------------------------------------------------------------------
    def _publish(self, snap: Snapshot, findings: list[Finding], new: list[Finding], now: float) -> None:
        self._view = View(snap, findings, list(self.findings), now)
        for callback in list(self._subscribers):
            try:
                callback(self._view, new)
            except Exception as exc:   # a subscriber must never stop the watchdog
                self.outputs.say(f"colltrace: watchdog subscriber failed (continuing): {exc!r}")

    def _summary(self) -> dict:
        summary = self.node.summary()
        if self.exchange.large and self.settings.straggler_share > 0:   # records stay here: who came last, digested
            summary["arrivals"] = arrivals.digest(summary["ranks"], summary["groups"])
        return summary

    def step(self) -> list[Finding]:
        """One period: read this host's ranks, exchange with the other hosts, judge (the leader):
        the findings new in it."""
        self.node.poll()
        now = time.time()
        summary = self._summary()
        others, wanted = self.exchange.exchange(summary, self.on_hang.act)
        if self.exchange.lost_leader is not None:
            others = others + [self.exchange.lost_leader]
        snap = merge([summary] + others, now)
        if self.leader:
            wanted, sample = self._suspects(snap, summary, others, now), self.latecomers.to_sample()
            self.exchange.want(wanted, snap, now, parts=[summary] + others, sample=sample)
        else:
            sample = self.exchange.sample_wanted
        if sample:
            self.node.ask_samples(sample)   # its own stragglers sample themselves (tracefile/samples.py)
        local = {r for r in self.node.traces if r in wanted}   # its own few, not every rank wanted
        self.node.sample(local)
        if local:
            self.node.refresh_stacks(local)
            summary = self._summary()
            snap = merge([summary] + others, now)
        if not self.leader:
            return []
        if self.aborted:   # after our own abort, ranks failing or vanishing are its doing, not findings
            self._publish(snap, list(self.findings), [], now)
            return []
        if self.settings.straggler_share > 0:   # records travel, or (a large job) digests of them
            for s in self.latecomers.update(snap, now):
                self.outputs.say(render_straggler_line(s))
        findings = self._judge(snap, summary, others, now)
        if findings is None:   # a large job whose wanted ranks are not all in full yet
            self._publish(snap, list(self.findings), [], now)
            return []
        if (self.settings.dashboard and self.dashboard is None
                and (self.exchange.store_address is None or 0 in self.node.traces)):
            self.dashboard = False   # on the host of rank 0 only, once; its imports take a second: off this loop
            threading.Thread(target=self.serve_dashboard, name="colltrace-dashboard-start", daemon=True).start()
        new = [f for f in findings if f.key not in self.reported]
        if new:
            for f in new:
                self.reported.add(f.key)
            self._supersede(new, findings)
            samekind.annotate(new)   # reads the user's source: after the (pure) analysis
            self.findings.extend(new)
            self.outputs.findings(new, self.findings, snap)
            self.exchange.publish_findings(self.findings)
        self._follow(findings, new, snap)
        self._publish(snap, findings, new, now)
        decision = self.on_hang.due(findings)
        if decision:
            why, key = decision
            self.exchange.report_hang(why)   # the other hosts act on it too
            self.on_hang.act(why, key)
        return new

    def _input_key(self, summary: dict, others: list[dict]) -> tuple | None:
        """What a large job's round reads, as a value to compare: this host's ranks (their
        heartbeats aside), the groups asked for, and the other hosts' tables by identity (a table
        is kept while its summary's bytes do not change: host/storelink.py). None on a small job."""
        if self.exchange.wants.every:   # every rank judged in full each round (a small job)
            return None
        own = {r: {k: v for k, v in e.items() if k != "heartbeat"} for r, e in summary["ranks"].items()}
        return (repr(sorted(own.items())), frozenset(self.exchange.wants.groups),
                tuple(id(o["ranks"]) for o in others))

    def _suspects(self, snap: Snapshot, summary: dict, others: list[dict], now: float) -> set[int]:
        """build.suspects of this round, on a large job kept while its input is unchanged, as
        _judge keeps its answer: at 16,384 ranks in a hang it reads every rank's records, 50 ms."""
        return self._suspected.get(self._input_key(summary, others), now, lambda: suspects(snap, now),
                                   [o["ranks"] for o in others])

    def _judge(self, snap: Snapshot, summary: dict, others: list[dict], now: float) -> list[Finding] | None:
        """The findings on this round's snapshot; None where a large job cannot be judged yet (the
        ranks the root asked for are not all in full: host/tree.py's judged). On a large job whose
        input did not change since the last round that judged it (every other host's summary the
        same table: host/storelink.py keeps it while its bytes do not change; this host's ranks
        and the groups asked for the same), that round's answer stands for REJUDGE_S: at 16,384
        ranks picking the judged ranks costs the root 60 ms and an analysis 60 more, which every
        round would make most of its CPU. Only time can change the answer then (a wait growing
        past a threshold, a host's beat ageing past lost_after), so it comes at most that late;
        where judging took longer (a hung job of 16,384 ranks: about a second), the unchanged input
        is judged again only after REJUDGE_SHARE of the time has gone to it, at most REJUDGE_MAX_S
        later: a hung job left hanging (COLLTRACE_ON_HANG=warn) does not keep the root busy."""
        def judge() -> list[Finding] | None:
            judged = self.exchange.wants.judgeable(snap)   # a large job: the ranks it asked for in full (host/tree.py)
            return None if judged is None else verdict.findings_of(judged, self.settings.stall_s, now)

        return self._judged.get(self._input_key(summary, others), now, judge, [o["ranks"] for o in others])

    def _supersede(self, new: list[Finding], findings: list[Finding]) -> None:
        """A stall (or unmatched p2p op) reported earlier that has now turned into something
        certain (a wait cycle, a mismatch, a dead rank) is marked superseded by it, in place in
        the findings reported (report.txt, the dashboard), and the new finding names it: the
        stall is not repeated, and its end is not announced as if the ranks had arrived."""
        current = {f.key for f in findings}
        for f in new:
            if f.kind not in CERTAIN_KINDS:
                continue
            ranks = set(f.ranks)
            old = [x for x in self.findings if x.kind in SUPERSEDABLE and not x.superseded_by
                   and x.key not in current and ranks & set(x.ranks)]
            for x in old:
                x.superseded_by = f.key   # in place: the watchdog owns both fields
                self._states.pop(x.key, None)
            if old:
                f.supersedes = [x.key for x in old]

    def _follow(self, findings: list[Finding], new: list[Finding], snap: Snapshot) -> None:
        """A stall already reported whose missing ranks changed from progressing to frozen (or
        back): say so in one line, and keep report.txt and snapshot.json current."""
        changed = []
        for f in findings:
            states = missing_states(f)
            key = f.key
            if not states or key not in self.reported:
                continue
            before = self._states.get(key)
            self._states[key] = states
            if f in new or before == states or any(x in (None, "unknown") for x in states.values()):
                continue   # unchanged, or no longer observed (ended): the report keeps what was seen
            self.findings = [f if x.key == key else x for x in self.findings]
            changed.append(f)
            self.stream.write(f"colltrace: update on {key}: {activity_lines(f)}\n")
        current = {f.key for f in findings}
        for key in [k for k in self._states if k not in current]:
            states = self._states.pop(key)
            if not new and not self.aborted:   # it ended without a problem taking its place
                was = ", ".join(f"rank {r} {s}" for r, s in states.items() if s)
                self.outputs.say(f"colltrace: {key} is over: the ranks it waited for arrived"
                                 + (f" (last seen: {was})" if was else ""))
        if changed:
            self.outputs.json(layout.SNAPSHOT, snap)
            try:
                self.outputs.report(self.findings, snap)
            except OSError:
                pass
            self.stream.flush()

    def serve_dashboard(self) -> None:
        """Whatever goes wrong costs one warning, never the watchdog or the job."""
        self.dashboard = False
        if self._start_dashboard is None:
            why = "it needs: pip install 'colltrace[dashboard]'"
        else:
            try:
                self.dashboard = self._start_dashboard(self)
                return
            except Exception as exc:   # a port taken, a dashboard bug: one warning, never the watchdog
                why = str(exc) or repr(exc)
        self.outputs.say(f"colltrace: warning: no dashboard: {why}")

    def _final(self) -> None:
        try:
            self.step()
        except Exception:   # a last round that fails (a store gone at exit): the final write still happens
            pass
        if self.node.traces:
            # without findings, a snapshot the folder cannot hold is no loss worth a line
            snap = merge([self.node.summary()], time.time())
            if self._view is not None and "clocks" in self._view.snapshot:   # the leader's: stragglers across hosts
                snap["clocks"] = self._view.snapshot["clocks"]
            self.outputs.json(layout.SNAPSHOT, snap, warn=bool(self.findings))
        self.close()

    def run(self, idle_exit_s: float = 600.0, stop=None, spawner: int | None = None) -> int:
        """stop: a threading.Event set by an embedding launcher (`colltrace run`) once its job ended.
        spawner: the rank that started this watchdog; if it is gone before any rank was seen
        (a later job took the files over first), there is nothing left to watch."""
        _yield_cpu()
        period = self.settings.poll_s
        while True:
            if stop is not None and stop.is_set():
                self._final()
                break
            try:
                self.step()
            except Exception as exc:  # keep watching: a bad round must not end the watchdog
                self.stream.write(f"colltrace: watchdog error (continuing): {exc!r}\n")
            if self.once:
                break
            if self.node.all_gone():
                time.sleep(period)
                self.node.poll()
                if self.node.all_gone():
                    self._final()
                    break
            elif not self.node.traces and (time.time() - self.node.first_seen > idle_exit_s
                                           or process_gone(spawner)):
                break
            time.sleep(period)
        return 1 if self.findings else 0

