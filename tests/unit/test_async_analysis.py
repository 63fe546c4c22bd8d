"""The analyzer on NCCL's shapes (../shared/notes/nccl-audit.md's simulations, D1, D2, D6): the CPU
ran ahead through several collectives, ranks parked in waits, the backend's timeout or NCCL's
watchdog ended the job, functional collectives whose completion nothing reports. Synthetic
snapshots, as tests/unit/test_analysis.py builds them."""
from __future__ import annotations

from helpers.synthetic import STALL, SyntheticJob, T, analyze, frames, only


def run_ahead(job: SyntheticJob, ranks, t=T, stuck=5, parked=None, waiting_next=False):
    """NCCL: all_reduce #stuck, #stuck+1, #stuck+2 enqueued at once (in flight); optionally parked
    in a wait on the first (parked: when), or run ahead into a blocking call (#stuck+3 waiting)."""
    for i in range(3):
        job.op(ranks, "0", stuck + i, "all_reduce", "in_flight", at=f"checkpoint.py:{300 + i}", func="load",
               t=t + .01 * i)
    if parked is not None:
        for r in ranks:
            rec = next(x for x in job.entries[r]["records"] if x["seq"] == stuck and x["group"] == "0")
            rec["wait"] = {"since": parked, "frames": frames("checkpoint.py:310", "load"), "thread": "MainThread"}
    if waiting_next:
        job.op(ranks, "0", stuck + 3, "all_gather_object", "waiting", at="checkpoint.py:320", func="save", t=t + .05)
    return job


def seed(rank7="absent") -> SyntheticJob:
    job = SyntheticJob(8, {"1": ("training", range(7)), "2": ("ipc", range(8))})
    job.history("0", 4).history("1", 20).history("2", 11, op="gather")
    if rank7 == "gather":
        job.op(7, "2", 12, "gather", "in_flight", at="distill.py:88", func="gather_batch", t=T - 16, root=7)
        rec = job.entries[7]["records"][-1]
        rec["wait"] = {"since": T - 15, "frames": frames("distill.py:89", "gather_batch"), "thread": "MainThread"}
    elif rank7 == "same":
        job.op(7, "0", 5, "gather", "waiting", at="distill.py:88", func="gather_batch", t=T, root=7)
    return job


def test_run_ahead_is_one_stall_at_the_oldest_collective_not_one_per_queued_op():
    job = run_ahead(seed(), range(7))
    job.set(7, stack=frames("eval.py:12", "evaluate")[:2])
    f = only(analyze(job.snap(), STALL, T + 31), "stall")
    assert (f.group["name"], f.seq, f.missing_ranks) == ("0", 5, [7])
    assert [q["seq"] for q in f.ranks["0"]["queued"]] == [6, 7]
    assert "checkpoint.py:300" in f.summary and "queued behind it" in f.summary


def test_a_mismatch_at_the_stuck_number_stands_alone_after_the_threshold():
    job = run_ahead(seed("same"), range(7))
    f = only(analyze(job.snap(), STALL, T + 40), "mismatch")
    assert f.seq == 5 and [c["op"] for c in f.classes] == ["all_reduce", "gather"]


def test_running_ahead_into_a_blocking_call_names_the_stuck_collective_not_the_blocking_one():
    job = run_ahead(seed("gather"), range(7), waiting_next=True)
    f = only(analyze(job.snap(), STALL, T + 1), "deadlock")
    assert f.key == "deadlock:0#5,2#12" and f.seq == 5
    assert f.look_first["key"] == "0#5" and "checkpoint.py:300" in f.advice
    assert "checkpoint.py:320" in f.summary   # where they park: the blocking call queued behind it
    assert f.summary.split(" Look first")[0].count("checkpoint.py:300") == 1


def test_ranks_parked_in_a_wait_make_a_cycle_certain_at_once():
    job = run_ahead(seed("gather"), range(7), parked=T + .1)
    f = only(analyze(job.snap(), STALL, T + 1), "deadlock")
    assert f.key == "deadlock:0#5,2#12"
    assert 310 in [x["line"] for x in f.ranks["0"]["parked"]["frames"]]


def test_run_ahead_without_a_wait_is_not_yet_a_deadlock():
    """In flight only (the ranks may still be computing, and join later): certain only once parked."""
    assert analyze(run_ahead(seed("gather"), range(7)).snap(), STALL, T + 1) == []


def ended_by(job: SyntheticJob, ranks, how, t_end):
    for r in ranks:
        e = job.entries[r]
        if how == "timeout":   # gloo: the wait raised "Timed out waiting", the rank exited with it
            for rec in e["records"]:
                if rec["state"] == "in_flight" and rec["group"] in ("0", "2") and rec["seq"] in (5, 12):
                    rec.update(state="failed", failed_at=t_end,
                               error="RuntimeError: [../gloo/unbound_buffer.cc:78] "
                                     "Timed out waiting 600000ms for recv operation to complete")
            e.update(status="exited", died_at=t_end + .1,
                     exit={"code": 1, "exception": "RuntimeError: Timed out waiting 600000ms"})
        else:   # NCCL's watchdog: SIGABRT, nothing written after
            e.update(status="dead", died_at=t_end, exit={"signal": "SIGABRT", "code": -6})
    return job


