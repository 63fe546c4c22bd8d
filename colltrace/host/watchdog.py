"""The watchdog: one process per host, outside the traced ranks.

It reads every local rank's ring (the ranks do nothing for it), watches their processes,
and — on the host that holds rank 0 — runs the analysis over the whole job, live. Other
hosts send it one compact summary per host through the job's TCPStore. It survives the
launcher tearing the workers down, writes its findings, and exits when the job is gone.

    python -m colltrace.host.watchdog --dir DIR --job JOB --host HOST
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from colltrace import config
from colltrace.host import meeting, probes, storelink
from colltrace.callsites import samekind
from colltrace.tracefile import storage
from colltrace.analysis import HANG_KINDS, analyze
from colltrace.reporters.text import render_report
from colltrace.reporters import text as report_mod
from colltrace.host.nodeview import NodeView, process_gone
from colltrace.model.snapshots import compact_entry, merge, suspects

STORE_RETRY_S = 5.0
LEADER_POLL_S = 0.5          # how often another host looks for the leader's announced address
LEADER_WAIT_S = 60.0         # then it says so once and judges its own ranks alone
LEADER_COPY_S = 1.0          # how often another host copies the leader's summary (its ranks, if its host dies)
LEADER_LINGER_S = 1.0        # the leader's server outlives its "ended" by this: the others read it first
WATCHDOG_NICE = 10            # scheduling priority of the watchdog's threads (0 = the ranks')


def _yield_cpu() -> None:
    """Run this thread (and the threads it starts) at a lower priority: where the ranks keep the
    cores busy the watchdog must not slow them; in a hang they wait, and the cores are its."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WATCHDOG_NICE)   # Linux: this thread
    except (AttributeError, OSError):
        pass


