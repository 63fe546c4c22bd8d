"""Hangs that are not collectives (issue: group creation, rendezvous and store waits), on real gloo
ranks: every job of tests/integration/jobs/setup_shapes.py at once, each test waiting for its own
finding. A group skipped by a member is a stall past the threshold (and ended under abort); one
skipped by a non-member, groups made in another order and a mesh made on a subset are a mismatch
at once; a rank stuck before init_process_group is named where it is; a store wait for a key
nobody sets is a stall; a job whose last rank is slow to join and to make its groups is named
nowhere."""
from __future__ import annotations

import json
import time

import pytest

from helpers.cli import run_cli
from helpers.jobs import findings, frames_line, loc
from helpers.waiting import wait_until

pytestmark = pytest.mark.slow
SCRIPT = "setup_shapes.py"
STALL_S = "2"
SHAPES = {   # shape: (ranks, extra environment)
    "member_skips": (2, {"COLLTRACE_ON_HANG": "abort"}),
    "nonmember_skips": (2, {}),
    "order": (2, {}),
    "no_init": (2, {}),
    "mesh_subset": (2, {}),
    "store_get": (2, {}),
    # joins 2.5 s late and makes the job's group 2.5 s late, under a threshold of 10 s
    "slow_start": (2, {"COLLTRACE_STALL_S": "10", "SLOW_S": "2.5"}),
    "local_then_world": (2, {}),
}


@pytest.fixture(scope="module")
def jobs(module_gloo_job):
    return {shape: module_gloo_job(SCRIPT, n, env={"SHAPE": shape, "COLLTRACE_STALL_S": STALL_S, **env})
            for shape, (n, env) in SHAPES.items()}


def finding_of(job, timeout=90.0, consequences=()) -> dict:
    """The job's one finding, once made, and no other for a second more (the job then stopped);
    `consequences`: kinds of finding that may follow it (a rank that then crashes: gloo's own)."""
    assert wait_until(lambda: findings(job.dir), timeout), job.dir
    time.sleep(1.0)
    job.stop()
    f, *more = findings(job.dir)
    assert [x["kind"] for x in more if x["kind"] not in consequences] == [], [x["summary"] for x in more]
    return f


def test_a_member_that_never_makes_the_group_is_named_where_it_is_and_abort_ends_the_job(jobs):
    """The issue's shape: rank 0 makes new_group(range(2)) in a helper; rank 1, gone to serve,
    never does. Past the threshold, a stall on the job's group creation #2; abort ends every rank
    (the backend's own timeout is 30 minutes)."""
    job = jobs["member_skips"]
    codes = job.wait(90)
    assert all(c != 0 for c in codes), codes
    (f,) = findings(job.dir)
    assert f["kind"] == "stall" and (f["group"]["name"], f["seq"], f["missing_ranks"]) == ("setup", 2, [1])
    assert f["waited_s"] >= float(STALL_S)
    assert f["ranks"]["0"]["op"] == "new_group" and loc("make_world_group", SCRIPT) in frames_line(f["ranks"]["0"])
    assert loc("serving", SCRIPT) in frames_line(f["ranks"]["1"])   # its live stack
    assert f["summary"].startswith("Stall: rank 0 has waited ") and "in new_group #2 (ranks 0-1)" in f["summary"]
    doc = json.loads(run_cli("analyze", job.dir, "--json").stdout)   # the same post-mortem
    assert [x["key"] for x in doc["findings"]] == ["stall:setup:2"] and doc["culprits"] == [1]


@pytest.mark.parametrize("shape,sides", [
    ("nonmember_skips", [([0], "new_group", [0], "solo"), ([1], "new_group", None, "pair")]),
    ("order", [([0], "new_group", None, "a_first"), ([1], "new_group", [0], "b_first")]),
    ("mesh_subset", [([0], "DeviceMesh", [0], "mesh"), ([1], "new_group", None, "pair_after_mesh")]),
])
def test_ranks_that_make_different_groups_at_one_number_are_a_mismatch_at_once(jobs, shape, sides):
    """torch names the groups after the one made on one side only differently on each side: the
    ranks wait for each other in the next one, or gloo, reading the other group's keys, connects
    what it should not (a rank may even crash there: its own finding then follows)."""
    f = finding_of(jobs[shape], consequences=("dead_rank",))
    assert f["kind"] == "mismatch" and (f["group"]["name"], f["seq"]) == ("setup", 2), f["summary"]
    assert [(c["ranks"], c["op"], c["members"]) for c in f["classes"]] == [(r, op, m) for r, op, m, _ in sides]
    for ranks, _, _, marker in sides:
        assert loc(marker, SCRIPT) in frames_line(f["ranks"][str(ranks[0])])
    assert f["summary"].startswith("Mismatch: group creation #2 of the job is not the same call on every rank")
    # certain: no threshold
    assert f["detected_at"] - max(e["entered_at"] for e in f["ranks"].values()) < float(STALL_S)


