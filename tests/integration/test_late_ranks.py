"""Who made everyone wait, on real ranks: 4 gloo ranks, 150 all_reduces, a 40 ms sleep in the data
loading of one rank (or of every rank): the watchdog's live line, then `colltrace analyze --json` on
the folder."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from helpers.paths import JOBS

pytestmark = pytest.mark.timeout(180)


def _line_of(name, text):
    path = os.path.join(JOBS, name)
    with open(path) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def analyze(directory):
    out = subprocess.run([sys.executable, "-m", "colltrace.cli", "analyze", directory, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr   # a straggler is never a finding
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def jobs(module_gloo_job):
    """Both jobs at once (each mostly sleeps): one late rank, and the same sleep on every rank.
    A window of 2 s: the live line is due once a second of collectives has been judged."""
    return {late: module_gloo_job("late_loader.py", 4, env={"LATE_RANK": late, "COLLTRACE_STRAGGLER_WINDOW_S": "2"})
            for late in ("2", "all")}


def test_the_rank_whose_loading_is_slow_is_named_with_its_loading_function(jobs):
    job = jobs["2"]
    assert job.wait(120) == [0, 0, 0, 0], job.stderr(0)
    live = [line for r in range(4) for line in job.stderr(r).splitlines() if "straggler" in line]
    assert len(live) == 1 and live[0].startswith("colltrace: straggler: rank 2 arrived last at "), live
    assert "not a hang" in live[0]
    sleep_line = _line_of("late_loader.py", "time.sleep(load_s)")
    # where it was while the others waited: its own samples, in the loading function, not the call
    assert f"while they waited it was at late_loader.py:{sleep_line} (load_batch) in " in live[0], live[0]
    doc = analyze(job.dir)
    assert doc["findings"] == []
    [s] = doc["stragglers"]
    assert s["rank"] == 2
    assert s["collectives"] >= 0.9 * s["of"] and s["of"] >= 140
    assert 0.03 <= s["lag_s"] <= 0.2 and s["late_share"] >= 0.25
    assert s["waited_for_s"] >= 3 * 0.03 * s["collectives"]
    top = s["where"][0]
    assert os.path.basename(top["file"]) == "late_loader.py" and top["func"] == "load_batch" and top["share"] > 0.9
    assert top["line"] == sleep_line and s["where_from"] == "samples" and s["samples"] >= 50


def test_the_same_sleep_on_every_rank_names_nobody(jobs):
    job = jobs["all"]
    assert job.wait(120) == [0, 0, 0, 0], job.stderr(0)
    assert [line for r in range(4) for line in job.stderr(r).splitlines() if "straggler" in line] == []
    doc = analyze(job.dir)
    assert doc["findings"] == [] and doc["stragglers"] == []
    assert not glob.glob(os.path.join(job.dir, "*.samples.jsonl")), "nobody waited for anybody: nothing sampled"
