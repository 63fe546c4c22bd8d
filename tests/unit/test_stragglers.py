"""Who makes everyone wait, from the entry times the ranks record (colltrace/analysis/stragglers.py)."""
from __future__ import annotations

import json
import os
import random

from colltrace.analysis import stragglers
from colltrace.reporters.text import render_stragglers
from helpers.cli import run_cli

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
LOOP = {"file": "/job/train.py", "line": 88, "func": "train_step", "origin": "user"}
EVAL = {"file": "/job/train.py", "line": 120, "func": "evaluate", "origin": "user"}
C10D = {"file": "/venv/site-packages/torch/distributed/distributed_c10d.py", "line": 2501, "func": "all_reduce",
        "origin": "internal"}


def job(world, steps, lag_of, frames_of=lambda rank, step: [LOOP, C10D], step_s=0.1, group_ranks=None):
    """A snapshot of `steps` world all_reduces; rank r enters step s at s * step_s + lag_of(r, s)."""
    group_ranks = group_ranks or list(range(world))
    ranks = {}
    for r in range(world):
        records = [{"id": s, "rank": r, "group": "0", "seq": s + 1, "op": "all_reduce", "p2p": False,
                    "state": "completed", "entered_at": 1000.0 + s * step_s + lag_of(r, s),
                    "frames": frames_of(r, s)} for s in range(steps)]
        ranks[str(r)] = {"rank": r, "status": "exited", "records": records}
    return {"groups": {"0": {"name": "0", "desc": "default_pg", "ranks": group_ranks}}, "ranks": ranks}


def test_the_rank_late_to_every_collective_is_named_with_the_line_it_called_from():
    rng = random.Random(1)
    snap = job(4, 150, lambda r, s: (0.040 if r == 2 else 0.0) + rng.uniform(0, 0.002),
               frames_of=lambda r, s: [EVAL if s % 3 == 0 else LOOP, C10D])
    got = stragglers.find(snap)
    assert [s["rank"] for s in got] == [2]
    s = got[0]
    assert s["collectives"] == 150 and s["of"] == 150
    assert 0.038 <= s["lag_s"] <= 0.042
    assert 3 * 150 * 0.038 <= s["waited_for_s"] <= 3 * 150 * 0.042   # three members waited ~40 ms each time
    assert 0.35 <= s["late_share"] <= 0.45                          # 40 ms of every 100 ms step
    assert [(w["line"], w["func"]) for w in s["where"]] == [(88, "train_step"), (120, "evaluate")]
    assert s["where"][0]["share"] == 0.667
    text = render_stragglers(got)
    assert "rank 2 arrived last at 150 of 150 collectives" in text and "train.py:88 (train_step) (67 %)" in text


def test_an_even_job_on_a_loaded_machine_names_nobody():
    rng = random.Random(7)
    snap = job(4, 300, lambda r, s: rng.expovariate(1 / 0.015))   # every rank late now and then, up to ~0.1 s
    assert stragglers.find(snap) == []
    snap = job(2, 300, lambda r, s: rng.uniform(0, 0.03))
    assert stragglers.find(snap) == []


def test_small_even_jobs_name_nobody_whatever_the_draw():
    # few collectives put one of two ranks last 14 times in 20 now and then: chance, not a straggler
    for seed in range(200):
        rng = random.Random(seed)
        assert stragglers.find(job(2, 20, lambda r, s: rng.expovariate(1 / 0.015))) == [], seed
        assert stragglers.find(job(3, 12, lambda r, s: rng.expovariate(1 / 0.015))) == [], seed


def test_a_rank_late_to_one_collective_of_each_step_is_named():
    """The slow teacher: last to the scatter after its forward pass, first to the gather before it."""
    rng = random.Random(3)

    def lag(r, s):   # odd steps: the scatter; even: the gather, the training ranks arriving as they finish
        return (0.12 if r == 3 else 0.0) if s % 2 else (0.0 if r == 3 else rng.uniform(0.02, 0.04))
    got = stragglers.find(job(4, 60, lag))
    assert [s["rank"] for s in got] == [3] and got[0]["collectives"] == 30 and got[0]["of"] == 60


def test_a_world_of_one_and_collectives_not_every_member_recorded_name_nobody():
    assert stragglers.find(job(1, 100, lambda r, s: 0.0)) == []
    # rank 3 is late, but its records are of a group one member of which recorded nothing
    snap = job(4, 100, lambda r, s: 0.05 if r == 3 else 0.0, group_ranks=[0, 1, 2, 3, 4])
    assert stragglers.find(snap) == []


def test_a_rare_or_short_delay_is_not_a_straggler():
    snap = job(4, 200, lambda r, s: 0.05 if (r == 1 and s % 10 == 0) else 0.0)   # late to 1 in 10
    assert stragglers.find(snap) == []
    snap = job(4, 200, lambda r, s: 0.001 if r == 1 else 0.0)   # within what clocks and wakeups give
    assert stragglers.find(snap) == []


def test_odd_records_are_passed_over():
    snap = job(4, 50, lambda r, s: 0.05 if r == 1 else 0.0)
    snap["ranks"]["0"]["records"][3].update(seq="7", entered_at=None)
    snap["ranks"]["2"]["records"].append("not a record")
    snap["ranks"]["x"] = {"rank": "x", "records": [{"seq": 1, "group": "0", "entered_at": 1.0}]}
    got = stragglers.find(snap)
    assert [s["rank"] for s in got] == [1] and got[0]["collectives"] == 49


def test_analyze_json_always_has_a_stragglers_list():
    for folder in ("recorded/deadlock", "recorded/healthy", "fr-gloo/mismatch"):
        r = run_cli("analyze", os.path.join(FIXTURES, folder), "--json")
        assert r.returncode in (0, 1), r.stderr
        assert json.loads(r.stdout)["stragglers"] == [], folder
