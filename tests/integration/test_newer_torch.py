"""A torch newer than CI has tested: the job says so in one line, once (rank 0), and is traced as
on any other; on the tested torch that runs this suite, no such line."""
from __future__ import annotations

from helpers.jobs import records

JOB = """
import sys
import torch
if sys.argv[1] == "newer":
    torch.__version__ = "2.16.0"   # what the next release will report
import torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(4)
dist.all_reduce(x)
dist.barrier()
print("RESULT", x.tolist(), flush=True)
dist.destroy_process_group()
"""
LINE = "colltrace: torch 2.16 is newer than the versions tested (2.4-2.15): tracing with what it offers"


def test_a_newer_torch_is_said_once_per_job_and_traced_all_the_same(gloo_job, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    newer = gloo_job(str(script), 2, args=("newer",))
    tested = gloo_job(str(script), 2, args=("tested",))
    for job in (newer, tested):
        assert job.wait(90) == [0, 0], job.stderr(0)[-3000:]
    assert [newer.stderr(r).count(LINE) for r in (0, 1)] == [1, 0], newer.stderr(0)[-3000:]
    assert "is newer than the versions tested" not in tested.stderr(0) + tested.stderr(1)
    for r in (0, 1):
        assert newer.stdout(r) == tested.stdout(r) and "RESULT [2.0, 2.0, 2.0, 2.0]" in newer.stdout(r)
        assert [(x["op"], x["state"]) for x in records(newer.dir, r) if x["op"] != "untraced"] == [
            ("init_process_group", "completed"), ("all_reduce", "completed"), ("barrier", "completed")]
