"""The analyzer on synthetic snapshots (docs/design.md): no torch, no processes.

Each test builds the situation a user would be in and checks what they would look at: the
kind, the group and collective number, who is missing, the ops and the file:line in the text.
"""
from __future__ import annotations

import json
import random

import pytest

from colltrace import analysis, origins
from colltrace.analysis import HANG_KINDS
from colltrace.model.finding import Finding
from colltrace.reporters import locations, stacks
from colltrace.reporters import text as report_mod
from colltrace.reporters.text import render_report, summarize
from colltrace.words import format_ranks
from helpers.synthetic import COLLTRACE, ROOTS, STALL, TORCH, SyntheticJob, T, analyze, frames, only


def seed_story(rank7_state="waiting") -> SyntheticJob:
    """The user's story: ranks 0-6 train, rank 7 serves a teacher. Checkpoint code calls
    dist.barrier() on the default group while rank 7 sits in a gather on the teacher group."""
    job = SyntheticJob(8, {"1": ("training", range(7)), "2": ("teacher", range(8))})
    job.history("0", 4).history("1", 20).history("2", 11, op="gather")
    job.op(range(7), "0", 5, "barrier", "waiting", at="checkpoint.py:302", func="save", t=T)
    job.op(7, "2", 12, "gather", rank7_state, at="distill.py:88", func="serve_teacher", t=T - 3, root=7)
    return job


# -- deadlock -------------------------------------------------------------------------------
def test_seed_story_is_a_deadlock_across_groups_naming_every_rank_and_line():
    f = only(analyze(seed_story().snap(), STALL, T + 2), "deadlock")
    assert f.group["name"] == "0" and f.group["desc"] == "default_pg" and f.seq == 5
    assert f.missing_ranks == [7]
    assert sorted(int(r) for r in f.ranks) == list(range(8))
    assert f.ranks["3"]["op"] == "barrier" and f.ranks["7"]["op"] == "gather"
    assert {c["group"] for c in f.cycle} == {"0", "2"}
    s = f.summary
    assert s.startswith("Deadlock")
    for needle in ("ranks 0-6", "rank 7", "barrier #5", "gather #12", "checkpoint.py:302 (save)",
                   "distill.py:88 (serve_teacher)", "default_pg", "teacher"):
        assert needle in s, (needle, s)
    assert "checkpoint.py:302" in f.advice
    assert f.detected_at == T + 2 and f.key


def test_deadlock_needs_no_threshold_but_a_call_just_entered_does_not_close_a_cycle():
    job = seed_story()
    assert only(analyze(job.snap(), 600.0, T + 1), "deadlock")
    # entered 0.1 s ago: ranks are read a few ms apart, wait until it settles
    assert analyze(job.snap(), 600.0, T + 0.1) == []


def test_rank_in_async_work_closes_the_cycle_only_once_idle_for_stall_s():
    job = seed_story(rank7_state="in_flight")   # NCCL: the gather returned, rank 7 then blocks in a sync
    assert analyze(job.snap(), STALL, T + 5) == []          # it might still come: nothing claimed
    f = only(analyze(job.snap(), STALL, T + 40), "deadlock")
    assert f.missing_ranks == [7]


def test_deadlock_points_first_at_the_odd_call_not_at_routine_traffic():
    """Rank 0 alone saves on a preemption signal (a barrier on the training group) while the
    others go on with the step's gather/scatter to the teacher, as they do every step. Though
    more ranks wait in the routine scatter, the place to look is rank 0's barrier."""
    job = SyntheticJob(4, {"1": ("train", range(3)), "2": ("ipc", range(4))})
    for step in range(10):   # routine: a gather and a scatter on ipc every step
        job.op([0, 1, 2, 3], "2", 2 * step + 1, "gather", at="distributed.py:57", func="send", root=3)
        job.op([0, 1, 2, 3], "2", 2 * step + 2, "scatter", at="distributed.py:63", func="recv", root=3)
    job.history("1", 5)
    job.op(0, "1", 6, "barrier", "waiting", at="checkpoint.py:36", func="make_dir", t=T)
    job.op([1, 2], "2", 22, "scatter", "waiting", at="distributed.py:63", func="recv", root=3, t=T)
    job.op([1, 2, 3], "2", 21, "gather", "completed", at="distributed.py:57", func="send", root=3, t=T - 1)
    job.op(3, "2", 21, "gather", "waiting", at="distributed.py:57", func="send", root=3, t=T)
    job.entries[3]["records"] = [r for r in job.entries[3]["records"]
                                 if not (r["seq"] == 21 and r["state"] == "completed")]
    job.entries[3]["progress"]["2"]["completed"] = 20
    f = only(analyze(job.snap(), STALL, T + 2), "deadlock")
    assert f.cycle[0]["op"] == "barrier" and f.cycle[0]["waiting"] == [0] and f.group["name"] == "1"
    assert f.summary.startswith("Deadlock across groups 1 and 2: rank 0 waits in barrier #6")
    assert "Look first at checkpoint.py:36 (make_dir)" in f.advice


def test_deadlock_is_reported_once_not_also_as_stalls():
    f = analyze(seed_story().snap(), STALL, T + 300)
    assert [x.kind for x in f] == ["deadlock"]


def test_p2p_cycle_both_ranks_receive_first():
    job = SyntheticJob(2)
    job.op([0, 1], "0", 1, "all_reduce")
    job.op(0, "0", 1, "recv", "waiting", at="pipe.py:40", func="recv_act", p2p=True, peer=1, t=T)
    job.op(1, "0", 1, "recv", "waiting", at="pipe.py:40", func="recv_act", p2p=True, peer=0, t=T)
    f = only(analyze(job.snap(), STALL, T + 5), "deadlock")
    assert sorted(f.ranks) == ["0", "1"]
    assert "pipe.py:40" in f.summary and all(c["p2p"] for c in f.cycle)


def test_ranks_killed_while_deadlocked_still_show_the_deadlock_post_mortem():
    """COLLTRACE_ON_HANG=abort kills every rank: `colltrace analyze` afterwards still sees the cycle."""
    job = seed_story()
    for r in range(8):
        job.set(r, status="dead", exit={"signal": None, "note": "gone without a trace"}, died_at=T + 40)
    kinds = [f.kind for f in analyze(job.snap(), STALL, T + 41)]
    assert kinds == ["deadlock"]


