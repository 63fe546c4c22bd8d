"""The shipped distillation trainer (examples/distill) under `COLLTRACE=1 torchrun`, 4 gloo ranks,
default (30-minute) timeouts, COLLTRACE_ON_HANG=abort: every switch's mistake is named, with the
group, the collective number, the ranks, the ops and the offending file:line; the correct
trainer gives nothing and learns."""
from __future__ import annotations

import os
import re

import pytest
from helpers.cli import run_cli

pytestmark = pytest.mark.slow
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "distill")
TRAIN = os.path.abspath(os.path.join(EXAMPLE, "train.py"))


def mark(name: str) -> str:
    """"file.py:LINE" of the `# bug: NAME` or `# line: NAME` comment in the example."""
    for fname in sorted(os.listdir(EXAMPLE)):
        if fname.endswith(".py"):
            with open(os.path.join(EXAMPLE, fname)) as f:
                for i, line in enumerate(f, 1):
                    if re.search(rf"# (bug|line): {re.escape(name)}\b", line):
                        return f"{fname}:{i}"
    raise LookupError(name)


def lines(entry) -> set[str]:
    return {f"{os.path.basename(f['file'])}:{f['line']}" for f in entry.get("frames") or []}


def run(torchrun_job, tmp_path, bug=None, timeout=150, **env):
    args = ["--bug", bug] if bug else []
    job = torchrun_job(TRAIN, 4, args=args, env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "10",
                                                  "DISTILL_DUMP_DIR": str(tmp_path / "dump"), **env})
    return job, job.wait(timeout)


def hang_latency(f) -> float:
    return f["detected_at"] - max(e["entered_at"] for e in f["ranks"].values() if e.get("entered_at"))


def the(findings, kind):
    assert [x["kind"] for x in findings] == [kind], [x["summary"] for x in findings]
    return findings[0]


def test_correct_trainer_learns_and_gives_no_finding(torchrun_job, tmp_path):
    job, rc = run(torchrun_job, tmp_path)
    assert rc == 0, job.err[-3000:]
    assert job.findings() == []
    losses = [float(m) for m in re.findall(r"^step +\d+ +loss ([\d.]+)", job.out, re.M)]
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0], job.out
    assert "teacher served 30 steps" in job.err
    assert sorted(os.listdir(tmp_path / "dump" / "checkpoints")) == ["step_000020", "step_000030"]


@pytest.mark.parametrize("bug,barrier_at,teacher_op,teacher_at,same_kind", [
    # the team's story: ranks 0-2 sync a new checkpoint folder on the default group while the
    # teacher waits in its model-ready broadcast on the ipc group; the same kind elsewhere: the
    # two other collectives whose group may be the default one, the next to run first
    ("checkpoint_barrier", "checkpoint_barrier", "broadcast", "teacher_ready",
     ["probe_barrier", "metrics_default_group"]),
    ("probe_barrier", "probe_barrier", "gather", "teacher_gather",
     ["checkpoint_barrier", "metrics_default_group"]),
    ("metrics_default_group", "metrics_default_group", "gather", "teacher_gather",
     ["probe_barrier", "checkpoint_barrier"]),
])
def test_default_group_collective_is_a_deadlock_with_the_teacher(torchrun_job, tmp_path, bug, barrier_at, teacher_op,
                                                                 teacher_at, same_kind):
    job, rc = run(torchrun_job, tmp_path, bug)
    assert rc != 0
    f = the(job.findings(), "deadlock")
    assert f["group"]["desc"] == "default_pg" and f["missing_ranks"] == [3]
    ops = {r: (e["op"], e["group"]) for r, e in f["ranks"].items()}
    expected = "barrier" if "barrier" in bug else "all_reduce"
    assert ops["0"] == ops["1"] == ops["2"] == (expected, f["group"]["name"])
    assert f["ranks"]["3"]["op"] == teacher_op and f["groups"][f["ranks"]["3"]["group"]]["desc"] == "ipc"
    for r in "012":
        assert mark(barrier_at) in lines(f["ranks"][r])
    assert mark(teacher_at) in lines(f["ranks"]["3"])
    assert mark(barrier_at) in f["advice"] and mark(barrier_at) in f["summary"]
    assert f"#{f['seq']} on group {f['group']['name']} (default_pg" in f["summary"]
    assert hang_latency(f) < 2.0
    assert [f"{os.path.basename(x['file'])}:{x['line']}" for x in f["same_kind"]] == [mark(b) for b in same_kind]
    assert all(x["may_be_default"] for x in f["same_kind"])
    with open(os.path.join(job.dir, "report.txt")) as r:
        report = r.read()
    tail = report.split("The same kind elsewhere", 1)[1]
    at = [tail.find(mark(b) + " (") for b in same_kind]   # listed in the report, in the same order
    assert -1 not in at and at == sorted(at), tail
    assert "The same kind elsewhere" not in f["summary"]
    # report.txt, written live, says what `colltrace analyze` says of the folder afterwards: the
    # culprits first, in the same words (only what came after the finding, the abort, is added)
    analyzed = run_cli("analyze", job.dir)
    assert analyzed.returncode == 1
    assert report.startswith("Culprits: ") and report.split("\n", 1)[0] == analyzed.stdout.split("\n", 1)[0]


