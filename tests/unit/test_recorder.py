"""Completion tracking off the hot path, with a fake standing in for async work (CUDA events:
test_cudamarks.py)."""
from __future__ import annotations

import time

from colltrace import config
from colltrace.rank.recorder import Recorder
from colltrace.tracefile import reader
from helpers.waiting import wait_until


class FakeWork:
    def __init__(self):
        self.done = False

    def is_completed(self):
        return self.done


class FakeGroup:
    pass


def describe(pg):
    return "7", "fake", [0, 1], "nccl", None


def state_of(directory, rec_id):
    tr = reader.load_traces(directory)[0]
    return next(r for r in tr.all_records() if r["id"] == rec_id)


def make(tmp_path):
    settings = config.load({"COLLTRACE": "1", "COLLTRACE_DIR": str(tmp_path), "COLLTRACE_POLL_S": "0.02"})
    return Recorder(settings, rank=0, world_size=2, backend="nccl")


def test_async_work_completes_when_the_work_does(tmp_path):
    rec = make(tmp_path)
    gs = rec.group_state(FakeGroup(), describe)
    import sys

    work = FakeWork()
    ctx = rec.enter(gs, 0, sys._getframe(0), 1)
    rec.exit(ctx, done=False, waitable=work)
    time.sleep(0.1)
    assert state_of(str(tmp_path), ctx[0])["state"] == "in_flight"
    work.done = True
    assert wait_until(lambda: state_of(str(tmp_path), ctx[0])["state"] == "completed")
    rec.close()


def test_internal_error_is_reported_once_and_tracing_steps_aside(tmp_path, capsys):
    rec = make(tmp_path)
    rec.internal_error(RuntimeError("boom"))
    rec.internal_error(RuntimeError("boom again"))
    err = capsys.readouterr().err
    assert err.count("colltrace: internal error") == 1 and "the job is unaffected" in err
    assert rec.disabled
    rec.close()


def test_a_group_that_cannot_be_described_passes_through_with_one_note(tmp_path, capsys):
    rec = make(tmp_path)
    odd = FakeGroup()

    def broken(pg):
        raise RuntimeError("ProcessGroup name not set")

    assert rec.group_state(odd, broken) is None
    assert rec.group_state(odd, broken) is None
    gs = rec.group_state(FakeGroup(), describe)   # the others are traced as ever
    assert gs is not None and not rec.disabled
    tr = reader.load_traces(str(tmp_path))[0]
    assert ([n for n in tr.notes if "not traced" in n]
            == ["group FakeGroup not traced: RuntimeError('ProcessGroup name not set')"])
    assert "colltrace" not in capsys.readouterr().err
    rec.close()
