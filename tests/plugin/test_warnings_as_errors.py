"""`COLLTRACE=1 python -m pytest -W error` (or `filterwarnings = error`): the start-up hook's
early import of colltrace must not make pytest's assertion rewriting warn (the session would
end before its first test)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import environ


@pytest.mark.parametrize("how", ["-W error", "filterwarnings = error"])
def test_a_session_with_warnings_as_errors_runs(tmp_path, how):
    (tmp_path / "test_tiny.py").write_text("def test_sum():\n    assert 1 + 1 == 2\n")
    args = ["-W", "error"] if how == "-W error" else []
    if how == "filterwarnings = error":
        (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    env = environ.clean("PYTEST_")
    env.update(COLLTRACE="1", COLLTRACE_DIR=str(tmp_path / "trace"))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_tiny.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout
