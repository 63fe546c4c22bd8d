"""End to end: `COLLTRACE=1 torchrun` on 4 gloo ranks with the default (30-minute) timeouts.
Each hang is named by the watchdog within seconds, with the group, the number, the ranks, the
ops and the user's own file:line; COLLTRACE_ON_HANG=abort then ends the job."""
from __future__ import annotations

import pytest
import torch

from helpers.jobs import frames_line, fsdp2, loc, native

NATIVE = native()
FSDP2 = fsdp2()   # the job shards with FSDP2 where torch has it public (2.6+)

pytestmark = pytest.mark.slow
SCRIPT = "scenarios.py"


def run(torchrun_job, scenario, stall_s=2.0, timeout=120, **env):
    job = torchrun_job(SCRIPT, 4, args=[scenario],
                       env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": str(stall_s), **env})
    rc = job.wait(timeout)
    return job, rc


def entered_last(finding, ranks) -> float:
    return max(finding["ranks"][str(r)]["entered_at"] for r in ranks if finding["ranks"][str(r)].get("entered_at"))


def test_op_mismatch(torchrun_job):
    job, rc = run(torchrun_job, "mismatch")
    assert rc != 0
    (f,) = [f for f in job.findings() if f["kind"] == "mismatch"]
    assert f["group"]["ranks"] == [0, 1, 2, 3] and f["seq"] == 3
    assert {f["ranks"][str(r)]["op"] for r in (0, 1, 2)} == {"all_reduce"} and f["ranks"]["3"]["op"] == "all_gather"
    assert loc("odd_op") in frames_line(f["ranks"]["3"]) and loc("common_op") in frames_line(f["ranks"]["0"])
    assert loc("odd_op") in f["summary"]
    assert f["detected_at"] - entered_last(f, range(4)) < 2.0
    assert "mismatch" in job.err.lower()


def test_broadcast_root_mismatch(torchrun_job):
    job, rc = run(torchrun_job, "root_mismatch")
    (f,) = [f for f in job.findings() if f["kind"] == "mismatch"]
    assert f["ranks"]["2"]["root"] == 1 and f["ranks"]["0"]["root"] == 0
    assert "root" in f["summary"].lower() or "src" in f["summary"].lower()


def test_cross_group_deadlock_of_a_checkpoint_barrier_and_a_teacher(torchrun_job):
    job, rc = run(torchrun_job, "deadlock")
    assert rc != 0
    (f,) = [f for f in job.findings() if f["kind"] == "deadlock"]
    r = f["ranks"]
    assert {r[str(i)]["op"] for i in (0, 1, 2)} == {"barrier"} and r["3"]["op"] == "gather"
    assert loc("ckpt_barrier") in frames_line(r["0"]) and loc("teacher_gather") in frames_line(r["3"])
    assert loc("ckpt_barrier") in f["summary"] and loc("teacher_gather") in f["summary"]
    assert f["detected_at"] - entered_last(f, range(4)) < 2.0
    assert not [x for x in job.findings() if x["kind"] == "stall"]


def test_dead_rank(torchrun_job):
    job, rc = run(torchrun_job, "dead_rank", stall_s=60)
    assert rc != 0
    dead = [f for f in job.findings() if f["kind"] == "dead_rank"]
    assert dead, job.err[-3000:]
    f = dead[0]
    assert f["ranks"]["2"]["state"] == "dead" and f["ranks"]["2"]["exit"]["signal"] == "SIGSEGV"
    assert loc("segfault") in frames_line(f["ranks"]["2"])
    # On gloo the survivors' all_reduce fails ("Connection closed by peer") or waits; either
    # way the finding names each of them at the collective the dead rank never joined.
    for r in ("0", "1", "3"):
        assert f["ranks"][r]["op"] == "all_reduce" and f["ranks"][r]["seq"] == 3, f["ranks"][r]
        assert loc("survivors_wait") in frames_line(f["ranks"][r])
    assert loc("segfault") in f["summary"]


def test_stall_names_where_the_missing_rank_is(torchrun_job):
    job, rc = run(torchrun_job, "stall", stall_s=2)
    assert rc != 0
    (f,) = [f for f in job.findings() if f["kind"] == "stall"]
    assert f["missing_ranks"] == [3] and f["seq"] == 3
    assert f["ranks"]["3"]["state"] == "not_in_collective"
    assert loc("sleeping") in frames_line(f["ranks"]["3"])   # its live stack, from py-spy
    assert loc("stall_barrier") in frames_line(f["ranks"]["0"])
    # the threshold runs from the first rank to wait (it has waited longest)
    waited = f["detected_at"] - min(f["ranks"][str(r)]["entered_at"] for r in (0, 1, 2))
    assert 2.0 <= waited < 4.0


def test_unmatched_recv(torchrun_job):
    job, rc = run(torchrun_job, "p2p", stall_s=2)
    found = [f for f in job.findings() if f["kind"] in ("unmatched_p2p", "stall")]
    assert found, job.err[-3000:]
    f = found[0]
    assert f["ranks"]["0"]["op"] == "recv" and 1 in f["missing_ranks"]
    assert loc("lonely_recv") in frames_line(f["ranks"]["0"])


def test_a_slow_rank_under_the_threshold_is_no_finding(torchrun_job):
    job, rc = run(torchrun_job, "slow_ok", stall_s=10, SLOW_S="3")
    assert rc == 0 and job.findings() == []
    assert job.out.count("DONE") == 4


def test_healthy_ddp_fsdp2_dtensor_dcp_give_no_finding(torchrun_job, tmp_path):
    job = torchrun_job("healthy_frameworks.py", 2, args=[tmp_path / "ckpt"],
                       env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "2"})
    assert job.wait(180) == 0, job.err[-3000:]
    assert job.out.count("DONE") == 2
    assert job.findings() == []
    from colltrace.tracefile import reader

    records = [r for tr in reader.load_traces(job.dir) for r in tr.all_records()]
    ops = {r["op"] for r in records}
    assert "scatter" in ops   # DTensor was traced
    if FSDP2:   # and FSDP2, through torch 2.13's new names or the older ones
        assert ops & {"all_gather_single", "all_gather_into_tensor"} and ops & {"reduce_scatter_single",
                                                                                "reduce_scatter_tensor"}, ops
    # DDP's C++ broadcasts and all-reduces: records on torch >= 2.14 (c10d's hooks), before that a
    # counted gap right after the job's first barrier (#1)
    if NATIVE:
        assert "allreduce" in ops and "untraced" not in ops
    else:
        assert {(r["op"], r["seq"]) for r in records if r["group"] == "0"} >= {("barrier", 1), ("untraced", 2)}


