"""The tested torch range: one line on a newer torch, nothing on a tested one, never an exception;
and the range is what CI runs and what the package asks for."""
from __future__ import annotations

import io
import json
import os
import re
from types import SimpleNamespace

from colltrace import torchcompat
from helpers.paths import ROOT


def test_a_newer_torch_gets_one_line_naming_it_and_the_tested_range():
    assert torchcompat.newer_note("2.16.0+cu130") == (
        "colltrace: torch 2.16 is newer than the versions tested (2.4-2.15): tracing with what it offers")
    assert "torch 3.0 is newer" in torchcompat.newer_note("3.0.0a0+gitabc123")


def test_tested_older_and_unreadable_versions_say_nothing():
    for version in ("2.13.0+cpu", "2.14.1", "2.15.0", "2.15.0a0+git0", "2.12.1", "2.4.1+cu121", "2.3.1", "", "unknown",
                    None):
        assert torchcompat.newer_note(version) is None, version


def test_said_once_per_process_and_never_raises(monkeypatch):
    monkeypatch.setattr(torchcompat, "_said", False)
    out = io.StringIO()
    assert torchcompat.say_if_newer("2.16.1", out) is True
    assert torchcompat.say_if_newer("2.16.1", out) is False
    assert out.getvalue().count("\n") == 1

    class Broken(io.StringIO):
        def write(self, _):
            raise OSError("stderr closed")

    monkeypatch.setattr(torchcompat, "_said", False)
    assert torchcompat.say_if_newer("2.17.0", Broken()) is False


def test_the_range_is_what_ci_runs_and_the_floor_pyproject_asks_for():
    # the README's leg installs requirements-dev.txt's pin; .ci/run's other legs pin theirs
    ci = ""
    for p in (".ci/run", "requirements-dev.txt"):
        with open(os.path.join(ROOT, p)) as f:
            ci += f.read()
    for version in torchcompat.TESTED:
        assert f"torch=={version}" in ci, version
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        deps = f.read()
    oldest = min(torchcompat.TESTED, key=torchcompat.minor)
    assert re.search(r'"torch>={}\.{}"'.format(*torchcompat.minor(oldest)), deps)   # a floor, no upper bound


def fake_torch(version="2.9.1+cu128", hooks=False, dump="off"):
    """A stand-in for torch with what unseen_note looks at: the group class, the Flight
    Recorder's dump function (None: none; "off"/"on": its groups listed or not; "broken")."""
    class ProcessGroup:
        pass

    if hooks:
        ProcessGroup.register_pre_hook = lambda self, i, fn: None

    def dump_fn(includeCollectives, onlyActive):
        if dump == "broken":
            raise RuntimeError("not built with it")
        return json.dumps({"version": "2.9", "pg_config": {"": {"ranks": "[0, 1]"}} if dump == "on" else {},
                           "pg_status": {}})

    c10d = SimpleNamespace(**({} if dump is None else {"_dump_fr_trace_json": dump_fn}))
    return SimpleNamespace(__version__=version, distributed=SimpleNamespace(ProcessGroup=ProcessGroup),
                           _C=SimpleNamespace(_distributed_c10d=c10d))


def test_what_an_older_torch_cannot_name_is_found_by_feature():
    # torch 2.4: no hooks, no dump of the Flight Recorder at all
    assert torchcompat.unseen_note(fake_torch("2.4.1+cu121", dump=None)) == (
        "colltrace: torch 2.4 has no c10d collective hooks (torch 2.14+) and no Flight Recorder dump "
        "(torch._C._distributed_c10d._dump_fr_trace_json): collectives issued from C++ (DDP's gradient "
        "all-reduces, calls on a ProcessGroup itself) are counted, not named")
    # torch 2.9: the dump is there, the recorder off by default: the line says how to turn it on
    note = torchcompat.unseen_note(fake_torch("2.9.1+cu128", dump="off"))
    assert (note.startswith("colltrace: torch 2.9 has no c10d collective hooks (torch 2.14+) and its Flight "
                            "Recorder off: ")
            and note.endswith("; TORCH_FR_BUFFER_SIZE=2000 turns it on and has them named"))
    # named: the recorder on (2.11, 2.13), or c10d's hooks (2.14+) whatever the recorder; unreadable: nothing
    assert torchcompat.unseen_note(fake_torch("2.13.0", dump="on")) is None
    assert torchcompat.unseen_note(fake_torch("2.14.1", hooks=True, dump="off")) is None
    assert torchcompat.unseen_note(fake_torch("2.9.1", dump="broken")) is None
    # the version is only words: a build that reports 2.99 with neither feature still gets the line
    assert "torch 2.99 has no c10d" in torchcompat.unseen_note(fake_torch("2.99.0", dump=None))


def test_the_unseen_note_is_said_once_and_never_raises(monkeypatch):
    import sys

    monkeypatch.setattr(torchcompat, "_said_unseen", False)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(dump="off"))
    out = io.StringIO()
    assert torchcompat.say_if_unseen(out) is True and torchcompat.say_if_unseen(out) is False
    assert out.getvalue().count("\n") == 1 and "TORCH_FR_BUFFER_SIZE=2000" in out.getvalue()

    monkeypatch.setattr(torchcompat, "_said_unseen", False)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(__version__="2.4.1"))   # no _C: odd, never raised
    assert torchcompat.say_if_unseen(io.StringIO()) is False