# -- mismatch -------------------------------------------------------------------------------
def test_mismatched_ops_at_the_same_number_are_reported_at_once_with_both_sides():
    job = SyntheticJob(4)
    job.history("0", 2)
    job.op([0, 1, 2], "0", 3, "all_reduce", "waiting", at="train.py:250", func="step", t=T)
    job.op(3, "0", 3, "broadcast", "waiting", at="eval.py:77", func="sync_eval", t=T, root=3)
    f = only(analyze(job.snap(), STALL, T + 0.01), "mismatch")
    assert f.group["name"] == "0" and f.seq == 3 and "op" in f.differs
    by_op = {c["op"]: c["ranks"] for c in f.classes}
    assert by_op == {"all_reduce": [0, 1, 2], "broadcast": [3]}
    assert "train.py:250" in f.summary and "eval.py:77" in f.summary and "ranks 0-2" in f.summary
    assert "eval.py:77" in f.advice   # the odd one out


def test_mismatched_shapes_dtypes_and_reduce_op():
    job = SyntheticJob(3)
    job.op([0, 1], "0", 1, "all_reduce", "waiting", t=T, shapes=[(4, 8)], dtypes=["float32"], reduce_op="SUM")
    job.op(2, "0", 1, "all_reduce", "waiting", t=T, shapes=[(4, 9)], dtypes=["bfloat16"], reduce_op="MAX")
    f = only(analyze(job.snap(), STALL, T + 1), "mismatch")
    assert f.differs == ["shapes", "dtypes", "reduce_op"]
    assert "4x9" in f.summary and "bfloat16" in f.summary and "MAX" in f.summary


def test_a_collective_entered_untraced_is_compared_by_what_the_flight_recorder_says():
    """Ranks 0-2 are in DDP's gradient all-reduce #6 (seen only by the Flight Recorder, their
    live stacks in backward) while rank 3 waits in a barrier #6: a mismatch, not a stall."""
    job = SyntheticJob(4)
    job.history("0", 5)
    job.op(3, "0", 6, "barrier", "waiting", at="train.py:81", func="save", t=T)
    for r in range(3):
        job.set(r, stack=frames("train.py:80", "step")[:2], stack_at=T + 1,
                untraced=[{"group": "0", "seq": 6, "op": "all_reduce", "backend_op": "allreduce",
                           "shapes": [[20]], "dtypes": ["float32"], "t": T - 0.1}])
        job.entries[r]["progress"]["0"]["entered"] = 6
    f = only(analyze(job.snap(), STALL, T + 1.5), "mismatch")
    assert f.seq == 6 and f.differs == ["op"] and f.missing_ranks == []
    assert [(c["ranks"], c["op"], c.get("untraced", False)) for c in f.classes] == [
        ([0, 1, 2], "all_reduce", True), ([3], "barrier", False)]
    assert "train.py:80 (step)" in f.summary and "Flight Recorder" in f.summary
    assert "Look first at train.py:81 (save)" in f.advice


def test_same_backend_op_under_different_api_names_is_no_mismatch():
    job = SyntheticJob(2)
    job.op(0, "0", 1, "all_gather_object", "waiting", t=T)
    job.op(1, "0", 1, "all_gather", "waiting", t=T, shapes=[(1,)])
    assert analyze(job.snap(), STALL, T + 1) == []


def test_untraced_collectives_are_never_blamed_as_mismatches():
    job = SyntheticJob(2)
    job.op([0, 1], "0", 1, "all_reduce")
    job.op(0, "0", 2, "untraced", seq_end=4, count=3)      # DDP's C++ all-reduces, counted
    job.op(1, "0", 2, "all_reduce", "in_flight", t=T)
    job.op(1, "0", 3, "all_reduce", t=T + 0.1)
    job.op(1, "0", 4, "all_reduce", t=T + 0.2)
    assert analyze(job.snap(), STALL, T + 1) == []


def test_uneven_all_to_all_shapes_are_fine():
    job = SyntheticJob(2)
    job.op(0, "0", 1, "all_to_all_single", "waiting", backend_op="alltoall_base", t=T, shapes=[(3, 4)])
    job.op(1, "0", 1, "all_to_all_single", "waiting", backend_op="alltoall_base", t=T, shapes=[(5, 4)])
    assert analyze(job.snap(), STALL, T + 1) == []


def test_mismatch_takes_priority_over_the_stall_it_causes():
    job = SyntheticJob(2)
    job.op(0, "0", 1, "all_reduce", "waiting", t=T)
    job.op(1, "0", 1, "barrier", "waiting", t=T)
    assert [f.kind for f in analyze(job.snap(), STALL, T + 100)] == ["mismatch"]


# -- stall --------------------------------------------------------------------------------------
def test_stall_names_the_missing_rank_and_where_its_live_stack_is():
    job = SyntheticJob(4)
    job.history("0", 6)
    job.op([0, 1, 2], "0", 7, "all_reduce", "waiting", at="train.py:250", func="sync_metrics", t=T)
    job.set(3, stack=frames("data.py:55", "load_batch")[:2], stack_at=T + 39)
    f = only(analyze(job.snap(), STALL, T + 40), "stall")
    assert f.key == "stall:0:7" and f.stage == "arrival"
    assert f.group["name"] == "0" and f.seq == 7 and f.missing_ranks == [3]
    assert f.ranks["3"]["state"] == "not_in_collective"
    for needle in ("ranks 0-2", "all_reduce #7", "train.py:250 (sync_metrics)", "rank 3", "data.py:55 (load_batch)",
                   "40.0 s"):
        assert needle in f.summary, (needle, f.summary)
    assert "data.py:55" in f.advice


def test_stall_says_when_no_stack_is_available():
    job = SyntheticJob(2)
    job.history("0", 1)
    job.op(0, "0", 2, "barrier", "waiting", at="train.py:30", t=T)
    f = only(analyze(job.snap(), STALL, T + 31), "stall")
    assert "no live stack" in f.summary
    assert f.ranks["1"]["last"]["op"] == "all_reduce"


