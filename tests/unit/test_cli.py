"""Bad input to the CLI: one clear line on stderr, exit 2, no traceback."""
from __future__ import annotations

import os

import pytest

from helpers.cli import run_cli
from helpers.paths import FIXTURES

DEADLOCK = os.path.join(FIXTURES, "recorded", "deadlock")


def cli(*args):
    return run_cli(*args)


@pytest.mark.parametrize("args,named", [
    (["analyze", "--bogus"], "--bogus"),                 # not "the following arguments are required: dir"
    (["analyze", DEADLOCK, "--bogus"], "--bogus"),
    (["dump", "--bogus=3"], "--bogus=3"),
    (["export", "--bogus", DEADLOCK], "--bogus"),
])
def test_an_unknown_flag_is_named_before_a_missing_argument(args, named):
    out = cli(*args)
    assert out.returncode == 2 and out.stderr == f"colltrace: error: unrecognized arguments: {named}\n", out.stderr


def test_an_abbreviated_flag_and_a_negative_value_are_no_unknown_flags():
    assert cli("analyze", DEADLOCK, "--stall=4").returncode == 1
    out = cli("analyze", DEADLOCK, "--stall-s", "-4")
    assert out.returncode == 2 and "--stall-s: must be >= 0" in out.stderr


def test_dump_of_a_rank_not_in_the_folder_names_the_ranks_it_has():
    out = cli("dump", DEADLOCK, "--rank", "1", "--rank", "9")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().endswith("rank 9: not in " + DEADLOCK + " (its ranks: 0-3)")


def test_dump_heads_its_columns_and_shows_the_last_records_asked_for():
    out = cli("dump", DEADLOCK, "--rank", "0", "--last", "1")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].startswith("time: seconds since the first record (")
    assert lines[1].split() == ["time", "group", "number", "op", "state", "took", "shapes", "dtypes", "where"]
    assert lines[2] == "rank 0: 3 records (last 1 shown)" and len(lines) == 4
    assert lines[3].index("s  group") == lines[1].index("time") + len("time") - 1   # the times end under "time"


def test_run_help_shows_the_job_after_the_double_dash():
    out = cli("run", "--help")
    assert out.returncode == 0 and " -- CMD [ARG ...]" in " ".join(out.stdout.split("options:")[0].split())


def test_lint_of_a_folder_without_python_files_is_bad_input(tmp_path):
    (tmp_path / "notes.txt").write_text("dist.barrier()\n")
    out = cli("lint", tmp_path)
    assert out.returncode == 2 and out.stderr == f"colltrace: error: no Python files in {tmp_path}\n"


def test_every_count_says_finding_the_same_way(tmp_path):
    """analyze, export and run (reporters/ending.py) count findings in one wording."""
    from colltrace.words import counted

    assert [counted(n, "finding") for n in (0, 1, 2)] == ["no findings", "1 finding", "2 findings"]
    analyzed = cli("analyze", DEADLOCK)
    assert analyzed.returncode == 1 and "colltrace: 1 finding\n" in analyzed.stdout
    exported = cli("export", DEADLOCK, "--perfetto", tmp_path / "t.json")
    assert exported.returncode == 0 and ", 1 finding)" in exported.stderr, exported.stderr


@pytest.mark.parametrize("args", [
    ["dump", "/nonexistent/folder"],
    ["analyze", "/nonexistent/folder"],
    ["dump", "--rank", "x", "."],
    ["frobnicate"],
    ["run"],
    ["run", "--stall-s", "-1", "--", "true"],
    ["run", "--abort-stall-s", "-1", "--", "true"],
    ["dump", "DIR", "--from-store", "nohostport"],
    ["analyze", "RECORDED", "--stall-s", "-3"],
    ["export", "RECORDED", "--perfetto", "DIR/t.json", "--stall-s", "-3"],
    ["dashboard", "RECORDED", "--stall-s", "-3"],     # the same flag as analyze's: the same check
    ["dashboard", "RECORDED", "--stall-s", "nan"],
    ["dashboard", "RECORDED", "--port", "70000"],
    ["dump", "RECORDED", "--last", "-1"],
    ["dump", "RECORDED", "--last", "0"],
    ["dump", "RECORDED", "--rank", "9"],
    ["lint", "DIR"],
])
def test_bad_usage_is_one_line_and_exit_2(args, tmp_path):
    args = [a.replace("DIR", str(tmp_path)).replace("RECORDED", DEADLOCK) for a in args]
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

    from helpers.synthetic import STALL, SyntheticJob, T

    job = SyntheticJob(2)
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
        said = [line for line in parent.stderr.splitlines() if line not in named.stderr.splitlines()]
        assert len(said) == 1 and said[0].startswith("colltrace: ") and str(newest) in said[0], parent.stderr
    assert cli("analyze", out_dir).returncode == 1   # the deadlock, not the healthy run
    assert "no colltrace traces" in cli("analyze", out_dir / "run-20261125-110000").stderr   # named: as before