def test_a_rank_stuck_before_init_process_group_is_named_where_it_is(jobs):
    """Rank 1 loops in its data loading before importing torch: seen from its interpreter's start."""
    f = finding_of(jobs["no_init"])
    assert f["kind"] == "stall" and (f["group"]["name"], f["seq"], f["missing_ranks"]) == ("setup", 1, [1])
    assert f["ranks"]["0"]["op"] == "init_process_group" and loc("init", SCRIPT) in frames_line(f["ranks"]["0"])
    assert f["ranks"]["1"]["state"] == "not_in_collective" and loc("loading", SCRIPT) in frames_line(f["ranks"]["1"])
    assert "in init_process_group #1 (ranks 0-1)" in f["summary"]


def test_a_store_wait_for_a_key_nobody_sets_is_one_stall(jobs):
    """Rank 0 waits for a key of the job's store; rank 1 waits for rank 0 in a barrier: one finding,
    the store wait's, which says where rank 1 is (the barrier's stall is not another)."""
    f = finding_of(jobs["store_get"])
    assert f["kind"] == "stall" and f["group"]["name"] == "store:weights_ready"
    assert f["ranks"]["0"]["op"] == "store.get" and loc("store_get", SCRIPT) in frames_line(f["ranks"]["0"])
    assert f["ranks"]["1"]["op"] == "barrier" and f["ranks"]["1"]["waiting_for"] == [0]
    assert ("store.get('weights_ready') on the job's store" in f["summary"]
            and "for a key no rank has set" in f["summary"])


def counted(job) -> bool:
    """Whether torch counted rank 0's local group in the names of the groups made after it, as
    the job saw it (torch 2.14 on)."""
    (line,) = [x for x in job.stdout(0).splitlines() if x.startswith("COUNTED ")]
    return line == "COUNTED True"


def test_ranks_slow_to_join_and_to_make_groups_are_named_nowhere(jobs):
    job = jobs["slow_start"]
    assert job.wait(120) == [0, 0], job.stderr(1)[-3000:]
    assert findings(job.dir) == [] and all("DONE" in job.stdout(r) for r in range(2))
    dump = json.loads(run_cli("dump", job.dir, "--json", "--rank", "0").stdout)["ranks"]["0"]
    setup = [(r["group"], r["seq"], r["op"], r.get("members")) for r in dump if r.get("setup")]
    want = [("setup", 1, "init_process_group", None), ("setup", 2, "new_group", None), ("setup:0", 1, "new_group", [0])]
    # where torch counts the local group among the job's, it is the job's creation #3 too
    assert setup == want + ([("setup", 3, "new_group", None)] if counted(job) else [])


def test_a_local_group_torch_counts_among_the_jobs_is_a_mismatch_with_the_next_group(jobs):
    """torch 2.14 on names a group by the count of every group the rank made before it, local
    ones too: rank 0's new_group([0], use_local_synchronization=True) makes the next group's name
    differ between the ranks, and its creation waits forever. Where torch does not count it
    (before 2.14), the job is healthy and named nowhere."""
    job = jobs["local_then_world"]
    ended = lambda: all(p.poll() is not None for p in job.procs)   # noqa: E731
    assert wait_until(lambda: findings(job.dir) or ended(), 90), job.dir
    if not findings(job.dir):
        assert job.wait(60) == [0, 0] and not counted(job) and findings(job.dir) == []
        return
    f = finding_of(job)
    job.wait(60)   # killed: what it printed
    assert counted(job)
    assert f["kind"] == "mismatch" and (f["group"]["name"], f["seq"]) == ("setup", 2), f["summary"]
    assert [(c["ranks"], c["op"], c.get("detail")) for c in f["classes"]] == [
        ([0], "new_group", "use_local_synchronization=True"), ([1], "new_group", None)]
    assert loc("local_first", SCRIPT) in frames_line(f["ranks"]["0"])
    assert loc("world_after_local", SCRIPT) in frames_line(f["ranks"]["1"])
    assert "rank 0 called new_group of its members alone (use_local_synchronization=True)" in f["summary"]
