"""The compiled hot path (colltrace/rank/_fastpath.c) records what the Python wrappers record:
the same job traced both ways gives the same records, and the compiled path did take the calls
it is for. COLLTRACE_PURE=1 keeps to the Python wrappers."""
from __future__ import annotations

import json

import pytest

from colltrace.rank import fastpath
from helpers.jobs import internal_errors_with_results_unchanged, records

pytestmark = pytest.mark.skipif(not fastpath.available(), reason="the compiled hot path was not built here")

def run(gloo_job, script="all_ops.py", **env):
    """The job, and how many calls the compiled path recorded itself on rank 0: all_reduce's, and
    [broadcast's, reduce's, gather's, scatter's]."""
    job = gloo_job(script, 2, env=env)
    assert job.wait(120) == [0, 0], job.stderr(0)
    out = [json.loads(line[len("FASTPATH "):]) for line in job.stdout(0).splitlines() if line.startswith("FASTPATH ")]
    return job, out[0]["hits"], out[0]["rooted"]


def test_the_compiled_path_records_what_the_python_wrappers_record(gloo_job):
    fast, hits, rooted = run(gloo_job)
    pure, pure_hits, pure_rooted = run(gloo_job, COLLTRACE_PURE="1")
    assert pure_hits is None and pure_rooted == [None] * 4   # COLLTRACE_PURE=1: the Python wrappers only
    assert hits and hits >= 2           # the plain all_reduces went the compiled way
    assert rooted == [1, 1, 1, 1]       # and broadcast, reduce, gather and scatter
    for rank in (0, 1):
        got, want = records(fast.dir, rank), records(pure.dir, rank)
        assert len(got) == len(want) and got == want


def test_what_the_compiled_path_remembers_never_changes_a_record(gloo_job):
    # alternating signatures and tensor types, more call sites than its stack cache holds, two
    # threads, and the calls it must leave to the Python wrapper (torch.export's flag) or to no one
    # (object parts, calls after tracing stepped aside)
    fast, hits, rooted = run(gloo_job, "fastpath_caches.py")
    pure, _, _ = run(gloo_job, "fastpath_caches.py", COLLTRACE_PURE="1")
    for rank in (0, 1):
        got, want = records(fast.dir, rank), records(pure.dir, rank)
        assert len(got) == len(want) and got == want
        sites = [r["frames"][-1] for r in got if r["frames"] and r["frames"][-1].startswith("generated_sites.py")]
        assert len(sites) == 160 and len(set(sites)) == 80   # innermost frame: each site its own line
        assert {r["thread"] for r in got if r["thread"]} == {"MainThread", "worker"}
    # every plain all_reduce but the one made while exporting went the compiled way
    assert hits == 9 + 160 + 6 + 5 + 2 + 1
    assert rooted == [9, 3, 3, 3]   # every rooted call, whichever way its root was given


def test_a_failure_inside_the_compiled_path_is_said_once_and_the_job_goes_on(gloo_job):
    traced = gloo_job("fastpath_failure.py", 2, env={"COLLTRACE_WATCHDOG": "off"})
    plain = gloo_job("fastpath_failure.py", 2, traced=False)
    for r, errors in internal_errors_with_results_unchanged(traced, plain).items():
        assert len(errors) == 1, traced.stderr(r)[-3000:]