def test_stall_reports_a_missing_rank_pending_elsewhere():
    """Rank 3 is missing from group 1 because it waits (for 5 s only) in group 5 for rank 4."""
    job = SyntheticJob(5, {"1": ("dp", [0, 1, 2, 3]), "5": ("pp", [3, 4])})
    job.history("1", 2)
    job.op([0, 1, 2], "1", 3, "all_reduce", "waiting", at="train.py:250", t=T)
    job.op(3, "5", 1, "broadcast", "waiting", at="pipe.py:12", func="stage", t=T + 35, root=4)
    f = only(analyze(job.snap(), STALL, T + 40), "stall")
    assert f.group["name"] == "1" and f.missing_ranks == [3]
    assert "broadcast #1 on group 5" in f.summary and "pipe.py:12 (stage)" in f.summary
    assert "waiting for rank 4" in f.summary


def test_chain_of_waits_is_one_finding_where_it_starts():
    """Ranks 0-1 wait in group 0 for rank 2; rank 2 waits in group 7 for rank 3, busy elsewhere."""
    job = SyntheticJob(4, {"7": ("pair", [2, 3])})
    job.op([0, 1], "0", 1, "all_reduce", "waiting", at="a.py:1", t=T)
    job.op(2, "7", 1, "all_reduce", "waiting", at="b.py:2", t=T - 10)
    job.set(3, stack=frames("c.py:3", "busy")[:2])
    f = only(analyze(job.snap(), STALL, T + 60), "stall")
    assert f.group["name"] == "7" and f.missing_ranks == [3]
    assert f.behind == [0, 1]
    assert "c.py:3" in f.summary and "stuck behind" in f.summary


def test_completion_stall_when_everyone_entered_and_nothing_completes():
    job = SyntheticJob(4)
    job.history("0", 2)
    job.op(range(4), "0", 3, "all_reduce", "in_flight", at="train.py:99", t=T)
    f = only(analyze(job.snap(), STALL, T + 45), "stall")
    assert f.stage == "completion" and f.missing_ranks == [] and f.seq == 3
    assert "hung" in f.summary and "train.py:99" in f.summary


def test_a_late_arrival_that_completed_does_not_make_the_others_look_hung():
    """Rank 1 computed for 40 s, then entered the barrier and completed it; rank 0, waiting since
    the start, has not returned yet when the watchdog looks. Every member entered only now: not a
    completion stall (as if the backend had hung for 40 s), until it lasts the threshold."""
    job = SyntheticJob(2)
    job.history("0", 1)
    job.op(0, "0", 2, "barrier", "waiting", at="train.py:63", t=T)
    job.op(1, "0", 2, "barrier", "completed", at="train.py:63", t=T + 40)
    assert analyze(job.snap(), STALL, T + 40.2) == []
    f = only(analyze(job.snap(), STALL, T + 40 + STALL + 1), "stall")
    assert f.stage == "completion" and f.waited_s == pytest.approx(STALL + 1)


def test_async_ops_stuck_behind_a_stall_join_it_instead_of_one_finding_each():
    """NCCL: ops in flight on the tensor-parallel groups do not complete while the ranks are stuck
    in a world all_reduce that rank 3 never enters; that stall is the one problem."""
    job = SyntheticJob(4, {"1": ("tp", [0, 1]), "2": ("tp", [2, 3])})
    job.op([0, 1], "1", 1, "all_reduce", "in_flight", at="model.py:5", t=T - 20)
    job.op([2, 3], "2", 1, "all_reduce", "in_flight", at="model.py:5", t=T - 20)
    job.op([0, 1, 2], "0", 1, "all_reduce", "waiting", at="train.py:250", t=T)
    job.set(3, stack=frames("data.py:55")[:2])
    f = only(analyze(job.snap(), STALL, T + 40), "stall")
    assert f.group["name"] == "0" and f.missing_ranks == [3]


# -- no false alarms ----------------------------------------------------------------------------
def test_healthy_job_gives_nothing():
    job = seed_story()
    job = SyntheticJob(8, {"1": ("training", range(7))})
    job.history("0", 30).history("1", 50)
    assert analyze(job.snap(), STALL, T + 1000) == []


def test_slow_rank_under_the_threshold_gives_nothing():
    job = SyntheticJob(4)
    job.history("0", 2)
    job.op([0, 1, 2], "0", 3, "all_reduce", "waiting", t=T)
    job.set(3, stack=frames("data.py:55")[:2])
    assert analyze(job.snap(), STALL, T + 29.9) == []


def test_young_in_flight_collective_entered_by_all_gives_nothing():
    job = SyntheticJob(4)
    job.op(range(4), "0", 1, "all_reduce", "in_flight", t=T)
    assert analyze(job.snap(), STALL, T + 5) == []


def test_superseded_waiting_record_in_the_same_thread_is_not_pending():
    job = SyntheticJob(2)
    job.op(0, "0", 1, "barrier", "waiting", t=T - 500)    # its return was lost
    job.op(1, "0", 1, "barrier", t=T - 500)
    job.op([0, 1], "0", 2, "all_reduce", t=T - 400)
    assert analyze(job.snap(), STALL, T + 100) == []


# -- dead ranks ---------------------------------------------------------------------------------
def test_dead_rank_that_others_wait_for():
    job = SyntheticJob(4)
    job.history("0", 6)
    job.op([0, 1, 2], "0", 7, "all_reduce", "waiting", at="train.py:250", t=T)
    job.set(3, status="dead", exit={"signal": "SIGSEGV", "code": -11}, died_at=T - 1,
            stack=frames("kernels.py:41", "fused_op")[:2])
    f = only(analyze(job.snap(), STALL, T + 2), "dead_rank")   # no threshold
    assert f.rank == 3 and f.missing_ranks == [3] and f.group["name"] == "0" and f.seq == 7
    assert f.last_collective["seq"] == 6
    assert f.waiting[0]["ranks"] == [0, 1, 2]
    for needle in ("SIGSEGV", "kernels.py:41 (fused_op)", "ranks 0-2", "all_reduce #7"):
        assert needle in f.summary, (needle, f.summary)


