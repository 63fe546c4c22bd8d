"""Who makes everyone wait, from the entry times the ranks record (colltrace/analysis/stragglers.py)."""
from __future__ import annotations

import json
import os
import random

from colltrace.analysis import stragglers
from colltrace.reporters.stragglers import render_stragglers
from helpers.cli import run_cli
from helpers.paths import FIXTURES

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
        assert stragglers.find(job(2, 20, lambda r, s, rng=rng: rng.expovariate(1 / 0.015))) == [], seed
        assert stragglers.find(job(3, 12, lambda r, s, rng=rng: rng.expovariate(1 / 0.015))) == [], seed


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


LOAD = {"file": "/job/data.py", "line": 41, "func": "load_batch"}
SLEEP_IN_STDLIB = {"file": "/usr/lib/python3.11/selectors.py", "line": 468, "func": "select"}


def with_samples(snap, rank, samples, gcs=()):
    """The rank's entry carries stack samples (tracefile/samples.py's entry): [(t, frames)]."""
    stacks, at = {}, []
    for t, frames in samples:
        key = str(stacks.setdefault(json.dumps(frames), len(stacks) + 1))
        at.append([t, int(key)])
    snap["ranks"][str(rank)]["samples"] = {"stacks": {str(i): json.loads(f) for f, i in stacks.items()},
                                           "at": at, "gc": [list(g) for g in gcs]}
    snap["ranks"][str(rank)]["roots"] = {"stdlib": ["/usr/lib/python3.11/"]}
    return snap


def test_where_the_late_rank_was_while_the_others_waited_comes_from_its_samples():
    snap = job(4, 100, lambda r, s: 0.040 if r == 2 else 0.0)
    samples = []
    for s in range(100):
        start = 1000.0 + s * 0.1
        samples.append((start - 0.020, [LOOP]))                      # before the others arrived: not a wait
        samples.append((start + 0.015, [LOOP, LOAD]))                # while they waited: loading
        samples.append((start + 0.035, [LOOP, LOAD, SLEEP_IN_STDLIB]))   # ... in the stdlib: its user frame
        if s % 4 == 0:
            samples.append((start + 0.025, [EVAL]))
    snap = with_samples(snap, 2, samples, gcs=[(1000.0 + s * 0.1 + 0.001, 1000.0 + s * 0.1 + 0.006) for s in range(10)])
    [s] = stragglers.find(snap)
    assert s["rank"] == 2 and s["where_from"] == "samples" and s["samples"] == 225
    assert [(w["func"], w["share"]) for w in s["where"]] == [("load_batch", 0.889), ("evaluate", 0.111)]
    assert s["gc_s"] == 0.05   # ten 5 ms collections inside its late windows, counted apart
    text = render_stragglers([s])
    assert ("while they waited it was at data.py:41 (load_batch) in 89 %, train.py:120 (evaluate) in 11 % "
            "of 225 samples") in text
    assert "garbage collection held it 50 ms" in text


def test_without_samples_in_its_late_windows_the_call_site_stands_in():
    snap = with_samples(job(4, 100, lambda r, s: 0.040 if r == 2 else 0.0), 2,
                        [(1000.0 + s * 0.1 + 0.060, [LOAD]) for s in range(100)])   # after it arrived: no wait
    [s] = stragglers.find(snap)
    assert s["where_from"] == "calls" and s["samples"] == 0 and s["where"][0]["func"] == "train_step"
    assert "it called them from train.py:88 (train_step)" in render_stragglers([s])


def test_odd_samples_are_passed_over():
    snap = job(4, 100, lambda r, s: 0.040 if r == 2 else 0.0)
    snap["ranks"]["2"]["samples"] = {"stacks": {"1": [LOAD], "2": "x"}, "at": [[1000.02, 1], [1000.02], ["t", 1],
                                                                          [1000.12, 2], [1000.22, 9], 7],
                                     "gc": [[1], "y", [1000.0, 1000.03]]}
    snap["ranks"]["1"]["samples"] = "nothing"
    [s] = stragglers.find(snap)
    assert (s["samples"] == 1
            and s["where"] == [{"file": "/job/data.py", "line": 41, "func": "load_batch", "share": 1.0}])
    assert s["gc_s"] == 0.03


def test_across_hosts_each_hosts_clock_offset_is_taken_off_before_arrivals_are_compared():
    # ranks 4-7 on node2, whose clock runs 200 ms ahead; rank 1 (node1) is truly 40 ms late
    rng = random.Random(3)
    snap = job(8, 150, lambda r, s: (0.2 if r >= 4 else 0.0) + (0.040 if r == 1 else 0.0) + rng.uniform(0, 0.002))
    for r, e in snap["ranks"].items():
        e["host"] = "node2" if int(r) >= 4 else "node1"
    assert 1 not in [s["rank"] for s in stragglers.find(snap)]   # uncorrected, node2's clock hides it
    snap["clocks"] = {"node1": [0.0, 0.0], "node2": [0.2, 0.0004]}
    got = stragglers.find(snap)
    assert [s["rank"] for s in got] == [1]
    assert 0.038 <= got[0]["lag_s"] <= 0.042 and got[0]["clock_error_s"] == 0.0004   # its own 0, node2's
    # a lag within the clocks' error bound is nobody's: node2 measured only to within 50 ms
    snap["clocks"]["node2"] = [0.2, 0.05]
    assert stragglers.find(snap) == []
    snap["clocks"]["node2"] = [0.2, 0.0004]
    assert "(hosts' clocks matched to within 0.4 ms)" in render_stragglers(stragglers.find(snap))
