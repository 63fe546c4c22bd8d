"""Hosts of a large job without the job: the watchdogs' real exchange (host/leader.py,
host/tree.py, real c10d stores) and the leader's real round (host/watchdog.py), fed with
synthetic rank states instead of trace files. For benchmarks/scale_live.py and the exchange's
tests: many hosts in few processes.

The synthetic job: RANKS_PER_HOST ranks a host, a world group ("0") and one group per host,
all ranks running world all_reduces. At `hang_at` the seeds' hang: every rank but CULPRIT
enters the next world all_reduce and waits; CULPRIT waits in a broadcast on a group of two with
PARTNER, which is in that all_reduce: a certain cross-group deadlock from that moment.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

from colltrace import config
from colltrace.host import storelink
from colltrace.host.leader import Exchange
from colltrace.host.watchdog import Watchdog
from colltrace.model.schema import COMPLETED

if TYPE_CHECKING:
    from colltrace.host.nodeview import NodeView

RANKS_PER_HOST = 8
FRESH_S = 1.5          # run_host: a rank whose beat the leader saw this recently is "fresh"
STEP_S = 0.05          # a world all_reduce every 50 ms while healthy
PAIR = "pair"
ROOTS = {"stdlib": ["/usr/lib/python3.11"], "site": ["/venv/lib/python3.11/site-packages"],
         "torch": ["/venv/lib/python3.11/site-packages/torch"], "colltrace": [], "user_packages": []}


def _frames(line: int, func: str) -> list[dict]:
    return [{"file": "/job/train.py", "line": 900, "func": "main"},
            {"file": "/job/train.py", "line": line, "func": func},
            {"file": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 2501,
             "func": "all_reduce"}]


class Job:
    """late: {rank: seconds} a rank enters every world all_reduce behind the others (a straggler);
    history: completed records a rank's entry holds (its recent window)."""

    def __init__(self, ranks: int, t0: float, hang_at: float | None, late: dict | None = None, history: int = 1):
        self.ranks, self.t0, self.hang_at = ranks, t0, hang_at
        self.culprit = ranks - 3 if ranks > 4 else ranks - 1
        self.partner = 0 if self.culprit != 0 else 1
        self.late, self.history = dict(late or {}), history

    def hosts(self) -> int:
        return -(-self.ranks // RANKS_PER_HOST)

    def host_ranks(self, index: int) -> list[int]:
        return list(range((index - 1) * RANKS_PER_HOST, min(self.ranks, index * RANKS_PER_HOST)))

    def groups(self, index: int) -> dict:
        mine = self.host_ranks(index)
        g = {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(self.ranks))},
             f"h{index}": {"name": f"h{index}", "desc": "host", "ranks": mine}}
        if self.culprit in mine or self.partner in mine:
            g[PAIR] = {"name": PAIR, "desc": "teacher", "ranks": sorted({self.partner, self.culprit})}
        return g

    def entry(self, rank: int, index: int, now: float) -> dict:
        hung = self.hang_at is not None and now >= self.hang_at
        t = min(now, self.hang_at) if self.hang_at is not None else now
        step = int((t - self.t0) / STEP_S)
        progress = {"0": {"entered": step, "completed": step}, f"h{index}": {"entered": 3, "completed": 3}}
        lag, done = self.late.get(rank, 0.0), max(self.late.values(), default=0.0) + 0.001
        records = [{"id": s, "rank": rank, "group": "0", "seq": s, "seq_end": s, "op": "all_reduce",
                    "backend_op": "allreduce", "p2p": False, "peer": None, "state": COMPLETED, "async": False,
                    "entered_at": self.t0 + s * STEP_S + lag, "returned_at": self.t0 + s * STEP_S + done,
                    "completed_at": self.t0 + s * STEP_S + done, "shapes": [[1024]], "dtypes": ["float32"],
                    "reduce_op": "SUM", "root": None, "count": 1, "thread": "MainThread",
                    "frames": _frames(120, "train_step")} for s in range(max(1, step - self.history + 1), step + 1)]
        if rank in (self.culprit, self.partner):
            progress[PAIR] = {"entered": 0, "completed": 0}
        if hung:
            if rank == self.culprit:
                progress[PAIR] = {"entered": 1, "completed": 0}
                records.append(dict(records[-1], id=step + 1, group=PAIR, seq=1, seq_end=1, op="broadcast",
                                    backend_op="broadcast", state="waiting", root=self.partner, reduce_op=None,
                                    entered_at=self.hang_at, returned_at=None, completed_at=None,
                                    frames=_frames(412, "serve_teacher")))
            else:
                progress["0"] = {"entered": step + 1, "completed": step}
                records.append(dict(records[-1], id=step + 1, seq=step + 1, seq_end=step + 1, state="waiting",
                                    entered_at=self.hang_at, returned_at=None, completed_at=None,
                                    frames=_frames(233, "save_checkpoint")))
        return {"rank": rank, "pid": 10000 + rank, "host": f"node{index}", "status": "alive", "exit": None,
                "roots": ROOTS, "died_at": None, "heartbeat": now, "error": None, "progress": progress,
                "records": records, "stack": None, "stack_at": None, "fault": None}


