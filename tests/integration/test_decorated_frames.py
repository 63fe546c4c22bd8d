"""Decorators never stand for the call: a hang behind the user's own functools.wraps-style
decorator and an installed framework's (an nvtx-style one on its engine's method, a rank-zero one
on the user's function, as DeepSpeed's and Lightning's are) is named at the frame the user's
code called, the framework's method with its class, and the framework's group, made without a
description, by the name the framework keeps it under (never torch's "undefined")."""
from __future__ import annotations

import os
import sys
import sysconfig

import pytest

from colltrace.reporters.locations import call_site
from helpers.jobs import findings, loc

pytestmark = pytest.mark.slow

SCRIPT = "decorated.py"
# An installed framework in miniature: its files are in a site-packages folder (the user site
# that PYTHONUSERBASE names), so the rank's roots classify them as a framework's.
TINYFW = {
    "__init__.py": "from tinyfw.engine import Engine, on_rank_zero  # noqa: F401\n",
    "nvtx.py": (
        "def instrument(func):\n"
        "    def wrapped_fn(*args, **kwargs):   # DeepSpeed's instrument_w_nvtx, without the range\n"
        "        ret_val = func(*args, **kwargs)\n"
        "        return ret_val\n"
        "    return wrapped_fn\n"),
    "engine.py": (
        "import functools\n"
        "import torch.distributed as dist\n"
        "from tinyfw.nvtx import instrument\n"
        "_DP_GROUP = None\n"
        "def on_rank_zero(fn):\n"
        "    @functools.wraps(fn)\n"
        "    def wrapped_fn(*args, **kwargs):   # lightning_utilities' rank_zero_only\n"
        "        if dist.get_rank() == 0:\n"
        "            return fn(*args, **kwargs)\n"
        "    return wrapped_fn\n"
        "class Engine:\n"
        "    def __init__(self):\n"
        "        global _DP_GROUP\n"
        "        _DP_GROUP = dist.new_group([0, 1])   # no description: torch's placeholder\n"
        "    @instrument\n"
        "    def step(self, t):\n"
        "        dist.all_reduce(t, group=_DP_GROUP)   # fw: all_reduce\n"),
}


def _user_site(base) -> str:
    """The user site-packages folder Python derives from PYTHONUSERBASE=base."""
    scheme = "posix_user" if os.name == "posix" else "nt_user"
    return sysconfig.get_path("purelib", scheme, vars={"userbase": str(base)})


def test_decorators_never_stand_for_the_call_and_the_frameworks_group_is_named(gloo_job, tmp_path):
    base = tmp_path / "userbase"
    site = _user_site(base)
    os.makedirs(os.path.join(site, "tinyfw"))
    for name, text in TINYFW.items():
        with open(os.path.join(site, "tinyfw", name), "w") as f:
            f.write(text)
    path = os.pathsep.join([site] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    job = gloo_job(SCRIPT, 2, env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "60",
                                   "PYTHONUSERBASE": str(base), "PYTHONPATH": path})
    codes = job.wait(90)
    assert codes != [0, 0], job.stderr(0)[-3000:]
    (f,) = [x for x in findings(job.dir) if x["kind"] == "deadlock"]
    with open(os.path.join(job.dir, "report.txt")) as report:
        text = f["summary"] + "\n" + f["advice"] + "\n" + report.read()
    line = TINYFW["engine.py"].splitlines().index(next(x for x in TINYFW["engine.py"].splitlines() if "# fw:" in x)) + 1
    method = "Engine.step" if sys.version_info >= (3, 11) else "step"   # co_qualname: Python 3.11+
    step = f"tinyfw.{method}() (engine.py:{line})"   # the method, with its class, past the nvtx wrapper
    assert f"at {loc('deco_step_after', SCRIPT)} (main) calling {step}" in f["summary"], f["summary"]
    assert "wrapped_fn" not in text and "user_decorators.py" not in text and "nvtx.py" not in text, text
    # rank 0's own call is save(), made from main(): the decorators between are no caller
    # (the advice's words for the rank to look at first, here rank 1, that left its pattern)
    assert (call_site(f["ranks"]["0"]["frames"])
            == f"{loc('deco_barrier', SCRIPT)} (save), called from {loc('deco_save', SCRIPT)} (main)")
    assert f"{loc('deco_save', SCRIPT)} (main) → {loc('deco_barrier', SCRIPT)} (save) → barrier" in text, text
    # the framework's group: by the name the framework keeps it under, in the text and the JSON
    groups = {g["name"]: g for g in f["groups"].values()} if isinstance(f.get("groups"), dict) else {}
    assert "undefined" not in text and "(tinyfw.engine._DP_GROUP, ranks 0-1)" in text, text
    assert any(g.get("desc") == "tinyfw.engine._DP_GROUP" for g in groups.values()), f.get("groups")
    # the frames the finding points at are the ones the text names
    look = f["look_first"]
    frames = f["ranks"][str(look["rank"])]["frames"]
    user = frames[look["user_frame"]]
    assert user["origin"] == "user" and not user.get("wraps") and user["func"] in ("save", "main")
    if look["framework_frame"] is not None:
        assert frames[look["framework_frame"]]["qualname"] == method
