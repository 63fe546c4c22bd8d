"""`colltrace build-hooks` and what the ranks do with its build (colltrace/rank/hookbuild.py): a build
is used only by the torch, Python and source it was made for; one that will not load is said once
and the Python route takes over; the command's every outcome is one line and an exit code."""
from __future__ import annotations

import types

import pytest
import torch

from colltrace import cli, config
from colltrace.rank import fastpath, hookbuild, hooks


def test_a_build_is_found_only_for_the_torch_and_source_it_was_made_for(tmp_path, monkeypatch):
    lib = hookbuild.library(tmp_path / hookbuild.key())
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF")
    assert hookbuild.built(tmp_path) == lib
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "9.9.9")           # another torch in this venv
        assert hookbuild.built(tmp_path) is None
    edited = tmp_path / "_hooks.cpp"
    edited.write_text(hookbuild.SOURCE.read_text() + "\n// edited\n")
    monkeypatch.setattr(hookbuild, "SOURCE", edited)      # a source newer than the build
    assert hookbuild.built(tmp_path) is None


def test_a_build_that_does_not_load_is_said_once_and_the_python_route_is_used(monkeypatch, capsys):
    def broken():
        raise ImportError("undefined symbol: _ZN4c10d12ProcessGroup")

    monkeypatch.setattr(hookbuild, "load", broken)
    monkeypatch.setattr(hooks, "_compiled", [])
    monkeypatch.setattr(hooks, "_said", [])
    shim = types.SimpleNamespace(recorder=types.SimpleNamespace(rank=3))
    settings = config.load({"COLLTRACE": "1"})
    assert hooks._compiled_hooks(shim, settings) is None
    assert hooks._compiled_hooks(shim, settings) is None
    said = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(said) == 1 and "rank 3" in said[0] and "undefined symbol" in said[0] and "Python route" in said[0]


@pytest.mark.parametrize("value, hooks_on, compiled, warned", [
    ("", True, True, False), ("1", True, True, False), ("0", False, True, False),
    ("python", True, False, False), ("Python ", True, False, False), ("cxx", True, True, True),
])
def test_colltrace_hooks_python_keeps_to_the_python_hooks(value, hooks_on, compiled, warned, monkeypatch):
    s = config.load({"COLLTRACE": "1", "COLLTRACE_HOOKS": value})
    assert (s.hooks, s.hooks_compiled) == (hooks_on, compiled)
    assert any("COLLTRACE_HOOKS" in w for w in s.warnings) == warned
    monkeypatch.setattr(hookbuild, "load", lambda: pytest.fail("python: no build is even looked for"))
    monkeypatch.setattr(hooks, "_compiled", [])
    if not compiled:
        assert hooks._compiled_hooks(types.SimpleNamespace(recorder=None), s) is None


def build_hooks(capsys, monkeypatch, supported=True, built=None, build=None, distributed=True):
    monkeypatch.setattr(hookbuild, "supported", lambda: supported)
    monkeypatch.setattr(hookbuild, "available", lambda: distributed)
    monkeypatch.setattr(hookbuild, "built", lambda: built)
    monkeypatch.setattr(fastpath, "available", lambda: True)
    monkeypatch.setattr(hookbuild, "build", build or (lambda verbose: pytest.fail("nothing should be compiled")))
    rc = cli.main(["build-hooks"])
    return rc, [line for line in capsys.readouterr().err.splitlines() if line]


def test_build_hooks_on_a_torch_without_distributed_is_one_line_and_exit_2(capsys, monkeypatch):
    rc, said = build_hooks(capsys, monkeypatch, distributed=False)
    assert rc == 2 and len(said) == 1 and "without torch.distributed" in said[0] and torch.__version__ in said[0]


@pytest.mark.parametrize("supported, what", [(False, "the counter and tensor readers for"),
                                             (True, "the counter and tensor readers and c10d hooks")])
def test_build_hooks_says_what_it_compiles_for_this_torch(supported, what, capsys, monkeypatch, tmp_path):
    # torch < 2.14 has no c10d hooks: the readers alone are built, and used
    rc, said = build_hooks(capsys, monkeypatch, supported=supported, build=lambda verbose: tmp_path / "m.so")
    assert rc == 0 and what in said[0] and said[1] == f"colltrace: built {tmp_path / 'm.so'}"


def test_build_hooks_where_a_build_exists_compiles_nothing(capsys, monkeypatch, tmp_path):
    rc, said = build_hooks(capsys, monkeypatch, built=tmp_path / "colltrace_hooks.so")
    where = tmp_path / "colltrace_hooks.so"
    assert rc == 0 and said == [f"colltrace: already built for torch {torch.__version__}: {where}"]


def test_a_failed_build_is_one_line_and_exit_2(capsys, monkeypatch):
    def fails(verbose):
        raise RuntimeError("building needs ninja: pip install ninja")

    rc, said = build_hooks(capsys, monkeypatch, build=fails)
    assert rc == 2 and said[-1] == "colltrace: error: build-hooks: building needs ninja: pip install ninja"


@pytest.mark.parametrize("log, said", [
    # no compiler: ninja's log as cpp_extension raises it
    ("Error building extension 'colltrace_hooks': [1/2] /nonexistent -MMD -c _hooks.cpp -o _hooks.o\n"
     "FAILED: _hooks.o\n/nonexistent -MMD -c _hooks.cpp -o _hooks.o\n/bin/sh: 1: /nonexistent: not found\n"
     "ninja: build stopped: subcommand failed.\n", "/bin/sh: 1: /nonexistent: not found"),
    # a header torch does not ship
    ("Error building extension 'colltrace_hooks': [1/2] c++ -c _hooks.cpp\nFAILED: _hooks.o\nc++ -c _hooks.cpp\n"
     "_hooks.cpp:15:10: fatal error: torch/csrc/distributed/c10d/ProcessGroup.hpp: No such file or directory\n"
     "compilation terminated.\nninja: build stopped: subcommand failed.\n",
     "_hooks.cpp:15:10: fatal error: torch/csrc/distributed/c10d/ProcessGroup.hpp: No such file or directory"),
    ("something else went wrong\nninja: build stopped: subcommand failed.", "something else went wrong"),
])
def test_a_failed_compile_is_said_by_its_cause_not_by_ninjas_command_lines(log, said):
    assert hookbuild._cause(log) == said
