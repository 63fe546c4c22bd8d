"""The root of a large job judges an unchanged input again only every REJUDGE_S
(colltrace/host/watchdog.py's _judge): the same tables from the other hosts, the same own ranks,
the same groups asked for. Both what it picks to judge (tree.judged) and the analysis."""
from __future__ import annotations

import io

from colltrace import config, verdict
from colltrace.host import watchdog
from colltrace.host.watchdog import Watchdog


def test_an_unchanged_large_job_is_analyzed_again_only_after_rejudge_s(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(verdict, "findings_of",
                        lambda snap, stall_s, now: calls.append(now) or [{"kind": "deadlock", "key": f"k{len(calls)}"}])
    wd = Watchdog(str(tmp_path), "job", "h", config.load({}), stream=io.StringIO())
    picked = []
    wd.exchange.wants.judgeable = lambda snap: picked.append(snap) or snap   # what it picks to judge (tree.judged)
    wd.exchange.wants.every = False                      # judged from vitals: more than DETAIL_ALL_RANKS ranks
    wd.exchange.wants.suspicion.groups = {"0"}
    own = {"ranks": {"0": {"rank": 0, "status": "alive", "heartbeat": 1.0, "progress": {"0": {"entered": 5}}}}}
    others = [{"ranks": {"8": {"rank": 8, "status": "alive"}}}, {"ranks": {"16": {"rank": 16, "status": "alive"}}}]
    first = wd._judge({}, own, others, 100.0)
    assert len(picked) == 1
    beat = {"ranks": {"0": dict(own["ranks"]["0"], heartbeat=2.0)}}   # only its heartbeat moved
    assert wd._judge({}, beat, list(others), 100.2) is first and len(calls) == 1 and len(picked) == 1
    assert wd._judge({}, beat, others, 100.0 + watchdog.REJUDGE_S) != first and len(calls) == 2   # time may change it
    # a host's new table (its summary's bytes changed), even equal in content: analyzed at once
    wd._judge({}, beat, [others[0], {"ranks": dict(others[1]["ranks"])}], 100.6)
    assert len(calls) == 3
    moved = {"ranks": {"0": dict(own["ranks"]["0"], progress={"0": {"entered": 6}})}}
    wd._judge({}, moved, [others[0], {"ranks": dict(others[1]["ranks"])}], 100.7)   # its own ranks moved
    assert len(calls) == 4
    wd.exchange.wants.suspicion.groups = {"0", "pair"}                     # the root asked for more
    wd._judge({}, moved, others, 100.75)
    assert len(calls) == 5
    wd.exchange.wants.every = True                        # a small job: every round
    wd._judge({}, moved, others, 100.76)
    wd._judge({}, moved, others, 100.77)
    assert len(calls) == 7


def test_a_large_job_not_judgeable_yet_is_asked_again_when_its_input_changes(tmp_path, monkeypatch):
    """Not judgeable (the wanted ranks not all in full): the same answer for an unchanged input
    within REJUDGE_S; a host's new table (its details came) is judged at once."""
    monkeypatch.setattr(verdict, "findings_of", lambda snap, stall_s, now: [{"kind": "deadlock", "key": "k"}])
    wd = Watchdog(str(tmp_path), "job", "h", config.load({}), stream=io.StringIO())
    wd.exchange.wants.every = False
    wd.exchange.wants.suspicion.groups = {"0"}
    whole = []
    wd.exchange.wants.judgeable = lambda snap: snap if whole else None
    own = {"ranks": {"0": {"rank": 0, "status": "alive", "heartbeat": 1.0}}}
    others = [{"ranks": {"8": {"rank": 8, "status": "alive", "vital": True}}}]
    assert wd._judge({}, own, others, 100.0) is None
    whole.append(True)   # would be judgeable now, but nothing it reads changed: the answer stands
    assert wd._judge({}, own, others, 100.1) is None
    came = [{"ranks": {"8": {"rank": 8, "status": "alive", "records": []}}}]   # host 2's details came
    assert wd._judge({}, own, came, 100.2) == [{"kind": "deadlock", "key": "k"}]


def test_where_judging_is_slow_an_unchanged_input_costs_at_most_a_quarter_of_the_root(tmp_path, monkeypatch):
    """A hung job of 16,384 ranks takes the root about a second to judge: left hanging (warn), its
    unchanged input is judged again after REJUDGE_SHARE of the time went to it, not every
    REJUDGE_S (which kept the root at 100 % and more); a host's new table is still judged at once."""
    cpu = [0.0]
    monkeypatch.setattr(watchdog.time, "thread_time", lambda: cpu[0])

    def slow(snap, stall_s, now):   # one analysis: 0.8 s of the watchdog thread's CPU
        cpu[0] += 0.8
        calls.append(now)
        return [{"kind": "deadlock", "key": "k"}]

    calls: list = []
    monkeypatch.setattr(verdict, "findings_of", slow)
    wd = Watchdog(str(tmp_path), "job", "h", config.load({}), stream=io.StringIO())
    wd.exchange.wants.judgeable = lambda snap: snap
    wd.exchange.wants.every = False
    wd.exchange.wants.suspicion.groups = {"0"}
    own = {"ranks": {"0": {"rank": 0, "status": "alive", "heartbeat": 1.0}}}
    others = [{"ranks": {"8": {"rank": 8, "status": "alive"}}}]
    t = 100.0
    while t < 120.0:   # 20 s of 0.1 s rounds on an unchanged, hung input
        wd._judge({}, own, others, t)
        t += 0.1
    assert watchdog.rejudge_after(0.8) == 3.2
    assert 5 <= len(calls) <= 7                       # every 3.2 s, not 40 times (every REJUDGE_S)
    assert 0.8 * len(calls) / 20.0 <= watchdog.REJUDGE_SHARE + 0.05
    n = len(calls)
    wd._judge({}, own, [{"ranks": dict(others[0]["ranks"])}], t)   # a host's new table: judged at once
    assert len(calls) == n + 1 and calls[-1] == t
    assert (watchdog.rejudge_after(100.0) == watchdog.REJUDGE_MAX_S
            and watchdog.rejudge_after(0.01) == watchdog.REJUDGE_S)


def test_the_ranks_whose_stacks_it_needs_are_worked_out_again_when_the_input_changes(tmp_path, monkeypatch):
    """build.suspects reads every rank's records (50 ms at 16,384 ranks in a hang): on a large
    job its answer stands while the input is unchanged, like the judging's; a small job's every round."""
    calls = []
    monkeypatch.setattr(watchdog, "suspects", lambda snap, now: calls.append(now) or {3})
    wd = Watchdog(str(tmp_path), "job", "h", config.load({}), stream=io.StringIO())
    wd.exchange.wants.every = False
    own = {"ranks": {"0": {"rank": 0, "status": "alive", "heartbeat": 1.0}}}
    others = [{"ranks": {"8": {"rank": 8, "status": "alive"}}}]
    assert wd._suspects({}, own, others, 100.0) == {3}
    assert wd._suspects({}, dict(own, ranks={"0": dict(own["ranks"]["0"], heartbeat=2.0)}), others, 100.1) == {3}
    assert len(calls) == 1
    wd._suspects({}, own, [{"ranks": dict(others[0]["ranks"])}], 100.2)   # a host's new table
    wd._suspects({}, own, others, 100.2 + watchdog.REJUDGE_S)             # time alone, after REJUDGE_S
    assert len(calls) == 3
    wd.exchange.wants.every = True
    wd._suspects({}, own, others, 101.0)
    wd._suspects({}, own, others, 101.0)
    assert len(calls) == 5
