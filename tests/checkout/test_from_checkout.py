"""From a checkout that is not installed (the GPU machine: torch there, no network, no pip
install): `PYTHONPATH=CHECKOUT python -m colltrace run -- torchrun ...` traces the job and names
its mismatch. The interpreter is a new venv that sees this environment's packages (torch) as plain
paths, so neither colltrace's editable install nor its start-up hook (.pth files there) is on
it: only the checkout is (CONTRIBUTING.md, "From a checkout").

Not in the README's test command (pyproject.toml's testpaths): .ci/run's torch 2.11 leg runs it,
on Python 3.12 as on the GPU machine."""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys

import pytest

from helpers import environ
from helpers.paths import ROOT

JOB = """
import datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))   # untraced, it would end there
x = torch.ones(4)
dist.all_reduce(x)
if dist.get_rank() == 0:
    dist.all_reduce(x)
else:
    dist.all_gather([torch.empty(4), torch.empty(4)], x)
"""

pytestmark = pytest.mark.slow


def test_a_checkout_on_pythonpath_traces_a_job_and_names_its_mismatch(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    ours = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    with open(os.path.join(purelib, "zz-outer-environment.pth"), "w") as f:
        f.write("\n".join(ours) + "\n")   # plain paths: their .pth files (colltrace's) are not run
    env = environ.clean("PYTHON")
    bare = subprocess.run([python, "-c", "import colltrace"], capture_output=True, text=True, timeout=60, env=env,
                          cwd=str(tmp_path))
    assert bare.returncode != 0, "colltrace is importable without the checkout: this venv is not bare"

    job = tmp_path / "job.py"
    job.write_text(JOB)
    out = tmp_path / "trace"
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    run = subprocess.run([python, "-m", "colltrace", "run", "--dir", str(out), "--on-hang", "abort", "--",
                          python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(job)],
                         capture_output=True, text=True, timeout=180, env=env, cwd=str(tmp_path))
    assert run.returncode != 0, run.stderr[-3000:]
    with open(out / "findings.jsonl") as f:
        (finding,) = [json.loads(line) for line in f]
    assert finding["kind"] == "mismatch" and finding["seq"] == 2, finding["summary"]
    assert {finding["ranks"]["0"]["op"], finding["ranks"]["1"]["op"]} == {"all_reduce", "all_gather"}
    assert "verdict: Mismatch" in run.stderr, run.stderr[-3000:]
