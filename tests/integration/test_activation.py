"""Turning colltrace on and off: the start-up hook, install()/uninstall(), bad settings."""
from __future__ import annotations

import subprocess
import sys

import pytest

from colltrace.tracefile import reader
from helpers import environ

PROBE = "import sys; print('torch' in sys.modules, 'colltrace' in sys.modules)"


def run_py(code, env_extra, timeout=120):
    env = environ.clean()
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("value", [None, "", "0"])
def test_off_imports_nothing(value):
    env = {} if value is None else {"COLLTRACE": value}
    out = run_py(PROBE, env)
    assert out.stdout.split() == ["False", "False"] and out.stderr == ""


def test_on_does_not_import_torch_by_itself():
    out = run_py(PROBE, {"COLLTRACE": "1"})
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_on_patches_torch_distributed_when_imported():
    code = ("import torch.distributed as dist; from torch.distributed import all_reduce;"
            "print(hasattr(dist.all_reduce, '__colltrace_original__'), all_reduce is dist.all_reduce)")
    assert run_py(code, {"COLLTRACE": "1"}).stdout.split() == ["True", "True"]
    assert run_py(code, {}).stdout.split() == ["False", "True"]


def test_a_traced_process_that_is_no_rank_shows_torch_its_own_store_errors():
    """torchrun's agent is traced (COLLTRACE=1 reaches it) but is no rank: a store wait that fails
    there (its exit barrier racing the store's shutdown, pytorch#69520) is torch's traceback with no
    colltrace frame in it. Once this process makes a recorder, its store waits are watched."""
    code = """
import datetime, sys, traceback
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=1))
try:
    store.wait(["never-set"])
except Exception:
    traceback.print_exc()
print("watched before a recorder:", hasattr(dist.Store.wait, "__colltrace_original__"))
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
print("watched as a rank:", hasattr(dist.Store.wait, "__colltrace_original__"))
"""
    out = run_py(code, {"COLLTRACE": "1", "COLLTRACE_WATCHDOG": "off"})
    assert "watched before a recorder: False" in out.stdout and "watched as a rank: True" in out.stdout, out.stderr
    assert "DistStoreError: wait timeout" in out.stderr and "colltrace" not in out.stderr.lower(), out.stderr


def test_install_is_idempotent_and_uninstall_restores():
    code = """
import torch.distributed as dist
keep = {"orig": dist.barrier}   # held in a dict: install rebinds module globals, not containers
import colltrace
assert colltrace.install() and colltrace.install()
wrapped = dist.barrier
assert wrapped is not keep["orig"] and wrapped.__colltrace_original__ is keep["orig"]
assert not hasattr(wrapped.__colltrace_original__, "__colltrace_original__")  # patched once
colltrace.uninstall(); colltrace.uninstall()
assert dist.barrier is keep["orig"]
print("ok")
"""
    out = run_py(code, {})
    assert out.stdout.strip() == "ok", out.stderr


def test_module_level_by_name_import_is_rebound():
    code = """
import torch.distributed
from torch.distributed import all_reduce
import colltrace; colltrace.install()
print(hasattr(all_reduce, '__colltrace_original__'))
"""
    assert run_py(code, {}).stdout.strip() == "True"


@pytest.mark.parametrize("var,value", [("COLLTRACE_STALL_S", "soon"), ("COLLTRACE_ON_HANG", "explode"),
                                       ("COLLTRACE_RING_SLOTS", "-5")])
def test_bad_setting_gives_one_warning_and_the_job_runs(gloo_job, var, value):
    job = gloo_job("healthy.py", 1, env={var: value, "COLLTRACE_WATCHDOG": "off"})
    assert job.wait(60) == [0]
    err = job.stderr(0)
    warnings = [line for line in err.splitlines() if line.startswith("colltrace: warning:")]
    assert len(warnings) == 1 and var in warnings[0] and "using" in warnings[0], err
    assert reader.load_traces(job.dir)[0].all_records()  # traced with the default instead


def test_a_failure_inside_colltrace_is_reported_once_and_changes_nothing(gloo_job):
    job = gloo_job("internal_failure.py", 2, env={"COLLTRACE_WATCHDOG": "off"})
    assert job.wait(60) == [0, 0]
    for r in range(2):
        assert "RESULT [24.0, 24.0, 24.0]" in job.stdout(r)   # (1 + 2) * 2**3, as untraced
        assert job.stderr(r).count("colltrace: internal error") == 1
    notes = reader.load_traces(job.dir)[0].notes
    assert any("simulated colltrace bug" in n for n in notes)


DESTROY = """
import gc, os, socket, weakref
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
import torch, torch.distributed as dist
dist.init_process_group("gloo")
g = dist.new_group([0])
dist.all_reduce(torch.ones(1), group=g)
dist.all_reduce(torch.ones(1))
refs = [weakref.ref(g), weakref.ref(dist.group.WORLD)]
del g
dist.destroy_process_group()
gc.collect()
print([r() is None for r in refs])
"""


def test_destroyed_groups_are_freed_as_without_colltrace(tmp_path):
    # Held past destroy_process_group, a gloo group is freed at interpreter exit instead, where
    # its destructor can abort the process: the traced program must let go of it when torch does.
    untraced = run_py(DESTROY, {})
    traced = run_py(DESTROY, {"COLLTRACE": "1", "COLLTRACE_DIR": str(tmp_path), "COLLTRACE_WATCHDOG": "off"})
    assert untraced.stdout.split() == ["[True,", "True]"], untraced.stderr
    assert traced.stdout == untraced.stdout, traced.stderr
    assert "all_reduce" in {r["op"] for tr in reader.load_traces(str(tmp_path)) for r in tr.all_records()}
