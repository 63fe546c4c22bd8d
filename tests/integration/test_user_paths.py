"""A user's project may live in a folder named colltrace, torch or lib/python3.11 (a clone of
this repository is a folder named colltrace): frames are told apart by where torch, colltrace and
the standard library are installed, never by words in a path, so the verdicts still name the
user's own lines."""
from __future__ import annotations

import shutil

import pytest

from helpers.jobs import frames_line, loc
from helpers.paths import JOBS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario, kind, marker", [
    ("mismatch", "mismatch", "odd_op"),
    ("deadlock", "deadlock", "ckpt_barrier"),
    ("dead_rank", "dead_rank", "segfault"),
])
def test_jobs_in_folders_named_colltrace_torch_and_lib_python_name_the_users_lines(torchrun_job, tmp_path, scenario,
                                                                                   kind, marker):
    home = tmp_path / "colltrace" / "torch" / "lib" / "python3.11"
    home.mkdir(parents=True)
    script = shutil.copy(f"{JOBS}/scenarios.py", home / "scenarios.py")
    job = torchrun_job(str(script), 4, args=[scenario], env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "60"})
    assert job.wait(120) != 0
    (f,) = [x for x in job.findings() if x["kind"] == kind]
    assert loc(marker) in f["summary"] and loc(marker) in f["advice"], f["summary"] + f["advice"]
    frames = [fr for e in f["ranks"].values() for fr in e.get("frames") or []]
    mine = [fr for fr in frames if str(fr["file"]).startswith(str(home))]
    assert mine and all(fr["origin"] == "user" for fr in mine)
    if kind == "dead_rank":
        # the crash is in libc through ctypes (the standard library), the user's line is where it was called
        assert f"called from {loc(marker)}" in f["summary"], f["summary"]
        stack = f["ranks"]["2"]["stack"]
        assert stack[-1]["func"] == "string_at" and stack[-1]["origin"] == "internal"
        assert loc(marker) in frames_line(f["ranks"]["2"])
