"""Prometheus metrics for /metrics, derived from the dashboard's readings (one process per job
serves them, not each rank).

Counters only ever go up: each record (per rank, per process incarnation, by record id) and each
finding (by key) is counted once, however often it is seen again in later snapshots. Records
are counted as the dashboard sees them: a rank that runs more collectives between two reads than
the recent window holds (64 per rank from a folder, 4 completed per node publish from the store)
is undercounted there, while colltrace_group_last_seq, read from the backend's own numbering, is
exact.
"""
from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from colltrace.analysis.stragglers import NOISE_S
from colltrace.model.schema import ALIVE, COMPLETED, IN_FLIGHT, WAITING

# The *_created series would double the output for no use here (this process serves nothing else).
prometheus_client.disable_created_metrics()

DURATION_BUCKETS = (1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 60.0, 600.0)
LAG_BUCKETS = (1e-3, 5e-3, 0.02, 0.05, 0.1, 0.5, 2.0, 10.0)
PENDING = (WAITING, IN_FLIGHT)


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.collectives = Counter("colltrace_collectives", "Collective calls recorded, summed over ranks "
                                   "(each record counted once; untraced ones by their count)",
                                   ["group", "op"], registry=r)
        self.duration = Histogram("colltrace_collective_duration_seconds",
                                  "Time from entering a collective to its completion, per completed record",
                                  ["op"], buckets=DURATION_BUCKETS, registry=r)
        self.in_flight = Gauge("colltrace_collectives_in_flight",
                               "Collectives entered and not complete (waiting or in flight), summed over ranks",
                               ["group"], registry=r)
        self.group_seq = Gauge("colltrace_group_last_seq", "Highest collective number any member of the group "
                               "has entered or completed (the backend's numbering: exact)", ["group", "stage"],
                               registry=r)
        self.last_progress = Gauge("colltrace_rank_last_progress_timestamp_seconds",
                                   "Unix time of the rank's latest collective event (entered, returned or completed)",
                                   ["rank"], registry=r)
        self.heartbeat = Gauge("colltrace_rank_heartbeat_timestamp_seconds",
                               "Unix time of the rank's latest heartbeat (written by its recorder)", ["rank"],
                               registry=r)
        self.alive = Gauge("colltrace_rank_alive", "1 while the rank's process runs, 0 once it is gone", ["rank"],
                           registry=r)
        self.findings = Counter("colltrace_findings", "Problems found, by kind (each counted once)", ["kind"],
                                registry=r)
        self.hang = Gauge("colltrace_hang_suspected", "1 while the current analysis holds a finding, else 0",
                          registry=r)
        self.source_up = Gauge("colltrace_source_up", "1 when the last read of the job's state succeeded", registry=r)
        self.wait_caused = Counter("colltrace_wait_caused_seconds", "Time the other members of a collective waited "
                                   "for this rank, which came last (its lag behind each of them, summed)", ["rank"],
                                   registry=r)
        self.arrival_lag = Histogram("colltrace_arrival_lag_seconds", "How long after the first member of a "
                                     "collective this rank entered it", ["rank"], buckets=LAG_BUCKETS, registry=r)
        self.snapshot_time = Gauge("colltrace_snapshot_timestamp_seconds", "Unix time the shown state describes",
                                   registry=r)
        self._counted: dict[str, tuple] = {}     # rank -> (incarnation, ids counted, ids timed)
        self._groups: set[str] = set()
        self._findings: set[str] = set()

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def update(self, reading, arrivals=()) -> None:
        """`arrivals`: the collectives every member entered that this reading added (each once)."""
        snap = reading.snap
        for a in arrivals:
            for rank, lag in a.lags().items():
                self.arrival_lag.labels(str(rank)).observe(lag)
            if a.lag_s >= NOISE_S:
                self.wait_caused.labels(str(a.last)).inc(a.waited_s)
        in_flight = dict.fromkeys(self._groups, 0)
        seq: dict[str, list[int]] = {}
        for rank, entry in (snap.get("ranks") or {}).items():
            if not isinstance(entry, dict):
                continue
            rank = str(rank)
            self.alive.labels(rank).set(1 if entry.get("status") == ALIVE else 0)
            if isinstance(entry.get("heartbeat"), (int, float)) and entry["heartbeat"]:
                self.heartbeat.labels(rank).set(entry["heartbeat"])
            records = [x for x in entry.get("records") or [] if isinstance(x, dict)]
            self._count(rank, entry, records)
            last = max((t for x in records for t in (x.get("entered_at"), x.get("returned_at"), x.get("completed_at"))
                        if isinstance(t, (int, float))), default=None)
            if last is not None:
                self.last_progress.labels(rank).set(last)
            for x in records:
                if x.get("state") in PENDING:
                    g = str(x.get("group"))
                    in_flight[g] = in_flight.get(g, 0) + 1
            for g, p in (entry.get("progress") or {}).items():
                if isinstance(p, dict):
                    top = seq.setdefault(str(g), [0, 0])
                    top[0] = max(top[0], int(p.get("entered") or 0))
                    top[1] = max(top[1], int(p.get("completed") or 0))
        for g in snap.get("groups") or {}:
            in_flight.setdefault(str(g), 0)
        for g, n in in_flight.items():
            self.in_flight.labels(g).set(n)
            self._groups.add(g)
        for g, (entered, completed) in seq.items():
            self.group_seq.labels(g, "entered").set(entered)
            self.group_seq.labels(g, "completed").set(completed)
        for f in list(reading.findings) + list(reading.reported):
            key = str(f.key or f.summary or "")
            if key and key not in self._findings:
                self._findings.add(key)
                self.findings.labels(str(f.kind or "unknown")).inc()
        self.hang.set(1 if reading.findings else 0)
        self.snapshot_time.set(reading.now)

    def _count(self, rank: str, entry: dict, records: list[dict]) -> None:
        incarnation = (entry.get("pid"), entry.get("job"))
        prev = self._counted.get(rank)
        counted, timed = (prev[1], prev[2]) if prev and prev[0] == incarnation else (set(), set())
        ids = set()
        for x in records:
            rid = x.get("id")
            if rid is None:
                continue
            ids.add(rid)
            op = str(x.get("op") or "unknown")
            if rid not in counted:
                counted.add(rid)
                count = x.get("count")
                n = count if x.get("op") == "untraced" and isinstance(count, int) else 1
                self.collectives.labels(str(x.get("group")), op).inc(n)
            done, entered = x.get("completed_at"), x.get("entered_at")
            if (rid not in timed and x.get("state") == COMPLETED and op != "untraced"
                    and isinstance(done, (int, float)) and isinstance(entered, (int, float))):
                timed.add(rid)
                self.duration.labels(op).observe(max(0.0, done - entered))
        # Records leave the window for good: forget their ids, keep the memory bounded.
        self._counted[rank] = (incarnation, counted & ids, timed & ids)

    def source_failed(self) -> None:
        self.source_up.set(0)

    def source_ok(self) -> None:
        self.source_up.set(1)
