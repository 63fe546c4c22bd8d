"""The NCCL path on one GPU: what a single-GPU machine can check of it.

    python3 -m pytest tests/gpu        (on a machine with a CUDA GPU and torch with NCCL)

- CUDA tensors through the compiled path and through the Python wrappers (COLLTRACE_PURE=1): the
  same records, every one completed (a blocking NCCL call returns before its kernel ends: the
  record is completed by a CUDA event the rank's poller queries), the async one too, and the job's
  results are those of the untraced job;
- the hooks on `nccl`, and on `nccl2` and `nccl-legacy` where they exist (torch >= 2.15): a call on
  the group object (`pg.allreduce`), which no wrapper sees, recorded on torch >= 2.14;
- a world of 1 and two ranks sharing the GPU (conftest.py: NCCL_HOSTID per rank);
- a kernel that never finishes ahead of an all-reduce: every rank entered it, none completes, a
  `stall` within seconds, and the all-reduce's start event never fired (the GPU never reached it);
- NCCL's Flight Recorder read back: the rank's answer to its watchdog's request names the traced
  collectives with their numbers, and `colltrace analyze` reads torch's own dump of it.

On a machine without a GPU every test here is skipped (and the module must still import and
collect: CI checks that).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from colltrace.tracefile import reader
from helpers.gpu import BACKENDS, SCRIPT, cuda
from helpers.jobs import findings, markers, records

pytestmark = pytest.mark.skipif(not cuda(), reason="needs a CUDA GPU and torch with NCCL")

OPS = ["all_reduce", "all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_gather_object"]


def _native() -> bool:
    import torch.distributed as dist

    from colltrace.rank import hooks

    return hooks.supported(dist.ProcessGroup)


def _user_ops(recs):
    return [r for r in recs if r["op"] != "untraced"]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_collectives_are_traced_the_same_on_both_routes_and_change_nothing(nccl_job, backend, world):
    fast = nccl_job(backend, "ops", world)
    pure = nccl_job(backend, "ops", world, env={"COLLTRACE_PURE": "1"})
    plain = nccl_job(backend, "ops", world, traced=False)
    for job in (fast, pure, plain):
        assert job.wait(180) == [0] * world, job.stderr(0)[-3000:]
    for r in range(world):
        result = [line for line in fast.stdout(r).splitlines() if line.startswith("RESULT")]
        assert result and result == [line for line in plain.stdout(r).splitlines() if line.startswith("RESULT")]
        assert "colltrace: internal error" not in fast.stderr(r) + pure.stderr(r)

        got = _user_ops(records(fast.dir, r))
        assert [x["op"] for x in got[:len(OPS)]] == OPS, got
        assert got == _user_ops(records(pure.dir, r))   # the compiled path leaves CUDA calls to the wrappers
        assert all(x["state"] == "completed" for x in got), [(x["op"], x["state"]) for x in got]
        first, second = got[0], got[1]
        assert first["shapes"] == [[1024]] and first["dtypes"] == ["float32"] and not first["async"]
        assert second["async"] is True
        assert got[-1]["op"] == "barrier"
        if _native():   # pg.allreduce on the group object: seen by c10d's hooks only
            assert "allreduce" in [x["op"] for x in got], [x["op"] for x in got]
        lines = {f.split(" ")[0] for x in records(fast.dir, r) for f in x["frames"]}   # the user's own lines
        want = markers(SCRIPT)
        assert f"nccl_job.py:{want['all_reduce']}" in lines and f"nccl_job.py:{want['barrier']}" in lines


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kernel_that_never_finishes_ahead_of_a_collective_is_a_stall_it_never_started(nccl_job, backend, world):
    job = nccl_job(backend, "hang", world, env={"COLLTRACE_STALL_S": "2"})
    deadline = time.time() + 90
    found = []
    while time.time() < deadline and not found:
        found = [f for f in findings(job.dir) if f["kind"] == "stall"]
        assert all(p.poll() is None for p in job.procs), job.procs[0].communicate(timeout=10)[1][-3000:]
        time.sleep(0.2)
    assert found, f"no stall finding in 90 s: {findings(job.dir)}"
    f = found[0]
    assert f["missing_ranks"] == [] and f["waiting"] == list(range(world))
    line = markers(SCRIPT)["hung"]
    for r in range(world):
        assert f["ranks"][str(r)]["op"] == "all_reduce"
        assert any(fr["line"] == line and fr["file"].endswith("nccl_job.py") for fr in f["ranks"][str(r)]["frames"])
        # its start event, recorded on the stream behind the kernel, never fired: the GPU has not reached
        # the all_reduce (work queued ahead of it), which the analysis tells from a collective that hangs
        (tr,) = [t for t in reader.load_traces(job.dir) if t.rank == r]
        (hung,) = [x for x in tr.all_records() if x["op"] == "all_reduce" and x["state"] != "completed"]
        assert hung["start_event"] is True and hung["started_at"] is None, hung


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_flight_recorder_of_nccl_is_read_back(nccl_job, backend, tmp_path):
    job = nccl_job(backend, "fr", 1)
    assert job.wait(180) == [0], job.stderr(0)[-3000:]
    assert "FR_ANSWERED True" in job.stdout(0), job.stdout(0) + job.stderr(0)[-3000:]
    from colltrace.tracefile import asks

    with open(asks.fr_dump_path(job.dir, 0)) as fh:
        answer = json.load(fh)
    assert answer["error"] is None, answer["error"]
    # The answer holds the group's newest entries (flightrecorder.KEEP_PER_GROUP); the recorder and the
    # trace count the same collectives, so the numbers name the same calls.
    recs = records(job.dir, 0)
    entry = {e["seq"]: e for e in answer["entries"] if e["group"] == "0" and not e["p2p"]}
    assert max(entry) == max(x["seq_end"] or x["seq"] for x in recs), (entry, recs)
    same = [(entry[x["seq"]], x) for x in recs if x["op"] in ("all_reduce", "broadcast") and x["seq"] in entry]
    assert same, (entry, recs)
    for e, x in same:
        assert (e["op"], e["shapes"], e["dtypes"]) == (x["op"], x["shapes"], x["dtypes"]), (e, x)
    (barrier,) = [x for x in recs if x["op"] == "barrier"]
    assert entry[barrier["seq"] - 1]["op"] == "all_reduce"   # pg.allreduce: the recorder names it, hooks or not

    # torch's own dump (what NCCL writes on a timeout), read by the analyzer: the job's collectives
    # (NCCL's recorder: gloo's holds none of them), and a healthy job
    from colltrace.tracefile import postmortem

    dump_dir = os.path.join(str(tmp_path), f"fr-{backend}-fr-1")
    dumped = [r for r in postmortem.load(dump_dir)["ranks"]["0"]["records"] if r["group"] == "0" and not r["p2p"]]
    assert max(r["seq"] for r in dumped) == max(x["seq_end"] or x["seq"] for x in recs), dumped
    run = subprocess.run([sys.executable, "-m", "colltrace", "analyze", dump_dir, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["findings"] == []
