"""Every rank on the same data, caught in the job where it happens (issue 30): a DDP or FSDP2 job
on 2 gloo ranks under `COLLTRACE=1 torchrun`, defaults only. A DataLoader built before
init_process_group (no DistributedSampler) is named live (findings.jsonl) and by `colltrace
analyze`, with its line; the same job with a DistributedSampler, and the jobs whose ranks feed
equal data on purpose (validation, a broadcast model, frozen layers, all-zero inputs, a world of
one), give nothing. The job itself runs on and prints the same loss, traced or not."""
from __future__ import annotations

import json
import re

import pytest

from colltrace.analysis import HANG_KINDS
from helpers.cli import run_cli
from helpers.jobs import loc

pytestmark = pytest.mark.slow
JOB = "dp_batches.py"


def run(torchrun_job, wrap, mode, nprocs=2, steps=20, traced=True, opaque=False, **env):
    job = torchrun_job(JOB, nprocs, args=[wrap, mode, steps] + (["opaque"] if opaque else []), env=env, traced=traced)
    rc = job.wait(120)
    assert rc == 0, job.err[-3000:]
    assert job.out.count(f"done: {steps} steps") == nprocs, job.out
    return job


def loss(job) -> str:
    return re.search(r"loss ([\d.]+)", job.out).group(1)


def sampled(directory) -> dict[str, list]:
    """rank -> the [step, digest] pairs it recorded for its model, from the trace files alone."""
    from colltrace.tracefile import reader

    out = {}
    for r, e in reader.load_snapshot(directory)["ranks"].items():
        (model,) = (e.get("batches") or {"?": {"steps": []}}).values()
        out[r] = model["steps"]
    return out


@pytest.mark.parametrize("wrap, model", [("ddp", "DistributedDataParallel"), ("fsdp", "FSDP")])
def test_a_loader_built_before_init_process_group_is_named_live_and_after(torchrun_job, wrap, model):
    job = run(torchrun_job, wrap, "no_sampler")
    plain = run(torchrun_job, wrap, "no_sampler", traced=False)
    assert loss(job) == loss(plain)   # tracing changed nothing the job computed
    found = job.findings()
    assert len(found) == 1, [(f["kind"], f["key"], f.get("summary", "")[:200]) for f in found]
    (live,) = found   # the watchdog's, while the job ran: one, and the job went on
    assert live["kind"] == "duplicate_data" and live["kind"] not in HANG_KINDS
    where = loc("loader_before", JOB)
    assert f"the DataLoader at {where} was built before init_process_group (no DistributedSampler)" in live["summary"]
    assert live["advice"].startswith(f"Look first at the DataLoader at {where}")
    res = run_cli("analyze", job.dir)
    assert res.returncode == 1, res.stderr
    # 20 steps: the first 8 are sampled, and every rank fed the same bytes in each
    assert (f"ranks 0-1 trained on identical batches in 8 of 8 sampled steps: the DataLoader at {where} was built "
            f"before init_process_group (no DistributedSampler)") in res.stdout, res.stdout
    assert f"{model} model on group 0 (default_pg, ranks 0-1) is called at {loc('forward', JOB)}" in res.stdout
    (f,) = json.loads(run_cli("analyze", job.dir, "--json").stdout)["findings"]
    assert (f["kind"], f["key"], f["group"]["ranks"], sorted(f["ranks"])) == ("duplicate_data", live["key"], [0, 1],
                                                                              ["0", "1"])
    assert (f["identical_calls"], f["calls"], f["seqs"]) == (8, 8, list(range(1, 9)))
    assert f["loader"]["before_init"] is True and f["loader"]["distributed"] is False


def test_the_exhaustive_mode_samples_every_step(torchrun_job):
    """COLLTRACE_DIGEST keeps its meaning: every step, every byte."""
    job = run(torchrun_job, "ddp", "no_sampler", COLLTRACE_DIGEST="1")
    res = run_cli("analyze", job.dir)
    assert res.returncode == 1 and "ranks 0-1 trained on identical batches in 20 of 20 sampled steps" in res.stdout


@pytest.mark.parametrize("wrap, mode", [
    ("ddp", "sampler"), ("fsdp", "sampler"),    # the data split right
    ("ddp", "eval"), ("fsdp", "eval"),          # then the same validation batch on every rank
    ("ddp", "broadcast"),                       # rank 0's weights broadcast first
    ("ddp", "frozen"),                          # a frozen first layer: no gradient there
    ("ddp", "zeros"),                           # all-zero inputs on every rank
])
def test_ranks_that_feed_equal_data_on_purpose_are_not_named(torchrun_job, wrap, mode):
    # exhaustive: every step is sampled, so an evaluation pass counted as training would show
    job = run(torchrun_job, wrap, mode, COLLTRACE_DIGEST="1")
    assert job.findings() == []
    res = run_cli("analyze", job.dir)
    assert res.returncode == 0 and "colltrace: no findings" in res.stdout, res.stdout
    steps = sampled(job.dir)
    assert sorted(steps) == ["0", "1"]
    for pairs in steps.values():
        assert [s for s, _ in pairs] == list(range(1, 21))   # the 20 training steps, no evaluation pass
        if mode == "zeros":
            assert {d for _, d in pairs} == {None}   # one byte value: nothing to tell ranks apart by
    if mode != "zeros":
        assert all(a[1] != b[1] for a, b in zip(steps["0"], steps["1"], strict=True))   # compared, and different


