"""The watchdogs' exchange along a tree (host/tree.py), on real processes and real c10d stores:
one simulated host a process (colltrace/testing/simhosts.py: the real watchdog round on
synthetic rank states), fanout 2 so that five hosts make three levels. Each test judges the
job from vitals, as a job of thousands of ranks is judged (DETAIL_ALL_RANKS = 0)."""
from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import queue
import time

import pytest
from torch.distributed import TCPStore

from colltrace.testing import simhosts

pytestmark = pytest.mark.timeout(120)

FAN = 2
HOSTS = 5
RANKS = HOSTS * simhosts.RANKS_PER_HOST


class Hosts:
    def __init__(self, culprit=None, partner=None):
        self.ctx = multiprocessing.get_context("spawn")
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        # One queue a host: a host killed while it writes to a queue leaves that queue's lock held
        # (multiprocessing's own caveat), and a shared one would then silence every other host.
        self.outs: dict[int, multiprocessing.queues.Queue] = {}
        self.hang_at, self.stop = self.ctx.Value("d", 0.0), self.ctx.Value("b", 0)
        self.t0 = time.time()
        self.culprit, self.partner = culprit, partner
        self.procs: dict[int, multiprocessing.Process] = {}
        self.said: dict[int, str] = {}
        self.fresh: set[int] = set()     # the ranks whose beats the leader saw lately (simhosts.FRESH_S)
        self.copied: set[int] = set()    # the hosts holding a copy of the leader's summary

    def start(self, *indices, late=None, env=None):
        for i in indices:
            self.outs[i] = self.ctx.Queue()
            p = self.ctx.Process(target=simhosts.run_host, daemon=True,
                                 args=(i, RANKS, FAN, self.store.port, self.t0, self.hang_at, self.stop, self.outs[i],
                                       self.culprit, self.partner, 0),
                                 kwargs={"late": late, "env": env})
            p.start()
            self.procs[i] = p

    def kill(self, index):
        self.procs[index].kill()
        self.procs[index].join(10)
        del self.outs[index]   # its queue may be left locked: what it said before is not read

    def hang(self):
        self.hang_at.value = time.time()

    def _next(self, deadline):
        """The next message as a finding (index, kind, key, ranks), None for any other kind (kept
        in said, fresh, copied), or "timeout"."""
        msg = None
        while msg is None:
            for q in list(self.outs.values()):
                try:
                    msg = q.get_nowait()
                    break
                except queue.Empty:
                    continue
            else:
                if time.time() >= deadline:
                    return "timeout"
                time.sleep(0.01)
        if msg[0] == "said":
            self.said[msg[1]] = self.said.get(msg[1], "") + msg[2]
        elif msg[0] == "fresh":
            self.fresh = set(msg[2])
        elif msg[0] == "copied":
            self.copied.add(msg[1])
        elif msg[0] == "finding":
            return msg[1:]
        return None

    def wait_for(self, pred, timeout):
        """The first finding (index, kind, key, ranks) for which pred holds, or None."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = self._next(deadline)
            if got == "timeout":
                break
            if got is not None and pred(*got):
                return got
        return None

    def until(self, cond, timeout=60):
        """Wait for what the hosts report to make cond() true (the leader's view, the copies)."""
        deadline = time.time() + timeout
        while not cond():
            assert time.time() < deadline and self._next(deadline) != "timeout", \
                (f"not reached in {timeout} s: fresh {sorted(self.fresh)}, copied {sorted(self.copied)}, "
                 f"said {self.said}")

    def close(self):
        self.stop.value = 1
        for p in self.procs.values():
            p.join(15)
            if p.is_alive():
                p.kill()
                p.join(5)


@pytest.fixture
def hosts(request):
    made = []

    def make(**kw):
        h = Hosts(**kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def deadlock(index, kind, key, ranks):
    return kind == "deadlock"


def test_hosts_that_join_late_are_judged_with_the_rest(hosts):
    h = hosts()
    h.start(1, 2, 3)
    h.until(lambda: set(range(24)) <= h.fresh)
    h.start(4, 5)          # the grandchildren (parent: host 2) join after the others run
    h.until(lambda: h.fresh == set(range(RANKS)))
    h.hang()
    got = h.wait_for(deadlock, 30)
    assert got is not None, h.said
    index, _, key, ranks = got
    assert index == 1
    assert ranks == list(range(RANKS)), "every rank of the world all_reduce and the culprit, hosts 4-5 too"
    assert "pair#1" in key


def test_a_host_that_dies_takes_only_its_own_ranks_with_it(hosts):
    h = hosts()
    h.start(1, 2, 3, 4, 5)
    h.until(lambda: h.fresh == set(range(RANKS)))
    h.kill(2)              # an inner host: its children (4, 5) move up to the leader
    h.until(lambda: set(range(16, 40)) <= h.fresh and not set(range(8, 16)) & h.fresh)   # host 2: ranks 8-15
    h.hang()
    got = h.wait_for(lambda i, kind, key, ranks: i == 1 and bool(set(ranks) & set(range(24, 40))), 30)
    assert got is not None, h.said
    _, kind, _, ranks = got
    assert set(range(24, 40)) <= set(ranks), "the ranks of hosts 4 and 5, under the dead host 2, still judged"
    assert not any("Traceback" in t or "step failed" in t for t in h.said.values()), h.said


def test_when_the_leaders_host_dies_the_first_of_its_children_judges_the_job(hosts):
    # the hang between two ranks away from the leader's host, so that it is still a deadlock
    h = hosts(culprit=RANKS - 3, partner=9)
    h.start(1, 2, 3, 4, 5)
    h.until(lambda: h.fresh == set(range(RANKS)) and 2 in h.copied)
    h.kill(1)
    h.hang()
    got = h.wait_for(lambda i, kind, key, ranks: i == 2 and kind in ("deadlock", "dead_rank"), 40)
    assert got is not None, h.said
    assert "judges the job from now on" in h.said.get(2, ""), h.said
    assert "host (node1, ranks 0-7) stopped answering" in h.said.get(2, ""), h.said
    assert not any("judges the job" in t for i, t in h.said.items() if i != 2), "one host takes over, one line"


def test_a_late_rank_of_a_job_judged_from_vitals_is_named_live_from_the_hosts_digests(hosts):
    """No record travels (a job of thousands of ranks): each host digests its ranks' arrivals,
    host 2 unites its children's (hosts 4 and 5) with its own, and the leader names rank 37, on
    host 5 two levels down, 40 ms late to every all_reduce. Nobody else is named."""
    h = hosts()
    h.start(1, 2, 3, 4, 5, late={37: 0.040}, env={"COLLTRACE_STRAGGLER_WINDOW_S": "2"})
    h.until(lambda: "straggler: rank" in h.said.get(1, ""), timeout=60)
    lines = [line for t in h.said.values() for line in t.splitlines() if "straggler" in line]
    assert len(lines) == 1 and lines[0].startswith("colltrace: straggler: rank 37 arrived last at "), h.said
    assert "40 ms after the first on average" in lines[0] and "train.py:120 (train_step)" in lines[0], lines
