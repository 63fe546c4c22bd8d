"""`colltrace analyze` on a run that ended well: collectives that the ranks of one group reached
from different places are warnings (text and --json), never findings, and the exit code stays 0."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from colltrace.tracefile import reader
from helpers.jobs import markers
from helpers.waiting import wait_until


def analyze(directory, *flags):
    return subprocess.run([sys.executable, "-m", "colltrace.cli", "analyze", directory, *flags],
                          capture_output=True, text=True, timeout=60)


def test_out_of_step_ranks_are_a_warning_not_a_finding(gloo_job):
    job = gloo_job("desync.py", 2)
    assert job.wait(60) == [0, 0], job.stderr(0)
    out = analyze(job.dir, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["findings"] == []
    [w] = doc["warnings"]
    assert w["kind"] == "desync" and w["seq"] == 2 and w["group"]["desc"] == "default_pg"
    places = {tuple(p["ranks"]): (os.path.basename(p["file"]), p["func"], p["op"]) for p in w["places"]}
    assert places == {(0,): ("desync.py", "log_metrics", "all_reduce"), (1,): ("desync.py", "sync_grads", "all_reduce")}
    text = analyze(job.dir)
    assert text.returncode == 0
    assert "colltrace: no findings" in text.stdout and "1 warning" in text.stdout
    assert "desync.py:8 (log_metrics)" in text.stdout and "desync.py:12 (sync_grads)" in text.stdout


def test_a_healthy_job_in_step_has_no_warning(gloo_job):
    """...and ending with sys.exit(0) on every rank, after destroy_process_group, it is named
    nowhere: no finding live (the watchdog's last snapshot written, none found) nor after."""
    job = gloo_job("healthy.py", 2, args=[3, "exit"])
    assert job.wait(60) == [0, 0], job.stderr(0)
    out = analyze(job.dir, "--json")
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["findings"] == [] and doc["warnings"] == []
    assert wait_until(lambda: os.path.exists(os.path.join(job.dir, "snapshot.json")), 30)
    assert not os.path.exists(os.path.join(job.dir, "findings.jsonl"))
    for tr in reader.load_traces(job.dir):   # what they did is read back, as it was
        assert tr.status() == ("exited", {"code": 0, "how": "sys.exit", "at": tr.exit["t"]})
        assert tr.snapshot_entry()["stack"][-1]["line"] == markers("healthy.py")["clean_exit"]