class SimNode:
    """What the watchdog reads of its host (NodeView's surface), from the synthetic job."""

    def __init__(self, job: Job, index: int):
        self.job, self.index = job, index
        self.host = f"node{index}"
        self.traces = {r: None for r in job.host_ranks(index)}
        self.died_at: dict = {}
        self.first_seen = time.time()
        self._groups = job.groups(index)
        self._entries: tuple | None = None   # ((step, hung), entries) of the job's current step

    def poll(self) -> list[int]:
        return []

    def all_gone(self) -> bool:
        return False

    def summary(self) -> dict:
        now = time.time()
        # The ranks' entries change with the job's step (or the hang), not each round: built once
        # a step, so that a process simulating hundreds of hosts spends its time in the exchange.
        hang = self.job.hang_at
        t = min(now, hang) if hang is not None else now
        key = (int((t - self.job.t0) / STEP_S), hang is not None and now >= hang)
        if self._entries is None or self._entries[0] != key:
            self._entries = (key, {str(r): self.job.entry(r, self.index, now) for r in self.traces})
        return {"host": self.host, "t": now, "groups": self._groups,
                "ranks": {r: dict(e, heartbeat=now) for r, e in self._entries[1].items()}}

    def sample(self, ranks) -> None:
        pass

    def ask_samples(self, ranks) -> None:
        pass

    def refresh_stacks(self, ranks, native=False, force=False) -> None:
        pass


CLIENTS = storelink.SharedClients()   # this process's hosts' clients


def host_watchdog(job: Job, index: int, store_address, directory: str, stream, fan: int,
                  env: dict | None = None) -> Watchdog:
    """The real watchdog of host `index`, its trace folder replaced by the synthetic job. env: more
    COLLTRACE_* settings."""
    settings = config.load({"COLLTRACE_ON_HANG": "warn", **(env or {})})
    wd = Watchdog(directory, "sim", f"node{index}", settings, stream=stream, store_address=store_address)
    wd.node = wd.on_hang.node = cast("NodeView", SimNode(job, index))   # NodeView's surface, not its class
    # hundreds of hosts' connects in one process share clients; they share one clock too
    wd.exchange = Exchange(wd.node, store_address, stream, place=(index, job.hosts()), fan=fan, connect=CLIENTS,
                        clocks=False)
    return wd


def run_host(index: int, ranks: int, fan: int, port: int, t0: float, hang_at, stop, out, culprit=None,
             partner=None, detail_all=None, period: float = 0.1, late=None, env=None) -> None:
    """One simulated host in a process of its own (the exchange's tests): steps its real watchdog
    until `stop` is set; puts ("finding", index, kind, key, ranks) for what it reports as the
    leader, ("said", index, text) for what it writes, ("fresh", index, ranks) as the leader whenever
    the ranks whose beats it saw within FRESH_S change, and ("copied", index) once it holds a copy
    of the leader's summary: what tests wait for instead of sleeping."""
    import io
    import os
    import tempfile

    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    from colltrace.host import tree

    if detail_all is not None:
        tree.DETAIL_ALL_RANKS = detail_all
    job = Job(ranks, t0, None, late=late, history=48 if late else 1)   # 2.4 s of records: digests' window
    if culprit is not None:
        job.culprit, job.partner = culprit, partner
    stream = io.StringIO()
    wd = host_watchdog(job, index, ("127.0.0.1", port), tempfile.mkdtemp(prefix=f"ct-host{index}-"), stream, fan,
                       env=env)
    said, fresh, copied = 0, None, False
    while not stop.value:
        start = time.time()
        job.hang_at = hang_at.value or None
        try:
            for f in wd.step():
                out.put(("finding", index, f.kind, f.key, sorted(int(r) for r in f.ranks)))
            view = wd.view() if wd.leader else None
            if view is not None:
                now = time.time()
                seen = sorted(int(r) for r, e in view.snapshot["ranks"].items()
                              if isinstance(e, dict) and now - (e.get("heartbeat") or 0) < FRESH_S)
                if seen != fresh:
                    fresh = seen
                    out.put(("fresh", index, seen))
            if not copied and wd.exchange.leader_copy_at is not None:
                copied = True
                out.put(("copied", index))
        except Exception as exc:   # a bad round (a store reply, a host gone): said, the next round runs
            out.put(("said", index, f"step failed: {exc!r}"))
        text = stream.getvalue()
        if len(text) > said:
            out.put(("said", index, text[said:]))
            said = len(text)
        time.sleep(max(0.0, period - (time.time() - start)))
    wd.close()
