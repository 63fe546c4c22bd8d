"""From a checkout that is not installed, a job's processes start colltrace through
startup/sitecustomize.py on PYTHONPATH: `colltrace run` adds it exactly when no colltrace.pth is
in a site directory, and the file itself starts the hook only with COLLTRACE set, then hands over
to the environment's own sitecustomize."""
from __future__ import annotations

import os
import site
import subprocess
import sys

from colltrace import _boot
from helpers import environ
from helpers.paths import ROOT


def test_the_checkout_and_its_startup_folder_only_where_no_hook_is_installed(monkeypatch, tmp_path):
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(tmp_path)])
    monkeypatch.setattr(site, "ENABLE_USER_SITE", False)
    assert _boot.checkout_path() == [ROOT, os.path.join(ROOT, "startup")]
    (tmp_path / "colltrace.pth").write_text("")
    assert _boot.checkout_path() == []


def test_sitecustomize_starts_the_hook_when_asked_and_runs_the_one_it_hides(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys; sys.stderr.write('theirs ran\\n')\n")
    env = environ.clean("PYTHON")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "startup"), str(tmp_path)])
    probe = "import sys; print(sorted(m for m in sys.modules if m.startswith('colltrace')))"
    off = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    on = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**env, "COLLTRACE": "1"},
                        timeout=60)
    assert off.stdout.strip() == "[]" and "theirs ran" in off.stderr, off.stderr
    assert "'colltrace._boot'" in on.stdout and "theirs ran" in on.stderr, on.stderr
