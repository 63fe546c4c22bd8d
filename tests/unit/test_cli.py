"""Bad input to the CLI: one clear line on stderr, exit 2, no traceback."""
from __future__ import annotations


import pytest
from helpers.cli import run_cli


def cli(*args):
    return run_cli(*args)


@pytest.mark.parametrize("args", [
    ["dump", "/nonexistent/folder"],
    ["analyze", "/nonexistent/folder"],
    ["dump", "--rank", "x", "."],
    ["frobnicate"],
    ["run"],
    ["run", "--stall-s", "-1", "--", "true"],
    ["run", "--abort-stall-s", "-1", "--", "true"],
    ["dump", "DIR", "--from-store", "nohostport"],
])
def test_bad_usage_is_one_line_and_exit_2(args, tmp_path):
    args = [str(tmp_path) if a == "DIR" else a for a in args]
    out = cli(*args)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("colltrace: error:"), out.stderr
    assert "Traceback" not in out.stderr


def test_empty_folder_is_not_a_trace(tmp_path):
    out = cli("dump", str(tmp_path))
    assert out.returncode == 2 and "no colltrace trace files" in out.stderr


def test_corrupt_snapshot_is_reported(tmp_path):
    (tmp_path / "snapshot.json").write_text("{not json")
    out = cli("analyze", str(tmp_path))
    assert out.returncode == 2 and "snapshot.json" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_unreachable_store_is_one_line(tmp_path):
    out = cli("dump", str(tmp_path), "--from-store", "127.0.0.1:1")
    assert out.returncode == 2 and "cannot reach" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_analyze_uses_the_jobs_own_stall_threshold(tmp_path):
    """A folder from a job run with COLLTRACE_STALL_S=2: post-mortem analysis judges it by 2 s,
    as the live watchdog did, not by this shell's default of 30 s."""
    import json

    from test_analysis import STALL, T, Job

    job = Job(2)
    job.history("0", 3)
    job.op(0, "0", 4, "barrier", "waiting", at="train.py:40", t=T)
    snap = job.snap()
    snap["taken_at"] = T + 5      # rank 0 waited 5 s: a stall at 2 s, nothing at 30
    for e in snap["ranks"].values():
        e["stall_s"] = 2.0
        e["heartbeat"] = T + 5
    (tmp_path / "snapshot.json").write_text(json.dumps(snap))
    out = cli("analyze", str(tmp_path), "--json")
    assert out.returncode == 1, out.stderr
    (f,) = json.loads(out.stdout)["findings"]
    assert f["kind"] == "stall" and f["missing_ranks"] == [1]
    assert cli("analyze", str(tmp_path), "--stall-s", str(STALL)).returncode == 0


def test_the_folder_colltrace_run_makes_reads_its_newest_run(tmp_path):
    """`colltrace analyze colltrace-out` (the folder `colltrace run` makes, holding run-* folders):
    the newest run, as if named, and one line saying which."""
    import os
    import shutil

    recorded = os.path.join(os.path.dirname(__file__), "..", "fixtures", "recorded")
    out_dir = tmp_path / "colltrace-out"
    shutil.copytree(os.path.join(recorded, "healthy"), out_dir / "run-20261125-090000")
    newest = out_dir / "run-20261125-101500"
    shutil.copytree(os.path.join(recorded, "deadlock"), newest)
    (out_dir / "run-20261125-110000").mkdir()   # a run that never started a rank: nothing to read
    perfetto = tmp_path / "t.json"
    for args in (["analyze"], ["dump"], ["export", "--perfetto", perfetto]):
        named, parent = cli(*args[:1], newest, *args[1:]), cli(*args[:1], out_dir, *args[1:])
        assert (parent.returncode, parent.stdout) == (named.returncode, named.stdout), args
        said = [l for l in parent.stderr.splitlines() if l not in named.stderr.splitlines()]
        assert len(said) == 1 and said[0].startswith("colltrace: ") and str(newest) in said[0], parent.stderr
    assert cli("analyze", out_dir).returncode == 1   # the deadlock, not the healthy run
    assert "no colltrace traces" in cli("analyze", out_dir / "run-20261125-110000").stderr   # named: as before
