"""Hangs as NCCL makes them, made on gloo (issue: NCCL's asynchrony): collectives that return
before they run, the CPU running ahead through more of them, then parking in a wait. colltrace
names the stuck collective (not the last one queued), once, within about a second of the last
rank parking; after the backend's own timeout `colltrace analyze` still names the hang; a job
that only ran ahead, or used functional collectives (DTensor's path), is never named nor aborted."""
from __future__ import annotations

import json
import os
import re

import pytest

from helpers.cli import run_cli
from helpers.jobs import findings, frames_line, loc

pytestmark = pytest.mark.slow
SCRIPT = "async_shapes.py"


def start(gloo_job, shape, nprocs=2, **env):
    return gloo_job(SCRIPT, nprocs,
                    env={"SHAPE": shape, "COLLTRACE_STALL_S": "30", "COLLTRACE_ON_HANG": "abort", **env})


def parked_since(f) -> float:
    return max(e["parked"]["since"] if e.get("parked") else e["entered_at"] for e in f["ranks"].values())


def test_run_ahead_across_groups_names_the_stuck_all_reduce_once(gloo_job):
    """The reports' shape on 4 ranks: 0-2 enqueue the default group's all_reduce #2 (rank 3 never
    calls it) and run ahead into #3 and #4; rank 3 enqueues its gather on another group; both
    sides park in work.wait()."""
    job = start(gloo_job, "cross", 4)
    job.wait(90)
    (f,) = findings(job.dir)
    assert f["kind"] == "deadlock" and f["key"] == "deadlock:0#2,1#1"
    assert [(c["group"], c["seq"], c["op"], c["waiting"], c["missing"]) for c in f["cycle"]] == [
        ("0", 2, "all_reduce", [0, 1, 2], [3]), ("1", 1, "gather", [3], [0, 1, 2])]
    for r in "012":
        e = f["ranks"][r]
        assert loc("stuck", SCRIPT) in frames_line(e) and loc("parks", SCRIPT) in frames_line(e["parked"])
        assert [q["seq"] for q in e["queued"]] == [4] or [q["seq"] for q in e["queued"]] == [3, 4]
    assert loc("teacher_gather", SCRIPT) in frames_line(f["ranks"]["3"])
    # the stuck call's line is named once, the calls queued behind it as such, never as the hang
    clauses = f["summary"].split(" Look first")[0]
    assert clauses.count(loc("stuck", SCRIPT)) == 1 and "queued behind it" in clauses
    assert "wait in all_reduce #2" in f["summary"] and "#4 on group 0" not in f["summary"]
    assert f["detected_at"] - parked_since(f) < 2.0   # certain at once, not after COLLTRACE_STALL_S (30 s)


def test_run_ahead_into_another_collective_is_a_mismatch_at_the_stuck_number(gloo_job):
    job = start(gloo_job, "same")
    job.wait(90)
    (f,) = findings(job.dir)
    assert f["kind"] == "mismatch" and (f["group"]["name"], f["seq"]) == ("0", 2)
    assert [(c["ranks"], c["op"]) for c in f["classes"]] == [([0], "all_reduce"), ([1], "gather")]
    assert (loc("stuck", SCRIPT) in frames_line(f["ranks"]["0"])
            and loc("odd_gather", SCRIPT) in frames_line(f["ranks"]["1"]))


def test_a_job_that_only_ran_ahead_is_never_named(gloo_job):
    """Every rank enqueues and waits later, idle past the stall threshold meanwhile."""
    job = start(gloo_job, "healthy", COLLTRACE_STALL_S="1", IDLE_S="2.5")
    assert job.wait(90) == [0, 0], job.stderr(0)[-3000:]
    assert findings(job.dir) == [] and "DONE" in job.stdout(0)


def test_functional_collectives_healthy_are_never_named_nor_aborted(gloo_job):
    """DTensor's path: eager funcol all-reduces on a second group, each waited on, a DTensor
    gathered, then only default-group traffic past the stall threshold, under abort."""
    job = start(gloo_job, "funcol", COLLTRACE_STALL_S="3", IDLE_S="4.5")
    assert job.wait(120) == [0, 0], job.stderr(0)[-3000:]
    assert findings(job.dir) == [], findings(job.dir)
    from helpers.jobs import records

    funcol = [r for r in records(job.dir, 0) if r["op"].startswith("funcol.")]
    assert funcol and all(r["state"] == "completed" for r in funcol), funcol


def test_a_hung_functional_collective_is_named_at_its_line(gloo_job):
    job = start(gloo_job, "funcol_hung", COLLTRACE_STALL_S="1", COLLTRACE_ON_HANG="warn")
    from helpers.waiting import wait_until

    assert wait_until(lambda: findings(job.dir), 60), job.stderr(0)[-3000:]
    job.stop()
    (f,) = findings(job.dir)
    assert f["kind"] == "stall" and f["missing_ranks"] == [1] and f["ranks"]["0"]["op"] == "funcol.all_reduce"
    assert loc("funcol_reduce", SCRIPT) in frames_line(f["ranks"]["0"])
    assert loc("funcol_wait", SCRIPT) in frames_line(f["ranks"]["0"]["parked"])
    assert loc("teacher_busy", SCRIPT) in frames_line(f["ranks"]["1"])


def test_after_the_backends_timeout_the_post_mortem_names_the_hang(gloo_job):
    """Left to gloo's own timeout (4 s here): every rank ends with "Timed out waiting", and the
    files still say which collective hung, who waited and who was missing; the timed-out
    collective is failed, with its reason, never completed."""
    job = start(gloo_job, "cross", COLLTRACE_ON_HANG="warn", PG_TIMEOUT_S="4")
    codes = job.wait(90)
    assert codes == [1, 1] and "Timed out" in job.stderr(0) + job.stderr(1)
    out = run_cli("analyze", job.dir, "--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert [f["key"] for f in doc["findings"]] == ["deadlock:0#2,1#1"]
    f = doc["findings"][0]
    # gloo's own words: "Timed out waiting", or "Application timeout caused pair closure" where the
    # peer's timeout closed the pair first
    assert f["ranks"]["0"]["ended"] == "timeout" and re.search(r"Timed out|timeout", f["ranks"]["0"]["error"])
    assert "The backend's timeout then ended the wait" in f["summary"]
    assert doc["culprits"] == [0]
    dump = json.loads(run_cli("dump", job.dir, "--json", "--rank", "0").stdout)
    stuck = [r for r in dump["ranks"]["0"] if r["group"] == "0" and r["seq"] == 2]
    assert [r["state"] for r in stuck] == ["failed"] and re.search(r"Timed out|timeout", stuck[0]["error"])
    assert os.path.exists(os.path.join(job.dir, "report.txt"))
