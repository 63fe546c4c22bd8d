"""COLLTRACE_ON_HANG as a host applies it (colltrace/host/actions.py), with real processes to end:
each certain finding acted on once even after a stall, abort not held up by slow stack dumps, and
the ending recorded (tracefile/endings.py) so that every reader tells it as it happened."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from colltrace.host import actions, probes
from colltrace.model.finding import Deadlock, Mismatch, Stall
from colltrace.reporters import phrases, text
from colltrace.tracefile import endings


class Outputs:
    def __init__(self):
        self.lines, self.stacks_written = [], {}

    def say(self, line):
        self.lines.append(line)

    def stacks(self, rank, t):
        self.stacks_written[rank] = t


@pytest.fixture
def sleepers():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(3)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def node_of(tmp_path, procs):
    traces = {r: SimpleNamespace(meta={"pid": p.pid, "host": "node7"}) for r, p in enumerate(procs)}
    return SimpleNamespace(dir=str(tmp_path), traces=traces, pids=lambda: {r: p.pid for r, p in enumerate(procs)},
                           host_name=lambda: "node7")


def on_hang(tmp_path, procs, mode):
    return actions.OnHang(SimpleNamespace(on_hang=mode, abort_stall_s=0.0), node_of(tmp_path, procs), Outputs())


STALL_BUSY = Stall(key="stall:2:1", missing_ranks=[1], waited_s=5.0,
                   ranks={"1": {"state": "not_in_collective", "activity": {"state": "progressing"}}})
STALL_ENTERING = Stall(key="stall:2:1", missing_ranks=[1], waited_s=5.0,
                       ranks={"1": {"state": "waiting", "op": "barrier", "group": "0", "seq": 3}})
DEADLOCK = Deadlock(key="deadlock:0#3,2#1", missing_ranks=[1], ranks={})


def test_a_stall_whose_missing_rank_just_entered_another_collective_is_not_acted_on():
    """The moment the busy ranks enter their barrier the wait is about to become a cycle: ending
    the job then as a 'stall' would hide the deadlock."""
    assert actions.act_on(STALL_ENTERING, "abort") == (False, "stall")
    assert actions.act_on(STALL_BUSY, "abort")[0] is False


def test_the_deadlock_after_a_reported_stall_is_acted_on(tmp_path, sleepers, monkeypatch):
    monkeypatch.setattr(probes, "dump_text", lambda *a, **k: "stack text\n")
    h = on_hang(tmp_path, sleepers, "dump")
    assert h.due([STALL_BUSY]) == ("stall", "stall:2:1")       # dump acts on every hang
    h.act("stall", "stall:2:1")
    assert h.due([STALL_BUSY]) is None                            # once per finding
    assert h.due([DEADLOCK]) == ("deadlock", DEADLOCK.key)     # the certain one after it: acted on too
    h.act("deadlock", DEADLOCK.key)
    assert h.outputs.stacks_written == {0: "stack text\n", 1: "stack text\n", 2: "stack text\n"}
    assert all(p.poll() is None for p in sleepers)                # dump ends nothing


def test_abort_ends_every_rank_at_once_and_records_why(tmp_path, sleepers, monkeypatch):
    def slow_dump(directory, rank, pid, meta, native=True):
        time.sleep(0 if rank == 0 else 30)   # one quick rank, two whose dumps never come in time
        return f"rank {rank} stacks\n"

    monkeypatch.setattr(probes, "dump_text", slow_dump)
    h = on_hang(tmp_path, sleepers, "abort")
    assert h.due([STALL_BUSY]) is None                            # ranks still computing: left running
    assert h.due([STALL_BUSY, DEADLOCK]) == ("deadlock", DEADLOCK.key)
    t0 = time.monotonic()
    h.act("deadlock", DEADLOCK.key)
    for p in sleepers:
        p.wait(timeout=5)
    assert time.monotonic() - t0 < actions.ABORT_DUMP_S + 0.5   # not one dump after another, never 30 s
    assert [p.returncode for p in sleepers] == [-9, -9, -9]
    assert h.outputs.stacks_written[0] == "rank 0 stacks\n" and "no stack dump within" in h.outputs.stacks_written[1]
    assert h.due([DEADLOCK, Mismatch(key="mismatch:0#4", missing_ranks=[1])]) is None   # once aborted
    with open(endings.path(str(tmp_path), "node7")) as f:
        record = json.load(f)
    assert record["why"] == "deadlock" and record["finding"] == DEADLOCK.key
    assert record["ranks"] == {str(r): p.pid for r, p in enumerate(sleepers)}
    assert endings.read(str(tmp_path))[2] == {"why": "deadlock", "finding": DEADLOCK.key, "at": record["at"],
                                              "pid": sleepers[2].pid}


def test_unreadable_ending_files_are_skipped(tmp_path):
    (tmp_path / "ended-a.json").write_text("{not json")
    (tmp_path / "ended-b.json").write_text(json.dumps({"ranks": {"x": 1}, "why": "deadlock", "at": 1.0}))
    endings.write(str(tmp_path), "c", "mismatch", "mismatch:0#3", {4: 44})
    assert list(endings.read(str(tmp_path))) == [4]


def test_the_ending_is_told_as_it_happened():
    at = time.mktime((2026, 11, 25, 14, 37, 17, 0, 0, -1))
    e = {"state": "dead", "status": "dead", "exit": endings.exit_info({"why": "deadlock", "at": at})}
    assert phrases.exit_text(e) == "ended by colltrace (abort: deadlock) at 14:37:17"
    f = Deadlock(cycle=[{"group": "0", "waiting": [0], "missing": [1]}], ranks={"0": dict(e), "1": dict(e)},
                 waited_s=3.0)
    paragraph = text.paragraph(f)
    assert "colltrace then ended ranks 0-1 (abort: deadlock) at 14:37:17." in paragraph
    assert "died since" not in paragraph and "vanished" not in paragraph


def test_a_superseded_stall_is_one_line_in_the_report():
    stall = Stall(key="stall:2:1", summary="Stall: rank 3 has waited 3.1 s. More.", detected_at=time.time(),
                  superseded_by="deadlock:0#3,2#1")
    dl = Deadlock(key="deadlock:0#3,2#1", summary="Deadlock.", supersedes=["stall:2:1"], cycle=[], ranks={})
    report = text.render_report([stall, dl])
    assert report.startswith("colltrace: 1 finding (and 1 earlier stall that turned into it)")
    assert "[1] Superseded by [2] below: the stall reported at" in report and "Stall: rank 3 has waited 3.1 s" in report
    assert report.count("Stall: rank 3") == 1
