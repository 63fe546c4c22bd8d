"""A trace folder on a full file system: the job runs exactly as untraced, with at most one
colltrace warning per rank, and what was recorded before the disk filled stays readable."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.fixture
def small_fs(tmp_path):
    """A 300 KiB tmpfs: less than one rank's default ring (4 MiB)."""
    d = tmp_path / "small"
    d.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def colltrace_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("colltrace")]


def run(gloo_job, script, args, **kw):
    job = gloo_job(script, 2, args=args, **kw)
    codes = job.wait(120)
    return job, codes, [job.stdout(r) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("ring_slots, script, args, fills", [
    (None, "healthy.py", (2000,), "at start"),   # the ring (4 MiB) does not fit; old code: SIGBUS at ~300 KiB of slots
    ("1024", "many_shapes.py", (600,), "mid-run"),        # the rings fit; the definitions fill the disk
])
def test_a_healthy_job_on_a_full_disk_runs_as_untraced(gloo_job, small_fs, ring_slots, script, args, fills):
    _, codes, untraced = run(gloo_job, script, args, traced=False)
    assert codes == [0, 0]
    env = {"COLLTRACE_RING_SLOTS": ring_slots} if ring_slots else {}
    job, codes, traced = run(gloo_job, script, args, env=env, directory=small_fs / "trace")
    assert codes == [0, 0], [job.stderr(r)[-2000:] for r in range(2)]
    assert traced == untraced and "RESULT" in traced[0]
    for rank in range(2):
        lines = colltrace_lines(job.stderr(rank))
        assert len(lines) == 1, (rank, lines)
        assert "No space left on device" in lines[0] and "the job goes on untraced" in lines[0]
    if fills == "mid-run":   # what was recorded before the disk filled is still there
        out = subprocess.run([sys.executable, "-m", "colltrace.cli", "dump", str(small_fs / "trace"), "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        ranks = json.loads(out.stdout)["ranks"]
        assert sorted(ranks) == ["0", "1"]
        assert all(any(r["op"] == "all_reduce" for r in recs) for recs in ranks.values())
