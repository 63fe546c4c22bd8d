"""`colltrace run`'s relay of the job's stderr (colltrace/commands/joboutput.py), fed what torchrun
and the example's ranks really wrote (tests/fixtures/launcher: `examples/distill/train.py --bug
segfault` under torchrun, and `--bug checkpoint_barrier` whose ranks colltrace ended): every line
passes in order but the launcher's failure report and the tracebacks colltrace explains, which are
held, and folded only where colltrace knows why each rank failed."""
from __future__ import annotations

import io
import os
import time

from colltrace.commands import joboutput
from colltrace.reporters import ending
from helpers.paths import FIXTURES

LAUNCHER = os.path.join(FIXTURES, "launcher")


def fixture(name: str) -> str:
    with open(os.path.join(LAUNCHER, name)) as f:
        return f.read()


def relayed(text: str, explained: bool):
    """(what reached the stream, what was held) for the job's stderr `text`."""
    stream = io.StringIO()
    relay = joboutput.Relay(stream, lambda: explained)
    w = os.dup(relay.child_fd)
    relay.start()
    os.write(w, text.encode())
    os.close(w)
    held = relay.finish()
    return stream.getvalue(), held


def held_text(held) -> str:
    return held.log().decode()


def in_order(part: str, whole: str) -> bool:
    """Every line of `part` is a line of `whole`, in the same order."""
    lines = iter(whole.splitlines())
    return all(any(line == x for x in lines) for line in part.splitlines())


def test_a_segfault_the_watchdog_explained_is_folded_whole():
    text = fixture("torchrun-segfault.txt")
    out, held = relayed(text, explained=True)
    assert in_order(out, text) and in_order(held_text(held), text)
    assert sorted(out.splitlines() + held_text(held).splitlines()) == sorted(text.splitlines())   # nothing lost
    assert "Traceback" not in out and "ChildFailedError" not in out and "Sending process" not in out
    assert out.splitlines()[-1] == "[rank1] 2026-11-28 06:54:50,490 waiting for the teacher"
    assert sorted(t.rank for t in held.tracebacks) == [0, 2, 3]
    assert all("Connection" in t.exception and t.exception.startswith("RuntimeError: ") for t in held.tracebacks)
    assert [(f.rank, f.code, f.signal) for f in held.failures()] == [
        (0, -15, "SIGTERM"), (1, -11, "SIGSEGV"), (2, -15, "SIGTERM"), (3, -15, "SIGTERM")]
    groups = joboutput.explain(held, ended=set(), dead={1: "SIGSEGV"})
    assert sorted(groups) == [([0, 2, 3], -15, "SIGTERM", ending.LAUNCHER), ([1], -11, "SIGSEGV", ending.DEAD)]
    line = ending.folded_report_line(groups, [1], len(held.report), "DIR/launcher.txt")
    assert line == (f"colltrace: the launcher's failure report ({len(held.report)} lines, in DIR/launcher.txt): "
                    "rank 1 exitcode -11 (SIGSEGV): the dead rank found above; ranks 0,2-3 exitcode -15 (SIGTERM): "
                    "the launcher ended them after rank 1 failed\n")


def test_what_colltrace_cannot_explain_is_shown_as_it_was():
    """No finding explains the ranks' tracebacks: each is printed whole, in its place; a report
    with a failure colltrace knows nothing of is not folded."""
    text = fixture("torchrun-segfault.txt")
    out, held = relayed(text, explained=False)
    assert held.tracebacks == [] and out.count("Traceback (most recent call last):") == 3
    assert in_order(out, text) and "ChildFailedError" not in out   # the report: decided after the job
    assert joboutput.explain(held, ended=set(), dead={}) is None   # rank 1's SIGSEGV: no finding said it
    stream = io.StringIO()
    joboutput.release(stream, held)
    assert stream.getvalue() == held_text(held) and "Root Cause (first observed failure):" in stream.getvalue()


def test_ranks_colltrace_ended_fold_the_report_to_one_line():
    text = fixture("torchrun-abort.txt")
    out, held = relayed(text, explained=True)
    assert out.splitlines() == [line for line in text.splitlines()[:5]]   # torchrun's warning and the rank's log
    assert joboutput.explain(held, ended={0, 1, 2, 3}, dead={}) == [([0, 1, 2, 3], -9, "SIGKILL", ending.ENDED)]
    assert joboutput.explain(held, ended={0, 1}, dead={}) is None   # ranks 2-3: not colltrace's SIGKILL


def test_the_ending_says_what_colltrace_did():
    ended = {"why": "deadlock", "at": 0.0, "ranks": {0: 11, 1: 12}}
    assert ending.ending_line(ended, [0, 1], "abort", True).startswith(
        "colltrace: ended ranks 0-1 with SIGKILL at ")
    assert ending.ending_line(dict(ended, why="dead_rank"), [], "abort", True, already=[0, 1]) == (
        "colltrace: ended no rank (COLLTRACE_ON_HANG=abort: dead_rank): none was left running; ranks 0-1 had been "
        "ended by the launcher already\n")
    assert ending.ending_line(None, [], "warn", True) == "colltrace: ended no rank (COLLTRACE_ON_HANG=warn)\n"
    assert ending.ending_line(None, [], "warn", False) == ""


def test_a_line_not_ended_yet_passes_at_once_and_other_tracebacks_whole():
    stream = io.StringIO()
    relay = joboutput.Relay(stream)
    w = os.dup(relay.child_fd)
    relay.start()
    os.write(w, b"epoch 1:  50%\r")
    deadline = time.monotonic() + 10
    while "50%" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.getvalue() == "epoch 1:  50%\r"   # a progress bar is not held for its line's end
    mine = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\nValueError: bad\n'
    os.write(w, b"epoch 1: 100%\n" + mine.encode())
    os.close(w)
    held = relay.finish()
    assert stream.getvalue() == "epoch 1:  50%\repoch 1: 100%\n" + mine and held.report == []