def test_crashed_rank_nobody_waits_for_yet_and_clean_exit_is_nothing():
    job = SyntheticJob(3)
    job.history("0", 2)
    job.op(1, "0", 3, "barrier", "waiting", at="die.py:21", t=T)    # it died inside the barrier
    job.set(1, status="dead", exit={"signal": "SIGSEGV", "code": -11}, died_at=T + 1)
    job.set(2, status="exited", exit={"code": 0})
    f = only(analyze(job.snap(), STALL, T + 100), "dead_rank")
    assert f.rank == 1 and f.missing_ranks == []
    assert f.last_collective["op"] == "barrier" and "die.py:21" in f.summary


def test_a_crash_nobody_waits_for_yet_is_named_once_its_consequences_can_show():
    """Seen dead 1 ms after it crashed, before its peers' collectives with it failed (gloo needs a
    few ms to see the connection close): the finding waits a moment to name them."""
    job = SyntheticJob(2)
    job.history("0", 2)
    job.op(1, "0", 3, "barrier", "waiting", at="die.py:21", t=T)
    job.set(1, status="dead", exit={"signal": "SIGSEGV", "code": -11}, died_at=T + 1)
    assert analyze(job.snap(), STALL, T + 1.001) == []
    f = only(analyze(job.snap(), STALL, T + 1.4), "dead_rank")
    assert f.rank == 1 and "SIGSEGV" in f.summary
    # the launcher ended the others at once (or the files are read after the job): nothing left to wait for
    job.set(0, status="dead", exit={"signal": None, "note": "gone without a trace"}, died_at=T + 1.001)
    f = only(analyze(job.snap(), STALL, T + 1.001), "dead_rank")
    assert f.rank == 1 and "SIGSEGV" in f.summary


def test_rank_that_exited_while_others_wait_for_it():
    job = SyntheticJob(2)
    job.history("0", 3)
    job.op(0, "0", 4, "all_reduce", "waiting", at="train.py:5", t=T)
    job.set(1, status="exited", exit={"code": 1, "exception": "ValueError: bad batch"})
    f = only(analyze(job.snap(), STALL, T + 1), "dead_rank")
    assert f.rank == 1 and "ValueError: bad batch" in f.summary and "rank 0" in f.summary


def test_a_peers_exception_beside_a_segfault_is_its_consequence():
    """Rank 1 segfaults; rank 0's collective with it then fails ("Connection closed by peer", in
    DDP's untraced all-reduce: no failed record) and rank 0 exits with that exception. The
    teacher, rank 2, waits for both. One finding: the segfault, not the exception."""
    job = SyntheticJob(3)
    job.history("0", 3)
    job.op(2, "0", 4, "gather", "waiting", at="teacher.py:9", t=T)
    job.set(1, status="dead", exit={"signal": "SIGSEGV", "code": -11}, died_at=T + 0.2)
    job.set(0, status="exited", exit={"code": 1, "exception": "RuntimeError: Connection closed by peer"})
    f = only(analyze(job.snap(), STALL, T + 1), "dead_rank")
    assert f.rank == 1 and "SIGSEGV" in f.summary


def test_rank_killed_alone_while_the_job_lives_is_a_dead_rank_at_once():
    """Rank 1 was SIGKILLed inside a barrier rank 0 never joins: one finding, its death."""
    job = SyntheticJob(2)
    job.history("0", 1)
    job.op(1, "0", 2, "barrier", "waiting", at="die.py:21", t=T)
    job.set(1, status="dead", exit={"signal": None, "note": "gone without a trace"}, died_at=T + 0.3)
    for now in (T + 1, T + 100):
        f = only(analyze(job.snap(), STALL, now), "dead_rank")
        assert f.rank == 1 and "vanished" in f.summary and "die.py:21" in f.summary


def test_job_killed_as_a_whole_is_no_finding():
    """scancel / Ctrl-C: ranks die together, some of them inside a young all_reduce."""
    job = SyntheticJob(8)
    job.history("0", 3)
    job.op(range(4), "0", 4, "all_reduce", "waiting", t=T)
    for r in range(8):
        job.set(r, status="dead", exit={"signal": None, "note": "gone"}, died_at=T + 1 + r * 0.01)
    assert analyze(job.snap(), STALL, T + 2) == []


def test_teardown_after_one_rank_failed_blames_only_that_rank():
    job = SyntheticJob(4)
    job.history("0", 3)
    job.op([0, 1, 2], "0", 4, "all_reduce", "waiting", at="train.py:250", t=T)
    job.set(3, status="exited", exit={"code": 1, "exception": "RuntimeError: CUDA out of memory"}, died_at=T + 5)
    for r in range(3):   # torchrun ends the others right after
        job.set(r, status="dead", exit={"signal": None, "note": "gone"}, died_at=T + 5.5)
    f = only(analyze(job.snap(), STALL, T + 6), "dead_rank")
    assert f.rank == 3 and f.waiting[0]["ranks"] == [0, 1, 2]
    assert "CUDA out of memory" in f.summary and "train.py:250" in f.summary


def test_ranks_whose_collective_failed_because_a_rank_died_are_named_with_the_error():
    """gloo: the survivors' all_reduce fails with "Connection closed by peer" when rank 2
    segfaults before joining it; rank 0 still waits. One finding, every survivor in it."""
    job = SyntheticJob(4)
    job.history("0", 2)
    job.op([0, 1, 3], "0", 3, "all_reduce", "waiting", at="train.py:59", t=T)
    for r in (1, 3):
        rec = job.entries[r]["records"][-1]
        rec.update(state="failed", returned_at=T + 0.4,
                   error="RuntimeError: [/__w/gloo/transport/tcp/pair.cc:553] "
                         "Connection closed by peer [10.0.0.2]:6566")
    job.set(2, status="dead", exit={"signal": "SIGSEGV", "code": -11}, died_at=T + 0.3,
            stack=frames("kernels.py:41", "fused_op")[:2])
    f = only(analyze(job.snap(), STALL, T + 1), "dead_rank")
    assert f.rank == 2 and f.missing_ranks == [2] and (f.group["name"], f.seq) == ("0", 3)
    assert {r: (e["op"], e["seq"]) for r, e in f.ranks.items() if r != "2"} == {
        "0": ("all_reduce", 3), "1": ("all_reduce", 3), "3": ("all_reduce", 3)}
    assert f.failed == [{"group": "0", "seq": 3, "op": "all_reduce", "p2p": False, "missing": True,
                            "ranks": [1, 3], "error": f.ranks["1"]["error"]}]
    text = f.summary
    assert "rank 0 waiting" in text and "Ranks 1,3 failed in all_reduce #3" in text
    assert "Connection closed by peer [10.0.0.2]:6566" in text and "pair.cc" not in text