def test_after_the_backends_timeout_the_hang_is_still_named_and_the_endings_are_its_consequence():
    job = ended_by(run_ahead(seed("gather"), range(7), parked=T + .1), range(8), "timeout", T + 600)
    f = only(analyze(job.snap(), STALL, T + 650), "deadlock")
    assert f.key == "deadlock:0#5,2#12"
    assert f.ranks["0"]["ended"] == "timeout" and f.waited_s == 616.0
    assert "The backend's timeout then ended the wait" in f.summary and "exited with code 1" in f.summary


def test_after_ncclss_watchdog_abort_the_hang_is_named_not_eight_dead_ranks():
    job = run_ahead(seed("gather"), range(7), parked=T + .1)
    for g in job.groups.values():
        g["timeout_s"] = 600.0
    job = ended_by(job, range(8), "abort", T + 601)
    f = only(analyze(job.snap(), STALL, T + 650), "deadlock")
    assert f.key == "deadlock:0#5,2#12" and f.ranks["7"]["ended"] == "abort"
    assert "NCCL's watchdog then aborted" in f.summary


def test_a_sigabrt_long_before_the_groups_timeout_is_a_crash_of_its_own():
    job = run_ahead(seed("gather"), range(7), parked=T + .1)
    for g in job.groups.values():
        g["timeout_s"] = 600.0
    job = ended_by(job, [7], "abort", T + 2)
    fs = analyze(job.snap(), STALL, T + 3)
    assert [f.kind for f in fs] == ["dead_rank"] and fs[0].rank == 7


def test_an_unobserved_functional_collective_is_never_the_collective_itself_hung():
    """A funcol all_reduce on a tensor-parallel group that nobody waited on, then 30 s of nothing
    on that group (eval, a checkpoint): nothing says it is hung."""
    job = SyntheticJob(2, {"1": ("tp", [0, 1])})
    job.history("0", 3).history("1", 39)
    job.op([0, 1], "1", 40, "funcol.all_reduce", "in_flight", at="model.py:20", t=T)
    for r in (0, 1):
        job.entries[r]["records"][-1]["unobserved"] = True
    assert analyze(job.snap(), STALL, T + 45) == []
    # waited on, and not done: that is a hang
    for r in (0, 1):
        job.entries[r]["records"][-1]["wait"] = {"since": T + 1, "frames": frames("model.py:21"),
                                                 "thread": "MainThread"}
    f = only(analyze(job.snap(), STALL, T + 45), "stall")
    assert f.stage == "completion" and f.seq == 40


def test_work_every_member_entered_is_not_hung_while_its_ranks_moved_on():
    job = SyntheticJob(2)
    job.history("0", 3)
    job.op([0, 1], "0", 4, "all_reduce", "in_flight", at="train.py:50", t=T)
    job.op([0, 1], "0", 5, "barrier", "completed", at="train.py:60", t=T + 40)
    job.entries[0]["progress"]["0"]["completed"] = 3   # #4's completion not (yet) seen
    job.entries[1]["progress"]["0"]["completed"] = 3
    assert analyze(job.snap(), STALL, T + 41) == []


def test_a_peer_that_fails_because_the_first_rank_timed_out_is_part_of_the_ending():
    """gloo: rank 0 times out first and leaves; rank 1's waits then fail with "Connection closed by
    peer". Both endings are the hang's consequence: the cycle is named, not rank 1 as a dead rank."""
    job = SyntheticJob(2, {"1": ("ipc", [0, 1])})
    job.history("0", 1).history("1", 1)
    job.op(0, "0", 2, "all_reduce", "in_flight", at="train.py:15", t=T)
    job.op(1, "1", 2, "gather", "in_flight", at="serve.py:12", t=T, root=1)
    for r, err, t in ((0, "RuntimeError: Timed out waiting 4000ms for recv operation to complete", T + 4),
                      (1, "RuntimeError: [../gloo/pair.cc:534] Connection closed by peer [127.0.0.1]:6000", T + 4.2)):
        rec = job.entries[r]["records"][-1]
        rec.update(state="failed", failed_at=t, error=err,
                   wait={"since": T + .01, "frames": frames("train.py:16"), "thread": "MainThread"})
        job.set(r, status="exited", died_at=t + .1, exit={"code": 1, "exception": err})
    f = only(analyze(job.snap(), STALL, T + 5), "deadlock")
    assert f.key == "deadlock:0#2,1#2" and f.ranks["1"]["ended"] == "timeout"


def test_gpu_work_queued_ahead_is_not_the_collective_hung():
    """CUDA: each member's start event (recorded before the call) tells whether its GPU reached the
    collective. One whose GPU has not is stuck on the work queued ahead, not in the collective."""
    job = SyntheticJob(2)
    job.history("0", 3)
    job.op([0, 1], "0", 4, "all_reduce", "in_flight", at="train.py:50", t=T)
    for r in (0, 1):
        rec = job.entries[r]["records"][-1]
        rec.update(start_event=True, started_at=T + .001 if r == 0 else None,
                   wait={"since": T + .1, "frames": frames("train.py:51"), "thread": "MainThread"})
    f = only(analyze(job.snap(), STALL, T + 40), "stall")
    assert f.stage == "completion" and f.not_started == [1]
    assert "has not reached it" in f.summary and "itself is hung" not in f.summary
    job.entries[1]["records"][-1]["started_at"] = T + .002
    f = only(analyze(job.snap(), STALL, T + 40), "stall")
    assert f.not_started is None and "the collective itself is hung" in f.summary
