"""Arrival digests (colltrace/model/arrivals.py): a large job's stragglers judged from a few
numbers per collective instead of every rank's records."""
from __future__ import annotations

import random

from test_stragglers import job

from colltrace.analysis import stragglers
from colltrace.model import arrivals


def _two_hosts(snap, ahead_s=0.2):
    """Ranks 0-3 on node1; 4-7 on node2, whose clock runs `ahead_s` ahead (its records say so)."""
    hosts = {"node1": {}, "node2": {}}
    for r, e in snap["ranks"].items():
        e["host"] = "node2" if int(r) >= 4 else "node1"
        if int(r) >= 4:
            for rec in e["records"]:
                rec["entered_at"] += ahead_s
        hosts[e["host"]][r] = e
    return hosts


def test_digests_united_across_hosts_name_the_straggler_the_records_name():
    rng = random.Random(5)
    snap = job(8, 150, lambda r, s: (0.040 if r == 1 else 0.0) + rng.uniform(0, 0.002))
    expected = stragglers.find(snap)
    hosts = _two_hosts(snap)
    node1 = {"host": "node1", "arrivals": arrivals.digest(hosts["node1"], snap["groups"], keep=150, within_s=20)}
    node2 = {"host": "node2", "clock": [0.2, 0.0003],
             "arrivals": arrivals.digest(hosts["node2"], snap["groups"], keep=150, within_s=20)}
    united = arrivals.unite(node1["arrivals"], [node2])
    vitals = {r: {"rank": e["rank"], "host": e["host"], "status": "alive"} for r, e in snap["ranks"].items()}
    got = stragglers.find({"groups": snap["groups"], "ranks": vitals, "arrivals": united})
    assert [s["rank"] for s in got] == [1] == [s["rank"] for s in expected]
    for k in ("collectives", "of"):
        assert got[0][k] == expected[0][k] == 150
    assert abs(got[0]["lag_s"] - expected[0]["lag_s"]) < 1e-6
    assert abs(got[0]["waited_for_s"] - expected[0]["waited_for_s"]) < 1e-3
    assert got[0]["clock_error_s"] == 0.0006   # node2's bound, on the last and on the first
    # the same job, node2's clock not taken off: its ranks look 200 ms late and rank 1 is lost
    blind = arrivals.unite(node1["arrivals"], [dict(node2, clock=None)])
    assert 1 not in [s["rank"] for s in stragglers.find({"groups": snap["groups"], "ranks": vitals, "arrivals": blind})]


def test_a_host_sends_its_most_recent_collectives_whole_and_leaves_out_what_a_rank_lacks():
    snap = job(4, 40, lambda r, s: 0.001 * r)
    del snap["ranks"]["2"]["records"][-1]   # rank 2's window lacks the last collective
    d = arrivals.digest(snap["ranks"], snap["groups"])
    assert sorted(d) == sorted(f"0#{s}" for s in range(19, 40))   # whole ones of the last 2 s (0.1 s a step)
    n, total, first, first_rank, last, last_rank, err = d["0#39"]
    assert (n, first_rank, last_rank, err) == (4, 0, 3, 0.0) and abs(last - first - 0.003) < 1e-9
    # united with a half that is not whole anywhere: the collective does not count
    assert stragglers.arrivals({"groups": snap["groups"], "ranks": {},
                                "arrivals": {"0#40": [3, 1.0, 0.1, 0, 0.5, 2, 0.0]}}) == []


def test_malformed_digests_from_a_child_are_skipped():
    own = {"0#1": [2, 2.0, 1.0, 0, 1.0, 1, 0.0]}
    bad = [{"arrivals": {"0#1": [1, "x", 1, 0, 1, 1, 0]}}, {"arrivals": "nope"},
           {"arrivals": {"0#2": [1, 1.0, 1.0, 2.5, 1.0, 2, 0]}}]
    assert arrivals.unite(own, bad) == own