def test_dead_rank_finding_says_where_the_other_absent_members_are():
    job = SyntheticJob(4, {"2": ("ipc", range(4))})
    job.history("2", 7, op="gather")
    job.op(3, "2", 8, "gather", "waiting", at="train.py:100", func="serve_teacher", root=3, t=T)
    job.set(1, status="dead", exit={"signal": "SIGSEGV", "code": -11}, died_at=T + 0.1)
    for r in (0, 2):
        job.set(r, stack=frames("train.py:158", "train")[:2], stack_at=T + 0.5)
    f = only(analyze(job.snap(), STALL, T + 1), "dead_rank")
    assert f.rank == 1 and f.also_missing == [0, 2]
    assert f.ranks["0"]["state"] == "not_in_collective" and "train.py:158" in f.summary
    assert "Ranks 0,2 have not entered it either" in f.summary


def test_a_rank_that_died_inside_a_collective_is_what_the_others_wait_for():
    """gloo's SIGABRT on a shape mismatch: rank 1 entered all_reduce #4 and died in it; rank 0
    waits in the same all_reduce for a member that will never finish it."""
    job = SyntheticJob(2)
    job.history("0", 3)
    job.op([0, 1], "0", 4, "all_reduce", "waiting", at="train.py:80", t=T)
    job.set(1, status="dead", exit={"signal": "SIGABRT", "code": -6}, died_at=T + 0.2)
    f = only(analyze(job.snap(), STALL, T + 1), "dead_rank")
    assert f.rank == 1 and f.missing_ranks == [] and f.waiting[0]["ranks"] == [0]
    assert "it died inside it" in f.summary and "rank 0 waiting forever" in f.summary


def digested_gathers(job, digests_by_call, at="train.py:152", shapes=((8, 32),)):
    """Ranks 0-2 gather a batch to rank 3 once per call; digests_by_call[i][rank] is its CRC."""
    for seq, digests in enumerate(digests_by_call, 1):
        job.op([0, 1, 2, 3], "2", seq, "gather", at=at, root=3, shapes=shapes, dtypes=("int64",))
        for r in range(4):
            job.entries[r]["records"][-1]["digest"] = digests.get(r, "0000aaaa")
    for r in range(4):
        job.entries[r]["digests"] = True
    return job


def test_identical_batches_from_every_sender_are_duplicate_data_not_a_hang():
    job = digested_gathers(SyntheticJob(4, {"2": ("ipc", range(4))}), [{0: "c0ffee", 1: "c0ffee", 2: "c0ffee"}] * 4)
    f = only(analyze(job.snap(), STALL, T + 50), "duplicate_data")
    assert f.kind not in HANG_KINDS
    assert f.group["name"] == "2" and sorted(f.ranks) == ["0", "1", "2"] and f.missing_ranks == []
    assert (f.identical_calls, f.calls, f.seqs) == (4, 4, [1, 2, 3, 4])
    for needle in ("ranks 0-2 sent byte-identical 8x32 int64", "gather on group 2 (ipc", "train.py:152",
                   "DistributedSampler"):
        assert needle in f.summary, (needle, f.summary)


@pytest.mark.parametrize("case", ["different", "too_few", "tiny", "one_sender_unseen", "digests_off"])
def test_duplicate_data_needs_a_pattern_of_real_batches(case):
    same = {0: "c0ffee", 1: "c0ffee", 2: "c0ffee"}
    calls = {"different": [same, same, {0: "1", 1: "2", 2: "3"}, {0: "4", 1: "5", 2: "6"}],
             "too_few": [same, same]}.get(case, [same] * 4)
    job = digested_gathers(SyntheticJob(4, {"2": ("ipc", range(4))}), calls,
                           shapes=((1,),) if case == "tiny" else ((8, 32),))
    if case == "one_sender_unseen":
        for e in job.entries[2]["records"]:
            e.pop("digest")
        job.entries[2]["records"] = job.entries[2]["records"][:1]
    if case == "digests_off":
        for r in range(4):
            job.entries[r].pop("digests")
    assert analyze(job.snap(), STALL, T + 50) == []


# -- p2p ------------------------------------------------------------------------------------------
def test_unmatched_recv_when_the_peer_never_sends():
    job = SyntheticJob(2)
    for n in (1, 2):
        job.op(0, "0", n, "send", at="pipe.py:30", p2p=True, peer=1)
        job.op(1, "0", n, "recv", at="pipe.py:40", p2p=True, peer=0)
    job.op(1, "0", 3, "recv", "waiting", at="pipe.py:40", func="recv_act", p2p=True, peer=0, t=T)
    job.set(0, stack=frames("pipe.py:77", "skip_microbatch")[:2])
    f = only(analyze(job.snap(), STALL, T + 31), "unmatched_p2p")
    assert f.rank == 1 and f.peer == 0 and f.posted == 2 and f.missing_ranks == [0]
    assert "pipe.py:40" in f.summary and "pipe.py:77" in f.summary


def test_p2p_is_not_claimed_unmatched_when_the_peer_window_is_too_short():
    job = SyntheticJob(2)
    job.op(0, "0", 1, "all_reduce")
    job.op(1, "0", 1, "all_reduce")
    job.op(1, "0", 9, "recv", "waiting", p2p=True, peer=0, t=T)
    snap = job.snap()
    for rec in snap["ranks"]["0"]["records"]:
        rec["id"] += 500               # rank 0's older records fell out of the window
    f = only(analyze(snap, STALL, T + 40))
    assert f.kind == "stall" and f.stage == "unverified" and f.missing_ranks == []


def test_matched_p2p_under_way_gives_nothing():
    job = SyntheticJob(2)
    job.op(0, "0", 1, "send", "waiting", p2p=True, peer=1, t=T)
    job.op(1, "0", 1, "recv", "waiting", p2p=True, peer=0, t=T)
    assert analyze(job.snap(), STALL, T + 5) == []


