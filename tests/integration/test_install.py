"""Installing colltrace keeps the user's torch: the same version, imported from the same file,
and the same CUDA stack beside it (each nvidia-* package and triton: version, place, files).

The environment is the one this test runs in (each CI leg's own torch: 2.4.1, 2.9.1 and 2.11.0,
CUDA builds with their nvidia-* packages; 2.13.0, the CPU build; 2.14.1 and 2.15.0), seen
through a new venv: a .pth file puts this interpreter's site-packages on the venv's path,
after its own, so pip in the venv finds torch and colltrace's other dependencies installed,
exactly as in a user's environment, and whatever pip installs lands in the venv, ahead of them.
Then `pip install <colltrace>` runs as a user's would, with two differences that keep it to
seconds and change nothing it decides:
- `--no-index`: pip keeps an installed dependency that satisfies the requirement (its default,
  only-if-needed), so with an index it downloads nothing more either. Where the requirement
  excludes the installed torch (the old `torch<2.15` on 2.15.0), pip with an index would
  install another torch into the venv (the silent downgrade); here it fails instead, "No matching
  distribution found for torch". Either way the test fails.
- `--no-build-isolation`: the build backend (hatchling, in the test extra) comes from this
  environment instead of a download.
The package is built from a copy of its sources: the build compiles the hot path, and must not
write into the checkout the running suite imports.
"""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys

import pytest

from helpers import environ
from helpers.paths import ROOT

SOURCES = ("pyproject.toml", "hatch_build.py", "README.md", "LICENSE", "colltrace.pth", "colltrace.start",
           "colltrace", "dashboard")
WHICH_TORCH = "import json, os, torch; print(json.dumps([torch.__version__, os.path.realpath(torch.__file__)]))"
# torch and the CUDA stack pip installed with it, as the interpreter that runs this sees them (the
# first of each name on sys.path, the one imported): version, folder, and its RECORD (every file
# with its hash), so that a package put in front of it, or reinstalled, shows.
WHICH_STACK = """
import hashlib, json, os, importlib.metadata as md
out = {}
for d in md.distributions():
    name = (d.metadata["Name"] or "").lower().replace("_", "-")
    if name in ("torch", "triton") or name.startswith(("nvidia-", "cuda-")):
        record = (d.read_text("RECORD") or "").encode()
        out.setdefault(name, [d.version, os.path.realpath(str(d.locate_file(""))), hashlib.sha256(record).hexdigest()])
print(json.dumps(out, sort_keys=True))
"""


def _run(cmd, timeout, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{cmd[:4]} still running after {timeout} s:\n{exc.stderr or ''}")


def test_installing_colltrace_keeps_the_torch_already_there(tmp_path):
    import hatchling  # noqa: F401  (the test extra has it: without it pip cannot build, whatever the metadata says)
    import torch

    before = [torch.__version__, os.path.realpath(torch.__file__)]
    stack = _run([sys.executable, "-c", WHICH_STACK], 120)
    assert stack.returncode == 0, stack.stderr
    stack_before = json.loads(stack.stdout)
    assert "torch" in stack_before, stack_before
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "_fastpath*.so", "_hooks_build", "node_modules"))
        else:
            shutil.copy2(path, src / name)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 120).check_returncode()
    python = str(venv / "bin" / "python")
    venv_site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 60).stdout.strip()
    # plain path lines: this environment's packages (torch, pip, hatchling) become importable, but its
    # .pth files (colltrace's editable install and start-up hook) are not run in the venv
    ours = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    assert os.path.dirname(os.path.dirname(before[1])) in map(os.path.realpath, ours), ours
    with open(os.path.join(venv_site, "zz-outer-environment.pth"), "w") as f:
        f.write("\n".join(ours) + "\n")

    env = environ.clean("PIP_", "PYTHON")
    # no pip configuration: the machines' cap on torch (a constraint file) must not decide for colltrace
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CONFIG_FILE=os.devnull)
    install = _run([python, "-m", "pip", "install", "--no-index", "--no-build-isolation", str(src)], 300, env=env)
    assert install.returncode == 0, (
        f"pip could not install colltrace beside the torch already there ({before[0]}):\n"
        f"{install.stdout[-3000:]}\n{install.stderr[-3000:]}")

    after = _run([python, "-c", WHICH_TORCH], 120, env=env, cwd=str(tmp_path))
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout.strip().splitlines()[-1]) == before
    stack_after = _run([python, "-c", WHICH_STACK], 120, env=env, cwd=str(tmp_path))
    assert stack_after.returncode == 0, stack_after.stderr
    assert json.loads(stack_after.stdout) == stack_before   # torch and every CUDA package: the same ones
    where = _run([python, "-c", "import colltrace; print(colltrace.__file__)"], 60, env=env, cwd=str(tmp_path))
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr   # the install did happen
    check = _run([python, "-m", "pip", "check"], 120, env=env)
    assert "colltrace" not in check.stdout, check.stdout   # e.g. "colltrace 0.1.0 requires torch<2.15, ..."
