"""`colltrace build-hooks`: colltrace's C++ module compiled against this torch. On every torch the
compiled path then reads group counters and plain tensors through it, which records what Python's
reads record; on torch >= 2.14 the ranks register its c10d hooks, which record what the Python
hooks record (COLLTRACE_HOOKS=python keeps to the Python route), and no error inside colltrace
reaches the collective through them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch.distributed as dist

from colltrace.rank import fastpath, hookbuild, hooks
from helpers.jobs import internal_errors_with_results_unchanged, records

pytestmark = pytest.mark.skipif(not fastpath.available(), reason="the compiled hot path was not built here")
needs_hooks = pytest.mark.skipif(not hooks.supported(dist.ProcessGroup), reason="torch < 2.14: no c10d hooks")


@pytest.fixture(scope="module")
def built():
    """The build for this torch, made by the command a user types (a no-op where CI made it)."""
    done = subprocess.run([sys.executable, "-m", "colltrace", "build-hooks"], capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    path = hookbuild.built()
    assert path is not None and str(path) in done.stderr, done.stderr
    return path


def run(gloo_job, **env):
    job = gloo_job("hook_route.py", 2, env={"COLLTRACE_WATCHDOG": "off", **env})
    assert job.wait(120) == [0, 0], job.stderr(0)[-3000:] + "\n---rank1---\n" + job.stderr(1)[-3000:]
    (said,) = [json.loads(line[len("HOOKFAST "):]) for line in job.stdout(0).splitlines()
               if line.startswith("HOOKFAST ")]
    return job, said


def test_counters_and_tensors_read_from_cxx_record_what_pythons_reads_record(built, gloo_job):
    # every op form, rooted ones, subgroups and p2p, on any torch: the compiled path read the
    # counters and plain tensors through the build (the job says it loaded it); no record differs
    runs = {}
    for route, env in (("cxx", {}), ("python", {"COLLTRACE_HOOKS": "python"})):
        job = gloo_job("all_ops.py", 2, env={"COLLTRACE_WATCHDOG": "off", **env})
        assert job.wait(120) == [0, 0], job.stderr(0)[-3000:]
        (said,) = [json.loads(line[len("FASTPATH "):]) for line in job.stdout(0).splitlines()
                   if line.startswith("FASTPATH ")]
        runs[route] = job, said
    (cxx, cxx_said), (py, py_said) = runs["cxx"], runs["python"]
    assert cxx_said["compiled"] is True and py_said["compiled"] is False
    assert cxx_said["hits"] == py_said["hits"] >= 2 and cxx_said["rooted"] == py_said["rooted"] == [1, 1, 1, 1]
    for rank in (0, 1):
        got, want = records(cxx.dir, rank), records(py.dir, rank)
        assert len(got) == len(want) and got == want
        assert len({r["group"] for r in got}) >= 2 and all(r["seq"] >= 1 for r in got if r.get("seq") is not None)
        assert not any("internal error" in line or "cannot be used" in line for line in cxx.stderr(rank).splitlines())


@needs_hooks
def test_the_cxx_hooks_record_what_the_python_hooks_record(built, gloo_job):
    cxx, cxx_said = run(gloo_job)
    py, py_said = run(gloo_job, COLLTRACE_HOOKS="python")
    assert cxx_said["compiled"] is True and py_said["compiled"] is False
    assert cxx_said["hits"] == py_said["hits"] >= 20   # the gates' compiled case took the same ops both ways
    for rank in (0, 1):
        got, want = records(cxx.dir, rank), records(py.dir, rank)
        assert len(got) == len(want) and got == want
        assert {"allreduce", "allgather_base", "broadcast", "barrier", "all_reduce"} <= {r["op"] for r in got}
        assert {r["thread"] for r in got if r["thread"]} >= {"MainThread", "worker"}
        assert not any("internal error" in line or "cannot be used" in line for line in cxx.stderr(rank).splitlines())


@needs_hooks
def test_an_error_inside_colltrace_stops_at_the_cxx_hook_said_once(built, gloo_job):
    traced = gloo_job("hook_gate_raises.py", 2, env={"COLLTRACE_WATCHDOG": "off"})
    plain = gloo_job("hook_gate_raises.py", 2, traced=False)
    for r, errors in internal_errors_with_results_unchanged(traced, plain).items():
        assert len(errors) == 1 and "injected: the gate broke" in errors[0], traced.stderr(r)[-3000:]