def test_object_p2p_is_matched_like_p2p_not_counted_as_a_collective():
    """send_object_list is recorded on the group with its peer as root, without p2p numbering."""
    job = SyntheticJob(2)
    job.op([0, 1], "0", 1, "all_reduce")
    job.op(0, "0", 2, "send_object_list", "waiting", backend_op="send", root=1, at="ipc.py:9", t=T)
    assert analyze(job.snap(), STALL, T + 5) == []                   # young: nothing
    job.set(1, stack=frames("serve.py:14", "poll")[:2])
    f = only(analyze(job.snap(), STALL, T + 40), "unmatched_p2p")    # rank 1 never receives it
    assert f.rank == 0 and f.peer == 1 and "serve.py:14" in f.summary


def test_members_absent_from_the_snapshot_are_named_not_guessed():
    job = SyntheticJob(4)
    job.op([0, 1], "0", 1, "all_reduce", "waiting", t=T)
    snap = job.snap()
    del snap["ranks"]["2"], snap["ranks"]["3"]      # another host's watchdog has not reported
    assert analyze(snap, STALL, T + 10) == []
    f = only(analyze(snap, STALL, T + 40), "stall")
    assert f.missing_ranks == [] and f.unknown_ranks == [2, 3]
    assert "no trace" in f.summary


def test_in_flight_record_behind_a_completed_later_number_is_done():
    job = SyntheticJob(2)
    job.op([0, 1], "0", 1, "all_reduce", "in_flight", t=T - 500)   # its completion was not seen
    job.op([0, 1], "0", 2, "all_reduce", t=T - 400)
    assert analyze(job.snap(), STALL, T + 100) == []


def test_batch_p2p_exchange_waiting_on_a_peer_that_never_joins():
    job = SyntheticJob(2)
    job.op([0, 1], "0", 1, "batch_isend_irecv", p2p=True, peer=None)
    job.entries[0]["records"][-1]["peer"] = 1
    job.entries[1]["records"][-1]["peer"] = 0
    job.op(0, "0", 2, "batch_isend_irecv", "in_flight", at="pp.py:61", func="exchange", p2p=True, peer=1, t=T)
    job.set(1, stack=frames("pp.py:90", "last_stage")[:2])
    f = only(analyze(job.snap(), STALL, T + 31), "unmatched_p2p")
    assert f.rank == 0 and f.peer == 1 and f.posted == 1 and "pp.py:90" in f.summary


def test_failed_collectives_are_checked_for_mismatches_too():
    """gloo raised on both sides (sizes differ): nothing is pending any more, the cause stays."""
    job = SyntheticJob(2)
    job.op(0, "0", 1, "all_reduce", "failed", at="train.py:7", shapes=[(10,)])
    job.op(1, "0", 1, "all_reduce", "failed", at="train.py:7", shapes=[(12,)])
    f = only(analyze(job.snap(), STALL, T), "mismatch")
    assert f.differs == ["shapes"] and f.seq == 1


def test_untraced_collectives_just_before_a_stall_are_mentioned():
    job = SyntheticJob(2)
    job.op([0, 1], "0", 1, "all_reduce")
    job.op(0, "0", 2, "untraced", seq_end=5, count=4)
    job.op(0, "0", 6, "all_reduce", "waiting", at="train.py:300", t=T)
    f = only(analyze(job.snap(), STALL, T + 31), "stall")
    assert f.untraced_before[0]["count"] == 4 and "4 untraced collective" in f.summary


def test_text_of_an_unknown_kind_and_of_a_bare_finding_does_not_fail():
    assert "weird" in report_mod.paragraph(Finding.from_json({"kind": "weird", "seq": 3, "group": {"name": "0"}}))
    assert stacks.render_stack_classes(Finding.from_json({"kind": "stall"})) == ""
    assert "colltrace: 1 finding" in render_report([Finding.from_json({"kind": "stall", "ranks": {"x": 1}})])


# -- robustness ---------------------------------------------------------------------------------
def test_unreadable_and_malformed_ranks_do_not_stop_the_analysis():
    job = seed_story()
    job.n = 10
    snap = job.snap()
    snap["ranks"]["8"] = {"rank": 8, "status": "unreadable", "error": "ring header corrupt"}
    snap["ranks"]["9"] = {"rank": 9, "status": "alive", "records": 5, "progress": "x"}
    snap["ranks"]["10"] = "not even a table"
    snap["ranks"]["3"]["records"][-1]["frames"] = [{"no": "file"}, 7]
    f = only(analyze(snap, STALL, T + 2), "deadlock")
    assert f.unreadable_ranks == [8, 9, 10]
    assert "ring header corrupt" in f.unreadable["8"]
    assert "Could not read ranks 8-10" in f.summary
    render_report([f])


def test_missing_record_fields_are_survived():
    job = SyntheticJob(3)
    job.op([0, 1], "0", 1, "all_reduce", "waiting", t=T)
    snap = job.snap()
    del snap["ranks"]["0"]["records"][0]["group"]       # this rank becomes unreadable
    snap["groups"]["0"]["ranks"] = None                  # members inferred from the ranks
    snap["ranks"]["2"]["progress"] = {"0": {"entered": "x"}}
    findings = analyze(snap, STALL, T + 60)
    assert all(f.unreadable_ranks == [0] for f in findings)
    render_report(findings)


def test_garbage_input_gives_no_findings():
    assert analyze({}, STALL, T) == []
    assert analyze({"ranks": [], "groups": 3}, STALL, T) == []
    assert analyze(None, STALL, T) == []


def test_deterministic_whatever_the_order_of_the_input():
    snap = seed_story().snap()
    a = analyze(snap, STALL, T + 40)
    items = list(snap["ranks"].items())
    random.Random(4).shuffle(items)
    snap["ranks"] = dict(items)
    b = analyze(snap, STALL, T + 40)
    a, b = [f.to_json() for f in a], [f.to_json() for f in b]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert json.loads(json.dumps(a)) == a           # plain JSON data


