"""Where the missing rank is without ptrace, and whether it moves: 2 gloo ranks, rank 0 waits in
a barrier while rank 1 is elsewhere. py-spy refused (a stand-in that fails as under
ptrace_scope=1) or absent: the rank's own thread or faulthandler's signal still names its line."""
from __future__ import annotations

import json
import os

import pytest

from helpers.jobs import findings, markers, wait_finding

pytestmark = pytest.mark.slow
SCRIPT = "where_missing.py"
REFUSED = "#!/bin/sh\necho 'Error: Failed to open process: Permission denied (os error 13)' >&2\nexit 1\n"


def loc(marker: str) -> str:
    return f"{SCRIPT}:{markers(SCRIPT)[marker]}"


def frames_line(entry) -> set[str]:
    return {f"{os.path.basename(f['file'])}:{f['line']}" for f in entry.get("frames") or []}


def without_py_spy(tmp_path, how) -> dict:
    """The environment for a job whose watchdog finds py-spy refused, or none at all."""
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "py-spy"))]
    if how == "refused":
        stub = tmp_path / "bin"
        stub.mkdir()
        (stub / "py-spy").write_text(REFUSED)
        (stub / "py-spy").chmod(0o755)
        return {"PATH": os.pathsep.join([str(stub)] + path)}
    # absent: off PATH, and the copy beside this venv's python (stacks.py's fallback) pointed away
    return {"PATH": os.pathsep.join(path), "COLLTRACE_PY_SPY": str(tmp_path / "no-py-spy-here")}


@pytest.mark.parametrize("how", ["refused", "absent"])
@pytest.mark.parametrize("scenario, marker, route, state", [
    ("sleep", "nap", "in-process", "frozen"),      # the GIL is free: the rank's own thread answers
    ("regex", "spin", "signal", "progressing"),    # spinning in C with the GIL held: faulthandler answers
])
def test_stall_names_the_missing_ranks_line_without_py_spy(gloo_job, tmp_path, how, scenario, marker, route, state):
    job = gloo_job(SCRIPT, 2, args=[scenario], env={"COLLTRACE_STALL_S": "1.5", **without_py_spy(tmp_path, how)})
    f = wait_finding(job, "stall")
    job.kill()
    job.wait(30)
    r1 = f["ranks"]["1"]
    assert f["missing_ranks"] == [1] and r1["state"] == "not_in_collective"
    assert loc(marker) in frames_line(r1), r1
    assert f"{loc(marker)} ({marker})" in f["summary"]
    assert r1["stack_via"] == route
    assert r1["activity"]["state"] == state, r1["activity"]


def test_a_busy_slow_rank_is_reported_not_killed_under_abort(gloo_job):
    job = gloo_job(SCRIPT, 2, args=["busy"], env={"COLLTRACE_STALL_S": "1.5", "COLLTRACE_ON_HANG": "abort",
                                                   "BUSY_S": "6"})
    assert job.wait(90) == [0, 0], job.stderr(0)[-3000:]
    (f,) = [f for f in findings(job.dir) if f["kind"] == "stall"]
    a = f["ranks"]["1"]["activity"]
    assert a["state"] == "progressing" and a["how"] == "busy"
    assert "long_eval" in a["at"]["func"]
    assert "rank 1: busy" in f["summary"] and "abort leaves it running" in f["summary"]
    with open(os.path.join(job.dir, "report.txt")) as fh:
        assert "still working" in fh.read()
    assert "COLLTRACE_ON_HANG=abort (" not in job.stderr(0) + job.stderr(1)   # the watchdog ended nothing
    assert ("stall:0:2 is over: the ranks it waited for arrived (last seen: rank 1 progressing)"
            in job.stderr(0) + job.stderr(1))


def test_a_frozen_rank_is_ended_under_abort(gloo_job):
    job = gloo_job(SCRIPT, 2, args=["sleep"], env={"COLLTRACE_STALL_S": "1.5", "COLLTRACE_ON_HANG": "abort"})
    codes = job.wait(90)
    assert codes[0] != 0 and codes[1] != 0
    (f,) = [f for f in findings(job.dir) if f["kind"] == "stall"]
    assert f["ranks"]["1"]["activity"]["state"] == "frozen"
    assert "COLLTRACE_ON_HANG=abort (stall: rank 1 frozen)" in job.stderr(0) + job.stderr(1)


def test_an_exception_names_its_type_message_and_line_within_a_second(gloo_job):
    job = gloo_job(SCRIPT, 2, args=["raise"], env={"COLLTRACE_STALL_S": "60"})
    f = wait_finding(job, "dead_rank")
    # Rank 0 ends by itself (its collective fails once rank 1 is gone); killing it here would
    # make a death of the test's own doing, which the watchdog rightly reports.
    job.wait(60)
    assert f["rank"] == 1 and f["exit"]["exception"] == "ValueError: bad batch 7"
    assert loc("raise") in frames_line(f["ranks"]["1"])
    assert "ValueError: bad batch 7" in f["summary"] and f"{loc('raise')} (load_batch)" in f["summary"]
    assert len([x for x in findings(job.dir) if x["kind"] == "dead_rank"]) == 1   # rank 0's error is a consequence
    with open(os.path.join(job.dir, "rank-00001.defs.jsonl")) as fh:
        (raised,) = [d for d in map(json.loads, fh) if d.get("k") == "exception"]
    assert f["detected_at"] - raised["t"] < 1.0


def test_a_thread_that_died_is_named_as_the_cause(gloo_job):
    job = gloo_job(SCRIPT, 2, args=["thread_raise"], env={"COLLTRACE_STALL_S": "1.5"})
    f = wait_finding(job, "stall")
    job.kill()
    job.wait(30)
    assert f["advice"].startswith(f"Look first at {loc('thread_raise')} (prefetch): rank 1's thread prefetcher "
                                  f"died of ZeroDivisionError")
    assert loc("wait_batch") in f["advice"]
