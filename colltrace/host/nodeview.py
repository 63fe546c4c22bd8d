"""What one host sees of its own ranks: their trace files, whether their processes live, their
live stacks and CPU samples, and each rank's snapshot entry built from them."""
from __future__ import annotations

import os
import time
from typing import cast

from colltrace.host import activity, probes
from colltrace.model import build
from colltrace.tracefile import asks, reader, samples

SUMMARY_RECORDS = 64          # recent records per rank sent to the analysis (open ones always)
STACK_REFRESH_S = 1.0       # a suspect's stack is sampled this often: progress over time
FR_WAIT_S = 0.5               # how long a round waits for the Flight Recorder answers it asked for
NATIVE_BEFORE_S = 2.0         # a suspect's native frames are taken from this long before a stall is due


def process_gone(pid: int | None) -> bool:
    if not pid:
        return False
    import psutil

    try:
        p = psutil.Process(pid)
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class NodeView:
    """Everything this host can see: its ranks' files, processes and live stacks."""

    def __init__(self, directory: str, job: str | None, host: str | None):
        self.dir = directory
        self.job = job
        self.host = host
        self.traces: dict[int, reader.RankTrace] = {}
        self.ignored: set[int] = set()
        self.died_at: dict[int, float] = {}
        self.live_stacks: dict[int, tuple] = {}   # rank -> (taken at, frames, route, why others failed)
        self.activity: dict[int, activity.Activity] = {}   # ranks others wait for: CPU and stack samples
        self.first_seen = time.time()
        self.replaced: set[int] = set()   # ranks whose files a later job in this folder took over
        self._ignored_files: dict[int, int | None] = {}   # rank -> inode of the other job's ring file
        self._samples_asked: dict[int, float] = {}  # rank -> when it was last asked for stack samples

    def discover(self) -> None:
        try:
            files = reader.rank_files(self.dir)
        except reader.TraceError:
            return
        for rank, path in files.items():
            if rank in self.traces:
                continue
            if rank in self.ignored:
                # another job's file: looked at again once it is replaced (this job's rank may
                # start after the watchdog did, in a folder the previous job left behind)
                seen = self._ignored_files.get(rank)
                if seen is None or seen == _inode(path):
                    continue
                self.ignored.discard(rank)
            tr = reader.RankTrace(self.dir, rank, window=SUMMARY_RECORDS * 4)
            tr.poll()
            if not tr.meta:
                continue  # its meta line is not written yet: next round
            if (self.job and tr.meta.get("job") != self.job) or (self.host and tr.meta.get("host") != self.host):
                self.ignored.add(rank)  # another job's or another host's rank
                self._ignored_files[rank] = tr.ring._ino
                continue
            self.traces[rank] = tr

    def poll(self) -> list[int]:
        """Read new events and check liveness; returns ranks newly found gone."""
        self.discover()
        newly_gone = []
        now = time.time()
        for rank, tr in list(self.traces.items()):
            tr.poll()
            if self.job and tr.meta and tr.meta.get("job") != self.job:
                # A later job (the next test of a session, say) reuses this folder and rank
                # number: this job's rank is gone, and the new file is not ours to read.
                del self.traces[rank]
                self.died_at.pop(rank, None)
                self.live_stacks.pop(rank, None)
                self.ignored.add(rank)
                self._ignored_files[rank] = tr.ring._ino
                self.replaced.add(rank)
                continue
            if rank not in self.died_at and process_gone(tr.meta.get("pid")):
                self.died_at[rank] = now
                tr.poll()  # whatever it wrote last
                newly_gone.append(rank)
        return newly_gone

    def all_gone(self) -> bool:
        return bool(self.traces or self.replaced) and len(self.died_at) == len(self.traces)

    def entry(self, rank: int) -> dict:
        tr = self.traces[rank]
        act = self.activity.get(rank)
        return build.host_entry(tr.snapshot_entry(samples_since=time.time() - samples.SEND_S),
                                keep_records=SUMMARY_RECORDS, died_at=self.died_at.get(rank),
                                live_stack=self.live_stacks.get(rank), last_event_t=tr.last_event_t,
                                activity=act.classify() if act is not None and act.procs else None)

    def summary(self) -> dict:
        return {"host": self.host_name(), "t": time.time(), "groups": reader.groups_of(self.traces.values()),
                "ranks": {str(r): self.entry(r) for r in self.traces}}

    def refresh_stacks(self, ranks, native=False, force=False) -> None:
        now = time.time()
        due = []
        native_due = self._native_due(((r, self.traces[r]) for r in ranks if r in self.traces), now)
        for rank in sorted(ranks):
            tr = self.traces.get(rank)
            if tr is None or rank in self.died_at:
                continue
            have = self.live_stacks.get(rank)
            if (have and not force and now - have[0] < STACK_REFRESH_S and have[0] >= tr.last_event_t
                    and (rank not in native_due or have[4] is not None)):
                continue   # fresh, and the rank has not moved since (nor are its native frames due)
            due.append((rank, tr))
        # What they entered untraced (DDP's all-reduces): their Flight Recorders, answered by each
        # rank's own poller thread while py-spy reads the stacks below. All asked first.
        for rank, _ in due:
            try:
                asks.request_fr(self.dir, rank)
            except OSError:
                pass
        # the meta line, and whether colltrace's handler on the stack signal writes native frames
        # (a rank's meta line carries its pid)
        got = probes.live_stacks(self.dir, {rank: (cast(int, tr.meta.get("pid")), dict(tr.meta, native_stack=bool(
                                     tr.native_info.get("native_stack")))) for rank, tr in due},
                                 with_native=native_due)
        for rank, (frames, route, why, native_frames) in got.items():
            if frames is not None:
                # [] once asked for: not asked again before the next refresh
                self.live_stacks[rank] = (now, frames, route, why,
                                          native_frames or ([] if rank in native_due else None))
                act = self.activity.get(rank)
                if act is not None:
                    act.add_stack(now, frames)
            else:
                self.live_stacks[rank] = (0.0, None, None, why, None)
        # Judge on every asked rank's answer, not on whichever came first: a finding made from
        # half the answers would name half the ranks. A rank that cannot answer (hung with the
        # GIL held, dead) costs at most FR_WAIT_S.
        deadline = time.monotonic() + FR_WAIT_S
        pending = [rank for rank, _ in due]
        while pending and time.monotonic() < deadline:
            pending = [r for r in pending
                       if not asks.fr_answered(self.dir, r) and not process_gone(self.traces[r].meta.get("pid"))]
            if pending:
                time.sleep(0.02)

    def _native_due(self, due, now: float) -> set[int]:
        """The ranks whose main thread's native frames to take in-process: those others have
        waited for almost the job's stall threshold (a stall finding is near, a few rounds
        away; taking them signals the rank's main thread, not done on every look at a late rank)."""
        out = set()
        for rank, tr in due:
            act = self.activity.get(rank)
            stall_s = tr.meta.get("stall_s")
            if (act is not None and isinstance(stall_s, (int, float)) and tr.native_info.get("native_stack")
                    and now - act.since >= max(float(stall_s) - NATIVE_BEFORE_S, 0.0)):
                out.add(rank)
        return out

    def sample(self, ranks) -> None:
        """CPU time (every round) of the ranks others wait for, from when they became suspects or
        last did something traced: the evidence that tells a slow rank from a hung one."""
        for rank in list(self.activity):
            if rank not in ranks:
                del self.activity[rank]
        now = time.time()
        for rank in ranks:
            tr = self.traces.get(rank)
            if tr is None or rank in self.died_at:
                continue
            act = self.activity.get(rank)
            if act is None or act.since < tr.last_event_t:
                act = self.activity[rank] = activity.Activity(now)
            act.add_process(activity.sample_process(tr.meta.get("pid")))

    def ask_samples(self, ranks) -> None:
        """Ask those of these ranks that are this host's to sample their own stacks (stragglers);
        asked again before a request's time runs out, for as long as the leader wants it."""
        now = time.time()
        for rank in ranks:
            if rank not in self.traces or rank in self.died_at:
                continue
            if now - self._samples_asked.get(rank, 0.0) >= samples.ASK_FOR_S / 2:
                try:
                    samples.ask(self.dir, rank)
                    self._samples_asked[rank] = now
                except OSError:   # a full folder: no samples, the call site stands in
                    pass

    def host_name(self) -> str | None:
        """This host's name as its ranks recorded it (the watchdog may be started without one)."""
        return self.host or next((tr.meta.get("host") for tr in self.traces.values() if tr.meta.get("host")), None)

    def pids(self) -> dict[int, int]:
        return {r: pid for r, tr in self.traces.items() if (pid := tr.meta.get("pid")) and r not in self.died_at}