def test_every_kind_the_analyzer_makes_round_trips_through_its_json():
    """findings.jsonl, `analyze --json` and the store carry to_json(); what is read back with
    from_json() is the same finding, and gives the same JSON, key order included."""
    made = []
    job = SyntheticJob(4)   # a mismatch
    job.history("0", 2)
    job.op([0, 1, 2], "0", 3, "all_reduce", "waiting", at="train.py:250", func="step", t=T)
    job.op(3, "0", 3, "broadcast", "waiting", at="eval.py:77", func="sync_eval", t=T, root=3)
    made += analyze(job.snap(), STALL, T + 0.01)
    made += analyze(seed_story().snap(), STALL, T + 2)   # a deadlock
    job = SyntheticJob(4)   # a dead rank
    job.history("0", 6)
    job.op([0, 1, 2], "0", 7, "all_reduce", "waiting", at="train.py:250", t=T)
    job.set(3, status="dead", exit={"signal": "SIGSEGV", "code": -11}, died_at=T - 1,
            stack=frames("kernels.py:41", "fused_op")[:2])
    made += analyze(job.snap(), STALL, T + 2)
    job = SyntheticJob(4)   # a stall everyone entered
    job.history("0", 2)
    job.op(range(4), "0", 3, "all_reduce", "in_flight", at="train.py:99", t=T)
    made += analyze(job.snap(), STALL, T + 45)
    job = SyntheticJob(2)   # an unmatched recv
    for n in (1, 2):
        job.op(0, "0", n, "send", at="pipe.py:30", p2p=True, peer=1)
        job.op(1, "0", n, "recv", at="pipe.py:40", p2p=True, peer=0)
    job.op(1, "0", 3, "recv", "waiting", at="pipe.py:40", func="recv_act", p2p=True, peer=0, t=T)
    made += analyze(job.snap(), STALL, T + 31)
    job = SyntheticJob(2)   # a p2p stall whose peer cannot be checked
    job.op(0, "0", 1, "all_reduce")
    job.op(1, "0", 1, "all_reduce")
    job.op(1, "0", 9, "recv", "waiting", p2p=True, peer=0, t=T)
    snap = job.snap()
    for rec in snap["ranks"]["0"]["records"]:
        rec["id"] += 500
    made += analyze(snap, STALL, T + 40)
    job = digested_gathers(SyntheticJob(4, {"2": ("ipc", range(4))}), [{0: "c0ffee", 1: "c0ffee", 2: "c0ffee"}] * 4)
    made += analyze(job.snap(), STALL, T + 50)   # duplicate data
    kinds = {(f.kind, getattr(f, "stage", None)) for f in made}
    assert kinds >= {("mismatch", None), ("deadlock", None), ("dead_rank", None), ("stall", "completion"),
                     ("stall", "unverified"), ("unmatched_p2p", None), ("duplicate_data", None)}, kinds
    for f in made:
        d = json.loads(json.dumps(f.to_json()))
        g = Finding.from_json(d)
        assert type(g) is type(f) and g == f and g.extra == {}
        assert g.to_json() == d and list(g.to_json()) == list(d)


def test_findings_survive_a_json_round_trip_for_the_text():
    f = analyze(seed_story().snap(), STALL, T + 2)[0]
    g = Finding.from_json(json.loads(json.dumps(f.to_json())))
    assert report_mod.paragraph(g) == f.summary
    assert stacks.render_stack_classes(g) == stacks.render_stack_classes(f)


def test_the_analyzer_says_facts_and_the_reporter_the_words():
    """analysis.analyze leaves "summary" and "advice" empty; summarize writes them on copies (the
    analyzer's findings stay facts), the same paragraph a finding read back from JSON gets."""
    facts = analysis.analyze(seed_story().snap(), STALL, T + 2)
    assert facts and all(f.summary == "" and f.advice == "" for f in facts)
    worded = summarize(facts)
    assert all(f.summary == "" and f.advice == "" for f in facts)
    assert worded[0].summary == report_mod.paragraph(worded[0]) and worded[0].advice
    assert worded == analyze(seed_story().snap(), STALL, T + 2)


# -- the text ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("ranks, text", [
    ([0, 1, 2, 3, 5, 7, 8], "0-3,5,7-8"), ([], ""), ([4], "4"), ([3, 1, 2, 2], "1-3"), ([0, 2, 4], "0,2,4"),
])
def test_format_ranks(ranks, text):
    assert format_ranks(ranks) == text


def test_user_location_skips_torch_colltrace_and_stdlib_frames():
    mark = origins.Origins(ROOTS).annotate
    assert locations.user_location(mark(frames("checkpoint.py:302", "save"))) == "checkpoint.py:302 (save)"
    ctypes_frame = {"file": "/usr/lib/python3.11/ctypes/__init__.py", "line": 519, "func": "string_at"}
    lib_frame = {"file": "/venv/lib/python3.11/site-packages/lightning/strategy.py", "line": 7, "func": "barrier"}
    assert locations.user_location(mark(frames("model.py:41", "crash")[:2] + [ctypes_frame])) == "model.py:41 (crash)"
    # through a framework: the user's line first, then the framework's call it went through
    assert (locations.user_location(mark(frames("model.py:41")[:2] + [lib_frame, TORCH]))
            == "model.py:41 (f) calling lightning.barrier() (strategy.py:7)")
    assert (locations.user_location(mark([lib_frame, TORCH]))
            == "lightning's strategy.py:7 (barrier) (no frame of your code on the stack)")
    assert (locations.user_location(mark([TORCH]))
            == "distributed_c10d.py:4000 (barrier) (no frame of your code on the stack)")
    assert locations.user_location([]) is None


@pytest.mark.parametrize("home", ["/home/u/colltrace", "/home/u/torch", "/home/u/lib/python3.11", "/srv/lib/python3"])
def test_a_project_in_a_folder_named_like_torch_colltrace_or_lib_is_the_users(home):
    """Origins come from the rank's roots, not from words in the path."""
    o = origins.Origins(ROOTS)
    assert o.classify(f"{home}/train.py") == ("user", None)
    assert o.classify(f"{home}/colltrace/torch/lib/python3.11/model.py") == ("user", None)
    assert o.classify(TORCH["file"]) == ("internal", "torch")
    assert o.classify(COLLTRACE["file"]) == ("internal", "colltrace")
    assert o.classify("/usr/lib/python3.11/ctypes/__init__.py") == ("internal", "python")
    assert o.classify("/venv/lib/python3.11/site-packages/accelerate/accelerator.py") == ("framework", "accelerate")
    mine = origins.Origins(dict(ROOTS, user_packages=["accelerate"]))
    assert mine.classify("/venv/lib/python3.11/site-packages/accelerate/accelerator.py") == ("user", None)


