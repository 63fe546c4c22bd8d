"""The hook route's compiled common case (colltrace/rank/_fastpath.c, Gate with a kind) records what
the Python hooks (colltrace/rank/hooks.py) record: the same job, its collectives issued where no
wrapper sees them, traced both ways gives the same records, and the compiled case did take the ops
it is for. COLLTRACE_PURE=1 keeps to the Python hooks. torch >= 2.14 only (c10d's hooks)."""
from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from colltrace.rank import fastpath, hooks
from helpers.jobs import internal_errors_with_results_unchanged, records

pytestmark = [pytest.mark.skipif(not fastpath.available(), reason="the compiled hot path was not built here"),
              pytest.mark.skipif(not hooks.supported(dist.ProcessGroup), reason="torch < 2.14: no c10d hooks")]


def run(gloo_job, **env):
    job = gloo_job("hook_route.py", 2, env={"COLLTRACE_WATCHDOG": "off", **env})
    assert job.wait(120) == [0, 0], job.stderr(0)[-3000:] + "\n---rank1---\n" + job.stderr(1)[-3000:]
    hits = [json.loads(line[len("HOOKFAST "):])["hits"] for line in job.stdout(0).splitlines()
            if line.startswith("HOOKFAST ")]
    return job, hits[0]


def test_the_compiled_hook_case_records_what_the_python_hooks_record(gloo_job):
    fast, hits = run(gloo_job)
    pure, pure_hits = run(gloo_job, COLLTRACE_PURE="1")
    assert pure_hits == 0             # COLLTRACE_PURE=1: the Python hooks only
    # rank 0's all-reduces (loop, alternating signatures, async, thread, subgroup), the gather,
    # scatter and all-to-all forms, the barrier and DDP's buckets went the compiled way (24 of them)
    assert hits >= 20, hits
    for rank in (0, 1):
        got, want = records(fast.dir, rank), records(pure.dir, rank)
        assert len(got) == len(want) and got == want
        ops = {r["op"] for r in got}
        assert {"allreduce", "allreduce_coalesced", "allgather", "allgather_base", "broadcast", "barrier",
                "alltoall_base", "all_reduce"} <= ops, ops
        assert {r["thread"] for r in got if r["thread"]} >= {"MainThread", "worker"}
        assert any(r["async"] for r in got) and any(r["p2p"] for r in got)


def test_a_failure_inside_the_compiled_hook_case_is_said_once_and_the_job_goes_on(gloo_job):
    traced = gloo_job("hook_failure.py", 2, env={"COLLTRACE_WATCHDOG": "off"})
    plain = gloo_job("hook_failure.py", 2, traced=False)
    for r, errors in internal_errors_with_results_unchanged(traced, plain).items():
        assert len(errors) == 1, traced.stderr(r)[-3000:]
