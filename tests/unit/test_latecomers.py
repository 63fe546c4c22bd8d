"""The live straggler window (colltrace/host/latecomers.py) and its line on stderr."""
from __future__ import annotations

from colltrace.host import latecomers
from colltrace.host.latecomers import Latecomers
from colltrace.reporters.stragglers import render_straggler_line

LOOP = {"file": "/job/train.py", "line": 88, "func": "load_batch", "origin": "user"}


def snap_at(now, late_rank, step_s=0.1, keep=64, world=4, lag=0.04):
    """What the leader sees at `now`: each rank's last `keep` world all_reduces (a summary's records)."""
    last = int(now / step_s)
    ranks = {}
    for r in range(world):
        records = [{"id": s, "rank": r, "group": "0", "seq": s, "op": "all_reduce", "p2p": False,
                    "state": "completed", "entered_at": s * step_s + (lag if r == late_rank else 0.001 * r),
                    "frames": [LOOP]} for s in range(max(1, last - keep), last)]
        ranks[str(r)] = {"rank": r, "status": "alive", "records": records}
    return {"groups": {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(world))}}, "ranks": ranks}


def run(watch, late_rank, start, end, every=0.1):
    said = []
    t = start
    while t < end:
        said += [(round(t, 1), s) for s in watch.update(snap_at(t, late_rank), t)]
        t += every
    return said


def test_a_late_rank_is_said_once_when_half_the_window_is_judged_and_again_only_minutes_later():
    watch = Latecomers(share=0.1, window_s=20.0)
    said = run(watch, 2, 1.0, 60.0)
    assert len(said) == 1
    t, s = said[0]
    assert 10.0 <= t <= 13.0 and s["rank"] == 2 and s["late_share"] >= 0.3
    line = render_straggler_line(s)
    assert line.startswith("colltrace: straggler: rank 2 arrived last at ") and "train.py:88 (load_batch)" in line
    assert watch.current and watch.current[0]["rank"] == 2
    # the window keeps only its last 20 s of collectives, however long the job runs
    assert all(a.times[-1][0] >= 60.0 - 20.0 - 1.0 for a in watch._arrivals.values())
    later = run(watch, 2, 60.0, 60.0 + latecomers.REPEAT_S + 5)
    assert len(later) == 1


def test_an_even_job_or_a_share_below_the_threshold_says_nothing():
    assert run(Latecomers(share=0.1, window_s=20.0), None, 1.0, 40.0) == []
    # rank 2 costs ~40 % of the time: under a threshold of 50 % it is judged, not said
    watch = Latecomers(share=0.5, window_s=20.0)
    assert run(watch, 2, 1.0, 40.0) == [] and watch.current[0]["rank"] == 2


def test_each_collective_is_counted_once_however_often_it_is_seen():
    watch = Latecomers(share=0.1, window_s=60.0)
    first = watch.look(snap_at(10.0, 2), 10.0)
    again = watch.look(snap_at(10.0, 2), 10.0 + latecomers.LOOK_EVERY_S)
    assert len(first) == 64 and again == []
    more = watch.look(snap_at(11.0, 2), 11.0 + latecomers.LOOK_EVERY_S)
    assert [a.seq for a in more] == list(range(100, 110))


DATA = {"file": "/job/data.py", "line": 41, "func": "read_shard"}


def test_a_late_rank_is_asked_for_samples_and_its_line_says_where_they_found_it():
    watch = Latecomers(share=0.1, window_s=4.0)
    assert watch.to_sample() == set()
    said, asked_at = [], None
    t = 1.0
    while t < 12.0 and not said:
        snap = snap_at(t, 2)
        if watch.to_sample() == {2}:
            asked_at = asked_at or t
            # its host sends the newest samples: the rank was in read_shard 20 ms into each wait
            at = [[s * 0.1 + 0.02, 1] for s in range(int(asked_at / 0.1), int(t / 0.1))]
            snap["ranks"]["2"]["samples"] = {"stacks": {"1": [DATA]}, "at": at[-50:], "gc": []}
        said += watch.update(snap, t)
        t += 0.1
    assert asked_at is not None and said, "asked, then said"
    [s] = said
    assert s["where_from"] == "samples" and s["where"][0]["func"] == "read_shard"
    assert "while they waited it was at data.py:41 (read_shard) in 100 %" in render_straggler_line(s)


def test_a_rank_that_sends_no_samples_is_said_with_its_call_site_after_the_grace():
    watch = Latecomers(share=0.1, window_s=4.0)
    said = run(watch, 2, 1.0, 12.0)
    [(t, s)] = said
    first_judged = 1.0 + 2 * latecomers.JUDGE_EVERY_S   # enough collectives, then the grace for samples
    assert t >= first_judged and s["where_from"] == "calls"
    assert "it called them from train.py:88 (load_batch)" in render_straggler_line(s)
