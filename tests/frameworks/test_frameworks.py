"""Real PyTorch Lightning and HF accelerate jobs on 2 gloo ranks under torchrun: a healthy run
gives no finding and the same weights, traced or not; a hang of the user's own making is named
by the user's file:line first, with the framework call it went through, and the rank that left
its pattern is the one to look at first (1 against 1: no majority to lean on)."""
from __future__ import annotations

import os
import re

import pytest

from helpers.jobs import markers

pytestmark = pytest.mark.slow


def run(torchrun_job, script, scenario, out, traced=True):
    env = {"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "3"} if traced else {}
    job = torchrun_job(script, 2, args=[scenario, out], env=env, traced=traced)
    rc = job.wait(150)
    return job, rc


def first_location(text: str) -> str:
    """The first file:line a paragraph names."""
    return re.search(r"[\w.-]+\.py:\d+", text).group(0)


@pytest.mark.parametrize("script", ["lightning_job.py", "accelerate_job.py"])
def test_healthy_framework_job_gives_no_finding_and_the_same_weights(torchrun_job, tmp_path, script):
    traced, rc = run(torchrun_job, script, "healthy", tmp_path / "traced.sha")
    assert rc == 0, traced.err[-3000:]
    assert traced.findings() == [] and traced.out.count("DONE") == 2
    plain, rc = run(torchrun_job, script, "healthy", tmp_path / "plain.sha", traced=False)
    assert rc == 0, plain.err[-3000:]
    assert (tmp_path / "traced.sha").read_bytes() == (tmp_path / "plain.sha").read_bytes()


@pytest.mark.parametrize("script, scenario, marker, api", [
    ("lightning_job.py", "barrier_on_rank0", "lit_barrier", "lightning.DDPStrategy.barrier()"),
    ("lightning_job.py", "gather_on_rank0", "lit_gather", "lightning.LightningModule.all_gather()"),
    ("accelerate_job.py", "wait_on_main", "acc_wait", "accelerate.Accelerator.wait_for_everyone()"),
    ("accelerate_job.py", "gather_on_main", "acc_gather", "accelerate.Accelerator.gather()"),
])
def test_a_hang_in_the_users_code_is_named_by_the_users_line_first(torchrun_job, tmp_path, script, scenario,
                                                                    marker, api):
    """Rank 0 alone makes a collective call (inside a rank-conditional branch) while rank 1 does
    its ordinary training step (DDP's gradient all-reduce)."""
    job, rc = run(torchrun_job, script, scenario, tmp_path / "out.sha")
    assert rc != 0
    findings = job.findings()
    assert findings, job.err[-3000:]
    f = findings[0]
    mine = f"{script}:{markers(script)[marker]}"
    # the verdict, its advice and rank 0's stack class all start at the user's own line ...
    assert first_location(f["summary"]) == mine, f["summary"]
    assert f["advice"].startswith(f"Look first at {mine}"), f["advice"]
    func = 'log_metrics' if marker == 'acc_gather' else 'main' if script.startswith('acc') else 'training_step'
    assert f"{mine} ({func}) calling {api}" in f["advice"]
    # ... on the rank that left its pattern, not on the one doing its routine step
    assert f["look_first"]["rank"] == 0 and f["look_first"]["reason"] in ("left", "new"), f["look_first"]
    frames = f["ranks"]["0"]["frames"]   # the facts point at the frames the text names
    user, via = frames[f["look_first"]["user_frame"]], frames[f["look_first"]["framework_frame"]]
    assert f"{os.path.basename(user['file'])}:{user['line']}" == mine and user["origin"] == "user"
    assert via["origin"] == "framework" and api.startswith(via["package"] + ".")
    assert "rank 0 calls" in f["advice"]
    text = job.err
    assert f"Look first at {mine}" in text
    with open(os.path.join(job.dir, "report.txt")) as report:
        classes = [line for line in report.read().splitlines() if line.strip().startswith("rank 0:")]
    assert classes and mine in classes[0] and api in classes[0], classes