def test_a_model_fed_tensors_colltrace_does_not_read_is_judged_by_its_loaders_batches(torchrun_job):
    """As a model fed CUDA tensors (reading them would sync the GPU): the batch the DataLoader gave
    is digested on the CPU instead, from the second sampled step on."""
    job = run(torchrun_job, "ddp", "no_sampler", opaque=True)
    res = run_cli("analyze", job.dir)
    assert res.returncode == 1, res.stdout
    assert (f"ranks 0-1 trained on identical batches in 7 of 7 sampled steps: the DataLoader at "
            f"{loc('loader_before', JOB)} was built before init_process_group") in res.stdout
    clean = run(torchrun_job, "ddp", "sampler", opaque=True)
    assert clean.findings() == [] and run_cli("analyze", clean.dir).returncode == 0
    for pairs in sampled(clean.dir).values():
        assert pairs[0][1] is None and all(d for _, d in pairs[1:])   # compared from step 2 on


def test_a_smoke_test_on_made_up_data_is_named_in_the_exhaustive_mode_only(torchrun_job):
    """No DataLoader: torch.randn from one seed on every rank, as the DDP tutorial does."""
    job = run(torchrun_job, "ddp", "synthetic")
    assert job.findings() == [] and run_cli("analyze", job.dir).returncode == 0
    assert all(len(pairs) == 8 for pairs in sampled(job.dir).values())
    job = run(torchrun_job, "ddp", "synthetic", COLLTRACE_DIGEST="1")
    res = run_cli("analyze", job.dir)
    assert res.returncode == 1
    assert ("ranks 0-1 trained on identical batches in 20 of 20 sampled steps: no DataLoader was seen feeding them; "
            f"the batches reach the model at {loc('forward', JOB)}") in res.stdout


def test_a_world_of_one_is_not_named(torchrun_job):
    job = run(torchrun_job, "ddp", "no_sampler", nprocs=1)
    assert job.findings() == []
    assert run_cli("analyze", job.dir).returncode == 0


@pytest.mark.parametrize("script, loader, forward", [
    ("lightning_batches.py", "lit_loader", None),   # Lightning calls the model: its fit() line is the user's
    ("accelerate_batches.py", "acc_loader", "acc_forward"),
])
def test_frameworks_split_the_data_and_a_users_own_loader_is_named(torchrun_job, script, loader, forward):
    """Lightning and accelerate give the user's loader a sampler of their own: clean. The user's
    loader used as it is (use_distributed_sampler=False; not passed to prepare) is named."""
    healthy = torchrun_job(script, 2, args=["healthy"])
    assert healthy.wait(150) == 0, healthy.err[-3000:]
    assert healthy.out.count("DONE") == 2 and healthy.findings() == []
    assert all(len(pairs) == 8 and {d for _, d in pairs} != {None} for pairs in sampled(healthy.dir).values())
    job = torchrun_job(script, 2, args=["own_loader"])
    assert job.wait(150) == 0, job.err[-3000:]
    (f,) = job.findings()
    assert f["kind"] == "duplicate_data" and sorted(f["ranks"]) == ["0", "1"]
    assert "ranks 0-1 trained on identical batches in" in f["summary"]
    assert f"the DataLoader at {loc(loader, script)} " in f["summary"] and "DistributedSampler" in f["summary"]
    if forward:
        assert f"is called at {loc(forward, script)}" in f["summary"], f["summary"]


def test_a_failure_in_batch_sampling_is_said_once_and_changes_nothing(torchrun_job):
    job = run(torchrun_job, "ddp", "no_sampler", CT_BREAK_BATCHES="1")
    plain = run(torchrun_job, "ddp", "no_sampler", traced=False)
    assert loss(job) == loss(plain)
    lines = [x for x in job.err.splitlines() if x.startswith("colltrace: internal error in batch sampling")]
    assert len(lines) == 2 and all("simulated colltrace bug" in x for x in lines)   # once per rank
    assert job.findings() == []
    from colltrace.tracefile import reader

    for tr in reader.load_traces(job.dir):   # the collectives are traced as ever
        assert any("batch sampling stopped" in n for n in tr.notes)
        assert [r for r in tr.all_records() if r["op"] == "barrier"]