def test_teacher_loop_before_setup_is_a_mismatch_on_the_ipc_group(torchrun_job, tmp_path):
    job, rc = run(torchrun_job, tmp_path, "teacher_early")
    assert rc != 0
    f = the(job.findings(), "mismatch")
    assert f["group"]["desc"] == "ipc" and f["seq"] == 1 and "op" in f["differs"]
    assert [(c["ranks"], c["op"]) for c in f["classes"]] == [([0, 1, 2], "broadcast"), ([3], "gather")]
    assert mark("wait_for_teacher") in lines(f["ranks"]["0"]) and mark("teacher_gather") in lines(f["ranks"]["3"])
    assert mark("teacher_gather") in f["summary"]
    assert hang_latency(f) < 2.0


def test_preemption_save_on_one_rank_is_a_deadlock_that_points_at_it(torchrun_job, tmp_path):
    job, rc = run(torchrun_job, tmp_path, "preempt_one_rank")
    assert rc != 0
    f = the(job.findings(), "deadlock")
    first = f["cycle"][0]
    assert (first["op"], first["waiting"], first["missing"]) == ("barrier", [0], [1, 2])
    assert f["group"]["desc"] == "train" and {c["group"] for c in f["cycle"]} == {f["group"]["name"], f["ranks"]["3"]["group"]}
    assert mark("preempt_save") in lines(f["ranks"]["0"]) and mark("checkpoint_barrier") in lines(f["ranks"]["0"])
    assert mark("preempt_save") in f["advice"]
    assert {f["ranks"][r]["op"] for r in "12"} <= {"gather", "scatter"} and f["ranks"]["3"]["op"] == "gather"
    assert hang_latency(f) < 2.0


def test_segfault_mid_step_is_a_dead_rank_with_its_line(torchrun_job, tmp_path):
    job, rc = run(torchrun_job, tmp_path, "segfault")
    assert rc != 0
    dead = [x for x in job.findings() if x["kind"] == "dead_rank"]
    assert dead, job.err[-3000:]
    f = dead[0]
    assert f["rank"] == 1 and f["exit"]["signal"] == "SIGSEGV" and f["ranks"]["1"]["state"] == "dead"
    assert {mark("segfault"), mark("forward")} <= lines(f["ranks"]["1"])
    assert mark("segfault") in f["summary"] and "SIGSEGV" in f["summary"]
    # where in native code, as the dying rank saw it (innermost first), said with its Python line
    native = f["ranks"]["1"]["native_frames"]
    assert (native[0]["object"], native[0]["symbol"]) == ("libc.so.6", "memset"), native[:4]
    assert f"died of SIGSEGV in libc.so.6 (memset), called from {mark('segfault')} (fused_mlp)" in f["summary"]
    # the teacher waits (or failed, once gloo saw the peer go) in its gather for the dead rank
    assert f["ranks"]["3"]["op"] == "gather" and mark("teacher_gather") in lines(f["ranks"]["3"])
    assert f["last_collective"]["op"] == "scatter"


@pytest.mark.parametrize("digest", ["", "1"])
def test_duplicated_data_is_named_and_never_aborts(torchrun_job, tmp_path, digest):
    """No hang and no wrong collective: the collectives are those of a correct run, so only the
    data can tell. By default colltrace names the identical batches the training ranks feed their
    DDP model, and the loader behind them; the job runs on. With COLLTRACE_DIGEST=1 the identical
    gathers to the teacher are the same problem: still one finding."""
    job, rc = run(torchrun_job, tmp_path, "loader_before_pg", COLLTRACE_DIGEST=digest)
    assert rc == 0, job.err[-3000:]
    assert "done: 30 steps" in job.out
    f = the(job.findings(), "duplicate_data")
    assert sorted(f["ranks"]) == ["0", "1", "2"] and f["groups"][f["group"]["name"]]["desc"] == "train"
    assert f["identical_calls"] >= 3 and f["identical_calls"] == f["calls"]
    assert mark("forward") in lines(f["ranks"]["0"])
    assert f["loader"]["file"].endswith("data.py") and f["loader"]["before_init"] is True
    assert "was built before init_process_group (no DistributedSampler)" in f["summary"]