class Watchdog:
    """One per host. Every host publishes its summary to the store; the host holding rank 0
    (or the only host, when there is no store) is the leader and runs the global analysis."""

    def __init__(self, directory: str, job: str | None, host: str | None, settings: config.Settings,
                 once: bool = False, stream=None, store_address=None):
        self.settings = settings
        self.dir = directory
        self.node = NodeView(directory, job, host)
        self.reported: set[str] = set()
        self.findings: list[dict] = []
        self.stream = stream or sys.stderr
        self.once = once
        self.aborted = False
        self._dumped = False
        self._acted = False                # COLLTRACE_ON_HANG done (once per watchdog)
        self._states: dict[str, dict] = {}  # finding key -> its missing ranks' activity states, last said
        self.store_address = store_address   # (host, port) or None
        self.link: storelink.StoreLink | None = None
        self._store_warned = False
        self._write_warned = False
        self._store_next_try = 0.0
        self._published_at = 0.0
        self._wanted: set[int] = set()
        self._connecting: threading.Thread | None = None
        self.meeting: meeting.MeetingPoint | None = None   # the leader's own server (colltrace/host/meeting.py)
        self._leader_ended = False         # the leader said the job is over: its server goes away quietly
        self._leader_wait_since: float | None = None
        self._leader_copy: tuple[float, dict] | None = None   # (when, the leader's node summary)
        self.lost_leader: dict | None = None   # the leader's ranks, marked dead, once its host stopped answering
        self.latest: tuple | None = None   # (snapshot, findings, time) of the leader's last round: the dashboard's feed
        self.dashboard = None              # COLLTRACE_DASHBOARD: its server once started (False: failed)

    @property
    def leader(self) -> bool:
        # The host of rank 0 judges the whole job. Another host judges alone only when there is
        # no store to reach the leader through (none configured, or it failed): while its link is
        # still connecting it waits, or it would act on half the picture.
        if 0 in self.node.traces or self.store_address is None:
            return True
        return self.link is None and self._store_warned

    # -- the store ----------------------------------------------------------------------------
    def _link(self) -> storelink.StoreLink | None:
        """The store link, connected in the background: connecting imports torch (seconds),
        and this host's ranks are watched from their files meanwhile."""
        if self.store_address is None or self.link is not None or self._leader_ended:
            return self.link
        if self._connecting is None and time.time() >= self._store_next_try:
            def connect():
                try:
                    self._meet()
                except storelink.StoreError as exc:
                    self._store_down(exc)
                finally:
                    self._connecting = None

            self._connecting = threading.Thread(target=connect, name="colltrace-store", daemon=True)
            self._connecting.start()
        return None

    def _meet(self) -> None:
        """The host of rank 0 serves the meeting point and announces it in the job's store; the
        others look for that announcement (asking again until it is there, or rank 0 shows up
        here) and then talk only to the leader's server."""
        if 0 in self.node.traces:
            if self.meeting is None:
                self.meeting = meeting.MeetingPoint(*self.store_address)
            link = storelink.StoreLink(*self.meeting.address)
            link.node_index = int(link._store.add(storelink.PREFIX + "nodes", 1))   # 1: the others know it
            self.meeting.announce()
            self.link = link
            return
        found = meeting.find_leader(*self.store_address)
        if found is not None:
            self.link = storelink.StoreLink(*found)
            return
        now = time.time()
        self._leader_wait_since = self._leader_wait_since or now
        if now - self._leader_wait_since > LEADER_WAIT_S:
            raise storelink.StoreError(f"no leader announced in the job's store at "
                                       f"{self.store_address[0]}:{self.store_address[1]} after {LEADER_WAIT_S:.0f} s")
        self._store_next_try = now + LEADER_POLL_S   # not announced yet: ask again, quietly

    def close(self) -> None:
        """The job is over: tell the other hosts, then take the one key out of the job's store."""
        mp, self.meeting = self.meeting, None
        if mp is None:
            return
        if self.link is not None:
            try:
                self.link.report_end()
                time.sleep(LEADER_LINGER_S)
            except storelink.StoreError:
                pass
        mp.withdraw()

    def _store_down(self, exc: Exception) -> None:
        # The ranks never touch the store: losing it costs only the cross-host view. Say so once.
        if self.link is not None and self._leader_copy and self.lost_leader is None and not self.node.all_gone():
            # The leader's server went away without saying the job ended: its host died. Its
            # ranks, as last seen, are dead; this host judges what it can see from now on.
            seen = self._leader_copy[1]
            note = f"its host ({seen.get('host')}) stopped answering: the leader's meeting point at {self.link.address} is gone"
            self.lost_leader = dict(seen, ranks={r: dict(e, status="dead", died_at=time.time(),
                                                         exit={"signal": None, "note": note})
                                                 for r, e in seen["ranks"].items()})
            exc = storelink.StoreError(f"the leader's host ({seen.get('host')}, ranks "
                                       f"{report_mod.format_ranks(sorted(int(r) for r in seen['ranks']))}) stopped answering")
        self.link = None
        self._store_next_try = time.time() + STORE_RETRY_S
        if not self._store_warned:
            self._store_warned = True
            self.stream.write(f"colltrace: warning: {exc}; this host's ranks are still watched from their files\n")
            self.stream.flush()

    def _exchange(self, summary: dict) -> tuple[list[dict], set[int]]:
        """Publish this node's summary. The leader gets the other nodes' summaries; the others
        get the ranks whose live stacks the leader wants, and its abort request."""
        link = self._link()
        if link is None:
            return [], set()
        try:
            now = time.time()
            if now - self._published_at >= storelink.PUBLISH_S:
                link.publish_node({**summary, "ranks": {r: compact_entry(e) for r, e in summary["ranks"].items()}})
                self._published_at = now
            if self.leader:
                return link.node_summaries(skip=link.node_index), set()
            why = link.hang_reported()
            if why:
                self._on_hang(why)
            if link.leader_ended():
                self._leader_ended, self.link = True, None
                return [], set()
            if self._leader_copy is None or now - self._leader_copy[0] >= LEADER_COPY_S:
                copy = link.node_summary(1)
                if copy is not None:
                    self._leader_copy = (now, copy)
            return [], link.wanted_stacks()
        except storelink.StoreError as exc:
            self._store_down(exc)
            return [], set()

    def _want(self, wanted: set[int]) -> None:
        if self.link is not None and wanted != self._wanted:
            try:
                self.link.set_wanted_stacks(wanted)
                self._wanted = wanted
            except storelink.StoreError as exc:
                self._store_down(exc)

    # -- output ---------------------------------------------------------------------------
    def _write_failed(self, exc: OSError) -> None:
        # A full or read-only folder: the findings still reach stderr (and the store); say so once.
        if not self._write_warned:
            self._write_warned = True
            self.stream.write(f"colltrace: warning: cannot write to {self.dir}: {storage.describe(exc)}; "
                              "findings go to this output only\n")
            self.stream.flush()

    def _emit(self, new: list[dict], snap: dict) -> None:
        try:
            with open(os.path.join(self.dir, "findings.jsonl"), "a") as f:
                for finding in new:
                    f.write(json.dumps(finding, default=str) + "\n")
            self._write_json("snapshot.json", snap)
            with open(os.path.join(self.dir, "report.txt"), "w") as f:
                f.write(render_report(self.findings))
        except OSError as exc:
            self._write_failed(exc)
        for finding in new:
            text = report_mod.paragraph(finding)
            classes = report_mod.render_stack_classes(finding)
            self.stream.write("\n" + text + "\n" + (classes + "\n" if classes else ""))
        self.stream.write(f"colltrace: details in {self.dir}/report.txt; run: colltrace analyze {self.dir}\n")
        self.stream.flush()
        if self.link is not None:
            try:
                self.link.publish_findings(self.findings)
            except storelink.StoreError as exc:
                self._store_down(exc)

    def _write_json(self, name: str, obj, warn: bool = True) -> None:
        tmp = os.path.join(self.dir, f".{name}.tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(obj, f, default=str)
            os.replace(tmp, os.path.join(self.dir, name))
        except OSError as exc:   # the previous version stays whole
            if warn:
                self._write_failed(exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _dump_all_stacks(self) -> None:
        for rank, pid in self.node.pids().items():
            text = probes.dump_text(self.dir, rank, pid, self.node.traces[rank].meta)
            try:
                with open(os.path.join(self.dir, f"rank-{rank:05d}.stacks.txt"), "w") as f:
                    f.write(text)
            except OSError as exc:
                self._write_failed(exc)

    def _on_hang(self, why: str) -> None:
        """COLLTRACE_ON_HANG on this host's ranks, once: dump their stacks; abort: end them too."""
        if self.settings.on_hang in ("dump", "abort") and not self._dumped:
            self._dumped = True
            self._dump_all_stacks()
        if self.settings.on_hang == "abort" and not self.aborted:
            self._abort(why)

    def _abort(self, why: str) -> None:
        self.aborted = True
        pids = self.node.pids()
        self.stream.write(f"colltrace: COLLTRACE_ON_HANG=abort ({why}): ending ranks {report_mod.format_ranks(sorted(pids))}\n")
        self.stream.flush()
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    # -- one round --------------------------------------------------------------------------
    def step(self) -> list[dict]:
        self.node.poll()
        now = time.time()
        summary = self.node.summary()
        others, wanted = self._exchange(summary)
        if self.lost_leader is not None:
            others = others + [self.lost_leader]
        snap = merge([summary] + others, now)
        if self.leader:
            wanted = suspects(snap, now)
            self._want(wanted)
        local = {r for r in wanted if r in self.node.traces}
        self.node.sample(local)
        if local:
            self.node.refresh_stacks(local)
            summary = self.node.summary()
            snap = merge([summary] + others, now)
        if not self.leader:
            return []
        if self.aborted:   # after our own abort, ranks failing or vanishing are its doing, not findings
            self.latest = (snap, list(self.findings), now)
            return []
        findings = analyze(snap, stall_s=self.settings.stall_s, now=now)
        self.latest = (snap, findings, now)
        if self.settings.dashboard and self.dashboard is None and (self.store_address is None or 0 in self.node.traces):
            self.dashboard = False   # on the host of rank 0 only, once; its imports take a second: off this loop
            threading.Thread(target=self.start_dashboard, name="colltrace-dashboard-start", daemon=True).start()
        new = [f for f in findings if f.get("key") not in self.reported]
        if new:
            for f in new:
                self.reported.add(f.get("key"))
            samekind.annotate(new)   # reads the user's source: after the (pure) analysis
            self.findings.extend(new)
            self._emit(new, snap)
        self._follow(findings, new, snap)
        # Certain hangs are acted on at once; a stall only once every rank it waits for is frozen
        # (or after COLLTRACE_ABORT_STALL_S): a rank still computing is reported, never killed.
        due = [(f, why) for f in findings if f.get("kind") in HANG_KINDS   # duplicate data is no hang
               for ok, why in [probes.act_on(f, self.settings.on_hang, self.settings.abort_stall_s)] if ok]
        if due and not self._acted:
            self._acted = True
            why = due[0][1]
            if self.link is not None:   # the other hosts act on it too
                try:
                    self.link.report_hang(why)
                except storelink.StoreError as exc:
                    self._store_down(exc)
            self._on_hang(why)
        return new

    def _follow(self, findings: list[dict], new: list[dict], snap: dict) -> None:
        """A stall already reported whose missing ranks changed from progressing to frozen (or
        back): say so in one line, and keep report.txt and snapshot.json current."""
        changed = []
        for f in findings:
            states = probes.missing_states(f)
            key = f.get("key")
            if not states or key not in self.reported:
                continue
            before = self._states.get(key)
            self._states[key] = states
            if f in new or before == states or any(x in (None, "unknown") for x in states.values()):
                continue   # unchanged, or no longer observed (ended): the report keeps what was seen
            self.findings = [f if x.get("key") == key else x for x in self.findings]
            changed.append(f)
            self.stream.write(f"colltrace: update on {key}: {report_mod.activity_lines(f)}\n")
        current = {f.get("key") for f in findings}
        for key in [k for k in self._states if k not in current]:
            states = self._states.pop(key)
            if not new and not self.aborted:   # it ended without a problem taking its place
                was = ", ".join(f"rank {r} {s}" for r, s in states.items() if s)
                self.stream.write(f"colltrace: {key} is over: the ranks it waited for arrived"
                                  + (f" (last seen: {was})" if was else "") + "\n")
                self.stream.flush()
        if changed:
            self._write_json("snapshot.json", snap)
            with open(os.path.join(self.dir, "report.txt"), "w") as fh:
                fh.write(render_report(self.findings))
            self.stream.flush()

    def start_dashboard(self) -> None:
        """Serve the live dashboard from a thread of this process (colltrace_dashboard, an optional
        extra). Whatever goes wrong costs one warning, never the watchdog or the job."""
        self.dashboard = False
        try:
            from colltrace_dashboard.server import start_for_watchdog

            self.dashboard = start_for_watchdog(self)
            return
        except ImportError:
            why = "it needs: pip install 'colltrace[dashboard]'"
        except Exception as exc:
            why = str(exc) or repr(exc)
        self.stream.write(f"colltrace: warning: no dashboard: {why}\n")
        self.stream.flush()

    def _final(self) -> None:
        try:
            self.step()
        except Exception:
            pass
        if self.node.traces:
            # without findings, a snapshot the folder cannot hold is no loss worth a line
            self._write_json("snapshot.json", merge([self.node.summary()], time.time()), warn=bool(self.findings))
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m colltrace.host.watchdog")
    p.add_argument("--dir", required=True)
    p.add_argument("--job")
    p.add_argument("--host")
    p.add_argument("--spawned-by", type=int)
    p.add_argument("--once", action="store_true")
    args = p.parse_args(argv)
    settings = config.load()
    os.makedirs(args.dir, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    try:
        address = storelink.address_from_env()
    except storelink.StoreError as exc:
        sys.stderr.write(f"colltrace: warning: COLLTRACE_STORE: {exc}; watching without the store\n")
        address = None
    wd = Watchdog(args.dir, args.job, args.host, settings, once=args.once, store_address=address)
    try:
        return wd.run(spawner=args.spawned_by)
    finally:   # SIGTERM too: never leave our key in the job's store
        wd.close()


if __name__ == "__main__":
    sys.exit(main())