def test_skipped_backward_meets_ddps_unseen_all_reduce_as_a_mismatch(torchrun_job):
    """Rank 3 skips backward and goes on to a barrier while ranks 0-2 are in DDP's gradient
    all-reduce, which runs in C++ where no wrapper sees it. The Flight Recorder, asked for on
    demand, names it: a mismatch within about a second, not a stall after COLLTRACE_STALL_S.
    On torch >= 2.14 c10d's hooks record the all-reduce itself, with the stack of backward.
    Where neither can name it (torch 2.4: no Flight Recorder dump), it is a stall on the barrier
    whose missing ranks are in no traced collective, and rank 0 said why at start. The recorder is
    on (torch 2.9 has it off by default: rank 0 would say so, see test_torchcompat)."""
    named = NATIVE or hasattr(torch._C._distributed_c10d, "_dump_fr_trace_json")
    # unnamed, the stall is ended once it has lasted 5 s whatever its missing ranks seem to do
    job, rc = run(torchrun_job, "ddp_skip", TORCH_FR_BUFFER_SIZE="2000",
                  **({"stall_s": 60} if named else {"stall_s": 3, "COLLTRACE_ABORT_STALL_S": "5"}))
    assert rc != 0
    (f,) = job.findings()
    if not named:
        assert f["kind"] == "stall" and f["ranks"]["3"]["op"] == "barrier" and f["missing_ranks"] == [0, 1, 2], f

        for r in "012":
            assert f["ranks"][r]["state"] == "not_in_collective" and loc("ddp_backward") in frames_line(f["ranks"][r])
        assert job.err.count("are counted, not named") == 1, job.err[-3000:]   # rank 0 said why, once
        return
    assert f["kind"] == "mismatch" and f["differs"] == ["op"] and f["group"]["desc"] == "default_pg"
    assert "are counted, not named" not in job.err
    if NATIVE:
        # torch >= 2.14: c10d's hook recorded the all-reduce itself, with the stack of backward
        assert [(c["ranks"], c["op"], c.get("untraced", False)) for c in f["classes"]] == [
            ([0, 1, 2], "allreduce", False), ([3], "barrier", False)]
        for r in "012":
            assert loc("ddp_backward") in frames_line(f["ranks"][r]) and not f["ranks"][r].get("untraced")
        assert loc("skip_barrier") in f["summary"] + f["advice"]
        assert f["detected_at"] - f["ranks"]["3"]["entered_at"] < 5.0
        return
    assert [(c["ranks"], c["op"], c.get("untraced", False)) for c in f["classes"]] == [
        ([0, 1, 2], "all_reduce", True), ([3], "barrier", False)]
    for r in "012":
        assert f["ranks"][r]["untraced"] is True and loc("ddp_backward") in frames_line(f["ranks"][r])  # live stack
    assert loc("skip_barrier") in f["advice"] and "Flight Recorder" in f["summary"]
    assert f["detected_at"] - f["ranks"]["3"]["entered_at"] < 5.0
