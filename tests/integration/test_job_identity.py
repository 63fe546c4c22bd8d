"""Every job gets its own identity, hence its own watchdog: tests built on PyTorch's
MultiProcessTestCase (one launcher process, a FileStore per test, no MASTER_PORT) included."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import expecttest  # noqa: F401 - torch.testing._internal needs it (the test extra): fail loudly without
import pytest

from helpers import environ
from helpers.jobs import findings
from helpers.paths import JOBS
from helpers.procs import kill_all


def funcs(finding):
    return {fr.get("func") for e in finding.get("ranks", {}).values() for fr in (e.get("frames") or [])}


@pytest.mark.slow
def test_a_later_multiprocess_test_of_a_session_is_watched_too(tmp_path):
    d = str(tmp_path / "trace")
    env = environ.clean("MASTER_", "TORCHELASTIC")
    env.update(COLLTRACE="1", COLLTRACE_DIR=d, COLLTRACE_STALL_S="2", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                             os.path.join(JOBS, "mptc_session.py")], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120     # gloo's own timeout is 30 minutes
        found = []
        while time.time() < deadline and not found and proc.poll() is None:
            found = [f for f in findings(d) if "test_3_rank1_skips_the_barrier" in funcs(f)]
            time.sleep(0.5)
        assert found, f"no finding for the third test; findings: {findings(d)}"
        f = found[0]
        assert f["group"]["ranks"] == [0, 1] and f["ranks"]["0"]["op"] == "barrier"
        assert not [f for f in findings(d) if "_sum" in funcs(f)]   # the correct tests stay correct
    finally:
        kill_all(proc.pid, d)
        proc.communicate(timeout=30)
        kill_all(proc.pid, d)   # a watchdog started while the first round was being killed