def test_stack_classes_group_ranks_with_the_same_stack_into_ranges():
    f = analyze(seed_story().snap(), STALL, T + 2)[0]
    text = stacks.render_stack_classes(f)
    lines = text.splitlines()
    row = next(line for line in lines if "ranks 0-6:" in line)
    assert "checkpoint.py:302 (save)" in row and "barrier #5" in row and "train.py:900 (main)" in row
    assert row.index("train.py") < row.index("checkpoint.py") < row.index("barrier")
    assert any("rank 7:" in line and "distill.py:88" in line for line in lines)


def test_render_report():
    assert render_report([]) == "colltrace: no findings"
    findings = analyze(seed_story().snap(), STALL, T + 2)
    text = render_report(findings)
    assert findings[0].summary in text and "ranks 0-6:" in text


def test_long_rank_lists_are_abbreviated_in_prose_not_in_data():
    n = 4096
    job = SyntheticJob(n, {"1": ("dp", range(0, n, 8))})
    job.op([r for r in range(0, n, 8) if r != 8], "1", 1, "all_reduce", "waiting", t=T)
    f = only(analyze(job.snap(), STALL, T + 31), "stall")
    assert len(f.ranks) == n // 8 and f.missing_ranks == [8]
    assert len(f.summary) < 1500
    assert "every 8" in f.summary


# -- who to look at first, when no majority can tell ---------------------------------------------------------
@pytest.mark.parametrize("odd", [0, 1])
def test_one_against_one_blames_the_rank_that_left_its_own_pattern(odd):
    """2 ranks: one alone enters a barrier in a rank-conditional branch while the other does its
    ordinary training call. The job's history, not a coin toss, says which one to look at."""
    job = SyntheticJob(2).history("0", 6)
    job.op(odd, "0", 7, "barrier", "waiting", at="model.py:42", func="training_step", t=T)
    job.op(1 - odd, "0", 7, "all_reduce", "waiting", at="train.py:10", func="step", t=T)
    f = only(analyze(job.snap(), STALL, T + 1), "mismatch")
    assert f.look_first["rank"] == odd and f.look_first["reason"] == "left"
    assert f.look_first["user_frame"] == 1 and f.look_first["framework_frame"] is None
    assert [x["origin"] for x in f.ranks[str(odd)]["frames"]] == ["user", "user", "internal", "internal"]
    assert f.advice.startswith("Look first at model.py:42 (training_step)"), f.advice
    assert f"rank {odd} calls barrier where rank {1 - odd} calls all_reduce" in f.advice
    assert (f"In earlier iterations rank {odd} made another call at this point: it left its own pattern, while "
            f"rank {1 - odd} keeps to its own.") in f.advice


def test_one_against_one_without_history_shows_both_sides_equally():
    job = SyntheticJob(2)
    job.op(0, "0", 1, "barrier", "waiting", at="model.py:42", func="training_step", t=T)
    job.op(1, "0", 1, "all_reduce", "waiting", at="train.py:10", func="step", t=T)
    f = only(analyze(job.snap(), STALL, T + 1), "mismatch")
    assert f.look_first["rank"] is None and f.look_first["reason"] == "undecided"
    assert [s["ranks"] for s in f.look_first["sides"]] == [[0], [1]]
    assert ("Look first at both sides of collective #1 on group 0: rank 0 calls barrier at model.py:42 "
            "(training_step), called from train.py:900 (main); rank 1 calls all_reduce at train.py:10 "
            "(step)") in f.advice
    assert "Neither the job's history nor a majority tells" in f.advice


def test_a_deadlock_blames_the_waiter_that_left_its_pattern_not_the_rank_at_its_routine_call():
    """Rank 0 alone enters a barrier on the training group (a branch), rank 1 sits in its usual
    all-reduce on the other group: rank 0 is the odd one."""
    job = SyntheticJob(2, {"1": ("data", [0, 1])}).history("0", 5).history("1", 5)
    job.op(0, "0", 6, "barrier", "waiting", at="model.py:42", func="training_step", t=T)
    job.op(1, "1", 6, "all_reduce", "waiting", at="train.py:10", func="step", t=T)
    f = only(analyze(job.snap(), STALL, T + 40), "deadlock")
    assert f.look_first["rank"] == 0 and f.look_first["reason"] == "left"
    assert f.advice.startswith("Look first at model.py:42 (training_step)"), f.advice


def test_the_ranks_that_keep_their_pattern_keep_to_theirs():
    """Ranks 1-2 at their routine all-reduce, rank 0 alone in a barrier: the sentence ends whole."""
    job = SyntheticJob(3, {"1": ("data", [0, 1, 2])}).history("0", 5).history("1", 5)
    job.op(0, "0", 6, "barrier", "waiting", at="model.py:42", func="training_step", t=T)
    for r in (1, 2):
        job.op(r, "1", 6, "all_reduce", "waiting", at="train.py:10", func="step", t=T)
    f = only(analyze(job.snap(), STALL, T + 40), "deadlock")
    assert f.advice.endswith("it left its own pattern, while ranks 1-2 keep to theirs."), f.advice


def test_user_packages_setting_reaches_the_recorded_roots():
    from colltrace import config

    s = config.load({"COLLTRACE": "1", "COLLTRACE_USER_PACKAGES": " mylib, other_lib ,bad-name"})
    assert s.user_packages == ("mylib", "other_lib") and any("bad-name" in w for w in s.warnings)
    roots = origins.local_roots(s.user_packages)
    assert roots["user_packages"] == ["mylib", "other_lib"]
    import pytest as installed  # an installed package: a framework, unless named as the user's
    path = installed.__file__
    assert origins.Origins(origins.local_roots()).classify(path) == ("framework", "pytest")
    assert origins.Origins(origins.local_roots(["pytest"])).classify(path) == ("user", None)
    assert origins.Origins(origins.local_roots()).classify(origins.__file__) == ("internal", "colltrace")
    assert origins.Origins(origins.local_roots()).classify(json.__file__) == ("internal", "python")
