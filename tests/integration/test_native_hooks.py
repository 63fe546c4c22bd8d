"""Collectives no torch.distributed wrapper sees: called on the group object (pg.allreduce).

On torch >= 2.14 c10d's per-group hooks record them (op, shapes, the user's file:line), so a
mismatch between them is named within seconds; on torch 2.13 they stay invisible (the
wrappers are the only route). A failure inside colltrace's hook never reaches the program."""
from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from colltrace.rank import hooks
from colltrace.tracefile import reader
from helpers.jobs import frames_line, internal_errors_with_results_unchanged, markers, user_line

NATIVE = hooks.supported(dist.ProcessGroup)
SCRIPT = "group_object.py"


@pytest.mark.slow
def test_a_mismatch_between_collectives_called_on_the_group_is_named(torchrun_job):
    job = torchrun_job(SCRIPT, 2, args=["mismatch"], env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "60"})
    lines = markers(SCRIPT)
    if not NATIVE:
        # torch 2.13: no hooks, so the ranks are in no traced collective: nothing to name, the
        # job waits for its timeout (this is the blind spot torch >= 2.14 closes).
        time.sleep(8)
        assert job.proc.poll() is None and job.findings() == []
        return
    rc = job.wait(60)
    assert rc != 0, job.err[-3000:]
    (f,) = [f for f in job.findings() if f["kind"] == "mismatch"]
    assert f["differs"][0] == "op" and f["seq"] == 2
    assert [(c["ranks"], c["op"]) for c in f["classes"]] == [([0], "allreduce"), ([1], "allgather")]
    assert f"{SCRIPT}:{lines['pg_allreduce']}" in frames_line(f["ranks"]["0"])
    assert f"{SCRIPT}:{lines['pg_allgather']}" in frames_line(f["ranks"]["1"])
    assert f"{SCRIPT}:{lines['pg_allgather']}" in f["summary"] or f"{SCRIPT}:{lines['pg_allreduce']}" in f["summary"]
    assert f["detected_at"] - max(f["ranks"][r]["entered_at"] for r in "01") < 5.0


@pytest.mark.parametrize("points", [("0=pre", "1=post")])
def test_a_failure_inside_the_hook_never_breaks_the_collective(gloo_job, points):
    # COLLTRACE_PURE: the failure is injected into the Python wrappers' recorder calls, which the
    # compiled hot path does not make (tests/integration/test_fastpath.py injects its own).
    traced = gloo_job(SCRIPT, 2, args=["inject", *points], env={"COLLTRACE_WATCHDOG": "off", "COLLTRACE_PURE": "1"})
    plain = gloo_job(SCRIPT, 2, args=["inject", *points], traced=False)
    for r, errors in internal_errors_with_results_unchanged(traced, plain).items():
        # reported once, then tracing steps aside. On 2.13 no hook runs: rank 0's broken op
        # naming is never called, rank 1's broken exit fails in the barrier's wrapper instead.
        assert len(errors) == (1 if NATIVE or r == 1 else 0), traced.stderr(r)[-3000:]
        if NATIVE:
            assert "simulated colltrace bug" in errors[0]
            recs = reader.load_traces(traced.dir)[r].all_records()
            first = [x for x in recs if user_line(x, SCRIPT) == markers(SCRIPT)["first"]]
            assert [x["op"] for x in first] == ["allreduce"]   # traced until the failure


def test_colltrace_hooks_0_leaves_the_group_object_calls_to_the_counter(gloo_job):
    # COLLTRACE_HOOKS=0 spares torch >= 2.14 the cost of c10d's hook dispatch on every collective
    # (see README, Performance): what no wrapper sees is then counted, as on 2.13, and results
    # are unchanged.
    traced = gloo_job(SCRIPT, 2, args=["inject"], env={"COLLTRACE_WATCHDOG": "off", "COLLTRACE_HOOKS": "0"})
    plain = gloo_job(SCRIPT, 2, args=["inject"], traced=False)
    for r, errors in internal_errors_with_results_unchanged(traced, plain).items():
        assert errors == [], traced.stderr(r)[-3000:]
        recs = reader.load_traces(traced.dir)[r].all_records()
        assert not [x for x in recs if user_line(x, SCRIPT) == markers(SCRIPT)["first"]]   # no hook recorded it
        (barrier,) = [x for x in recs if x["op"] != "untraced" and not x.get("setup")]   # not init_process_group
        # numbered after what it did not see: two pg.allreduce, one pg.allgather, DDP's broadcast and all-reduce
        assert barrier["op"] == "barrier" and barrier["seq"] >= 6, recs
