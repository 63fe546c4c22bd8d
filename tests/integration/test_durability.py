"""A record written before the collective is entered survives the rank dying inside it."""
from __future__ import annotations

import os
import signal
import time

import pytest

from colltrace.tracefile import reader
from helpers.jobs import findings, markers, user_line


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def entered(job, rank):
    p = job.procs[rank]
    line = p.stdout.readline() if p.poll() is None else ""
    return "ENTERING" in line


SIGNALS = {"sigkill": signal.SIGKILL, "segv": signal.SIGSEGV, "abrt": signal.SIGABRT}
FAULT_TEXT = {"segv": "Segmentation fault", "abrt": "Aborted"}


@pytest.mark.parametrize("how", ["sigkill", "segv", "abrt"])
def test_record_of_the_collective_a_rank_died_in_is_readable(gloo_job, how):
    job = gloo_job("die_in_collective.py", 2, args=[how], env={"COLLTRACE_WATCHDOG": "off"})
    wait_for(lambda: entered(job, 1), 60, "rank 1 to enter the barrier")
    if how == "sigkill":
        time.sleep(0.3)
        os.kill(job.procs[1].pid, signal.SIGKILL)
    job.procs[1].wait(timeout=30)
    assert job.procs[1].returncode == -SIGNALS[how]
    job.kill()  # rank 0 would wait for the 30-minute gloo timeout

    snap = reader.load_snapshot(job.dir)
    rank1 = snap["ranks"]["1"]
    last = rank1["records"][-1]
    assert last["op"] == "barrier" and last["state"] == "waiting" and last["seq"] == 2
    assert user_line(last, "die_in_collective.py") == markers("die_in_collective.py")["doomed_barrier"]
    if how in FAULT_TEXT:
        # faulthandler wrote every thread's stack and the signal into the rank's folder
        assert rank1["status"] == "dead" and rank1["exit"]["signal"] == SIGNALS[how].name
        with open(os.path.join(job.dir, "rank-00001.fault.txt")) as fh:
            fault = fh.read()
        assert FAULT_TEXT[how] in fault and "die_in_collective.py" in fault


def test_a_rank_that_dies_at_interpreter_exit_is_reported_and_nothing_is_ended(gloo_job):
    # rank 1 aborts after its program finished (colltrace's exit record is written by then); rank 0
    # is still running: COLLTRACE_ON_HANG=abort must leave it alone, no rank waits for rank 1.
    job = gloo_job("abort_at_exit.py", 2, env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "1"})
    assert job.wait(60) == [0, -signal.SIGABRT], job.stderr(0)[-3000:]
    (f,) = [f for f in findings(job.dir) if f["kind"] == "dead_rank"]
    assert f["rank"] == 1 and f["exit"]["signal"] == "SIGABRT" and f["exit"]["at_exit"] is True
    assert f["waiting"] == [] and f["last_collective"]["op"] == "barrier"
    assert "died of SIGABRT at interpreter exit, after its program had finished" in f["summary"]
    assert "Nothing waits for rank 1" in f["advice"]
    assert "COLLTRACE_ON_HANG=abort" not in job.stderr(0) + job.stderr(1)

