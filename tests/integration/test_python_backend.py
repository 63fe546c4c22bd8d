"""A process group defined in Python (a registered dist.ProcessGroup subclass) is traced like
any other, as the default group or a subgroup; it never switches tracing off."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("where", ["default", "new_group"])
def test_a_python_defined_group_is_traced_and_the_others_too(gloo_job, where):
    job = gloo_job("python_backend.py", 2, args=(where,))
    assert job.wait(120) == [0, 0]
    for rank in range(2):
        assert job.stdout(rank).split() == ["RESULT", "8.0"]
        assert "colltrace" not in job.stderr(rank), job.stderr(rank)
    out = subprocess.run([sys.executable, "-m", "colltrace.cli", "dump", job.dir, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    py, gloo = ("0", "1") if where == "default" else ("1", "0")
    for rank, recs in json.loads(out.stdout)["ranks"].items():
        seen = [(r["group"], r["seq"], r["op"]) for r in recs]
        assert (py, 1, "all_reduce") in seen and (gloo, 1, "all_reduce") in seen, (rank, seen)
        if where == "new_group":
            assert (py, 2, "barrier") in seen and (gloo, 2, "barrier") in seen, (rank, seen)
        else:
            assert (py, 2, "barrier") in seen, (rank, seen)
