"""The tested torch range: one line on a newer torch, nothing on a tested one, never an exception;
and the range is what CI runs and what the package asks for."""
from __future__ import annotations

import io
import os
import re

from colltrace import torchcompat

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_a_newer_torch_gets_one_line_naming_it_and_the_tested_range():
    assert torchcompat.newer_note("2.16.0+cu130") == (
        "colltrace: torch 2.16 is newer than the versions tested (2.13-2.15): tracing with what it offers")
    assert "torch 3.0 is newer" in torchcompat.newer_note("3.0.0a0+gitabc123")


def test_tested_older_and_unreadable_versions_say_nothing():
    for version in ("2.13.0+cpu", "2.14.1", "2.15.0", "2.15.0a0+git0", "2.12.1", "", "unknown", None):
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
    ci = "".join(open(os.path.join(ROOT, p)).read() for p in (".ci/run", "requirements-dev.txt"))
    for version in torchcompat.TESTED:
        assert f"torch=={version}" in ci, version
    deps = open(os.path.join(ROOT, "pyproject.toml")).read()
    oldest = min(torchcompat.TESTED, key=torchcompat.minor)
    assert re.search(r'"torch>=%d\.%d"' % torchcompat.minor(oldest), deps)   # a floor, no upper bound
