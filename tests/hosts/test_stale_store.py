"""The store the watchdogs meet in is the one the job's process group was made with, never a
stale MASTER_ADDR/MASTER_PORT left in the environment (PyTorch's own c10d tests leave one from
an earlier test while later tests make their own stores): the job's output is the untraced one."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def dead_port() -> int:
    """A port nobody listens on (an earlier test's store, gone)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(gloo_job, tmp_path, kind: str, env: dict):
    """The job untraced and traced, side by side (each mostly sleeps between its steps): (plain, traced)."""
    from torch.distributed import TCPStore

    jobs, own = [], []
    for traced in (False, True):
        if kind == "tcp":   # the test hosts the job's own store, on a port of its own
            own.append(TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False))
            where = str(own[-1].port)
        else:
            where = str(tmp_path / f"filestore-{traced}")
        # No WORLD_SIZE/LOCAL_WORLD_SIZE: MultiProcessTestCase passes them to init_process_group only.
        jobs.append(gloo_job("own_store.py", 2, args=[kind, where, 2], traced=traced,
                             env={"WORLD_SIZE": "", "LOCAL_WORLD_SIZE": "", **env}))
    for job in jobs:
        assert job.wait(120) == [0, 0]
    del own
    return jobs[0], jobs[1]


def extra_lines(traced, plain) -> list[str]:
    """The traced job's stderr lines an untraced run of it did not print."""
    seen = [line for r in range(2) for line in plain.stderr(r).splitlines()]
    out = []
    for line in (said for r in range(2) for said in traced.stderr(r).splitlines()):
        if line in seen:
            seen.remove(line)
        else:
            out.append(line)
    return out


@pytest.mark.parametrize("kind", ["tcp", "file"])
def test_a_stale_master_port_changes_nothing_for_a_job_with_its_own_store(gloo_job, tmp_path, kind):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(dead_port()), "STEPS": "15"}
    plain, job = run(gloo_job, tmp_path, kind, env)
    assert [job.stdout(r) for r in range(2)] == [plain.stdout(r) for r in range(2)]
    assert all(job.stdout(r).count("RESULT") == 1 for r in range(2))
    assert extra_lines(job, plain) == []   # not even a warning: the store it met is the job's own


# 10 steps: the job ends while the watchdog still tries the store (its thread inside c10d's
# connect as it exits); 50: it gives up first, and says so.
@pytest.mark.parametrize("steps", ["10", "50"])
def test_a_store_asked_for_that_cannot_be_reached_costs_one_line_and_no_c10d_text(gloo_job, tmp_path, steps):
    env = {"COLLTRACE_STORE": f"127.0.0.1:{dead_port()}", "STEPS": steps}
    plain, job = run(gloo_job, tmp_path, "file", env)
    assert [job.stdout(r) for r in range(2)] == [plain.stdout(r) for r in range(2)]
    extra = extra_lines(job, plain)
    assert len(extra) <= 1 and all(line.startswith("colltrace: warning:") for line in extra), extra


def test_a_pytorch_test_session_with_an_earlier_tests_master_port_prints_what_it_prints_untraced(tmp_path):
    """The issue's own shape: MultiProcessTestCase tests, each with its own FileStore, in one
    pytest session whose MASTER_ADDR/MASTER_PORT are an earlier test's."""
    from helpers import environ
    from helpers.paths import JOBS
    from helpers.procs import kill_all

    base = environ.clean("MASTER_", "TORCHELASTIC", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(dead_port()), OMP_NUM_THREADS="1")

    def start(traced: bool):
        d = str(tmp_path / f"trace-{traced}")
        env = dict(base, COLLTRACE="1", COLLTRACE_DIR=d) if traced else base
        # -o addopts=: a user's session, not this suite's options (its --durations lines differ run to run)
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-o", "addopts=",
                                 os.path.join(JOBS, "mptc_stale_env.py")], cwd=tmp_path / str(traced), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        return proc, d

    def session(proc, d) -> list[str]:
        try:
            out, _ = proc.communicate(timeout=240)
        finally:
            kill_all(proc.pid, d)
        assert proc.returncode == 0, out
        # Times, pids and ports differ between two runs; the ranks' lines interleave as they come.
        return sorted(re.sub(r"\d+(\.\d+)?", "N", line).replace(" (N:N:N)", "") for line in out.splitlines())

    for traced in (False, True):
        (tmp_path / str(traced)).mkdir()
    runs = [start(False), start(True)]   # side by side: two sessions, each its own FileStores
    plain, traced = session(*runs[0]), session(*runs[1])
    assert "N passed in Ns" in " ".join(plain)
    assert traced == plain
