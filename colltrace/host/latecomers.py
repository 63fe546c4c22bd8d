"""Who makes everyone wait, live: the leader's (and the dashboard's) sliding window over the
collectives every member has entered (analysis/stragglers.py's arrivals), judged as the
post-mortem judges a folder, and which stragglers are due a line on stderr.

Nothing here runs on the ranks: it reads the records the hosts' summaries already carry (on a job
of up to tree.DETAIL_ALL_RANKS ranks every rank's recent records travel each round; past that each
host sends digests of its ranks' arrivals instead, model/arrivals.py, and a straggler's entry goes
up in full once it is asked to sample itself). A straggler is never a finding: no abort, no exit code.
"""
from __future__ import annotations

from colltrace.analysis import stragglers
from colltrace.model.schema import Snapshot

LOOK_EVERY_S = 0.5     # the records a summary carries span about 64 collectives: read them this often
JUDGE_EVERY_S = 2.0
REPEAT_S = 300.0       # a rank still late is said again after this long, not every round
SAMPLES_GRACE_S = 2 * JUDGE_EVERY_S   # a straggler's line waits this long for its stack samples


class Latecomers:
    """The stragglers of the last `window_s` seconds. `update` returns those due a line now: a
    rank whose late share of the window is at least `share`, over a window at least half full, not
    said within REPEAT_S."""

    def __init__(self, share: float = 0.1, window_s: float = 60.0):
        self.share, self.window_s = share, window_s
        self._arrivals: dict[tuple[str, int], stragglers.Arrival] = {}
        self._looked = 0.0
        self._judged = 0.0
        self._said: dict[int, float] = {}
        self._sampling_since: dict[int, float] = {}   # rank -> when it was first judged late (its samples asked)
        self.current: list[dict] = []     # the stragglers of the window, as judged last
        self.sampled: dict[int, stragglers.Sampled] = {}   # their stack samples over the window
        self.new: list[stragglers.Arrival] = []   # the collectives the last look added

    def look(self, snap: Snapshot, now: float) -> list[stragglers.Arrival]:
        """Take the collectives this snapshot completes that the window lacks; drop those older
        than the window. Returns the ones added (each counted once: the dashboard's metrics)."""
        self.new = []
        if now - self._looked < LOOK_EVERY_S:
            return self.new
        self._looked = now
        stragglers.samples_of(snap, into=self.sampled)
        for got in self.sampled.values():
            got.forget_before(now - self.window_s)
        for a in stragglers.arrivals(snap):
            key = (a.group, a.seq)
            have = self._arrivals.get(key)
            if have is None or have.times != a.times:   # a restarted job numbers its groups again
                self._arrivals[key] = a
                self.new.append(a)
        old = [k for k, a in self._arrivals.items() if a.times[-1][0] < now - self.window_s]
        for k in old:
            del self._arrivals[k]
        return self.new

    def to_sample(self) -> set[int]:
        """The ranks whose stacks the leader asks their hosts to sample: those judged late now
        (nobody while nobody is)."""
        return {int(s["rank"]) for s in self.current}

    def arrivals(self) -> list[stragglers.Arrival]:
        """The collectives in the window."""
        return list(self._arrivals.values())

    def update(self, snap: Snapshot, now: float) -> list[dict]:
        self.look(snap, now)
        if now - self._judged < JUDGE_EVERY_S:
            return []
        self._judged = now
        kept = list(self._arrivals.values())
        self.current = stragglers.judge(kept, self.sampled)
        self._sampling_since = {r: self._sampling_since.get(r, now) for r in self.to_sample()}
        if not kept:
            return []
        span = max(a.times[-1][0] for a in kept) - min(a.times[0][0] for a in kept)
        if span < self.window_s / 2:
            return []
        due = []
        for s in self.current:
            # Said once its samples say where it is (asked for at its first judging), or once they
            # had their time and did not come (a rank that cannot sample): the call site then.
            waited = s.get("where_from") == "samples" or now - self._sampling_since[s["rank"]] >= SAMPLES_GRACE_S
            if waited and s["late_share"] >= self.share and now - self._said.get(s["rank"], -REPEAT_S) >= REPEAT_S:
                self._said[s["rank"]] = now
                due.append(dict(s, window_s=round(span, 1)))
        return due
