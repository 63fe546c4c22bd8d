"""`colltrace lint`: each rule on the pattern it names and not on its correct twin, suppression,
exit codes, --json; the example is clean, and each of its group switches turned on in the
source (its `bugs.on("NAME")` made `True`) is flagged at the switch's line."""
from __future__ import annotations

import json
import os
import re
import shutil
import textwrap

import pytest

from helpers.cli import run_cli
from helpers.paths import EXAMPLE

HEAD = "import torch.distributed as dist\nrank = dist.get_rank()\n"


def lint(*args):
    return run_cli("lint", *args)


def found(tmp_path, body: str, name="job.py") -> list[tuple[int, str]]:
    path = tmp_path / name
    path.write_text(HEAD + textwrap.dedent(body))
    out = lint("--json", path)
    assert out.returncode in (0, 1), out.stderr
    doc = json.loads(out.stdout)
    assert out.returncode == (1 if doc["findings"] else 0)
    return [(f["line"], f["rule"]) for f in doc["findings"]]


@pytest.mark.parametrize("body,expected", [
    # collectives under rank branches
    ("if rank == 0:\n    dist.barrier()\n", [(4, "rank-branch")]),
    ("if dist.get_rank() != 0:\n    pass\nelse:\n    dist.all_reduce(t)\n", [(6, "rank-branch")]),
    ("if trainer.is_global_zero:\n    accelerator.wait_for_everyone()\n", [(4, "rank-branch")]),
    ("if rank == 0:\n    dist.broadcast(t, 0)\nelse:\n    dist.broadcast(t, 0)\n", []),
    ("if rank in ranks:\n    dist.all_reduce(t, group=g)\n", []),
    ("if world_size > 1:\n    dist.all_reduce(t)\n", []),
    ("if rank == 0:\n    barrier()\n    obj.barrier()\n", []),   # not torch.distributed's
    # object collectives
    ("if is_main_process:\n    dist.broadcast_object_list(objs, src=0)\n", [(4, "object-rank-branch")]),
    # early exits on some ranks
    ("def f():\n    if global_rank != 0:\n        return\n    dist.barrier()\n", [(5, "rank-exit")]),
    ("for x in xs:\n    if rank == 1 and x:\n        break\n    dist.all_reduce(t)\n", [(5, "rank-exit")]),
    ("def f():\n    if rank != 0:\n        dist.barrier()\n        return\n    dist.barrier()\n", []),
    ("def f():\n    if rank != 0:\n        return\n    print('done')\n", []),
    # the default group next to subgroups
    ("g = dist.new_group([0, 1])\ndist.all_reduce(t)\ndist.all_reduce(t, group=g)\n", [(4, "default-group")]),
    ("g = dist.new_group([0, 1])\ngroup = None\ndist.barrier(group=group)\n", [(5, "default-group")]),
    ("dist.all_reduce(t)\ndist.barrier()\n", []),
    ("g = dist.new_group([0, 1])\ndist.barrier(group=dist.group.WORLD)\n", []),
    ("mesh = init_device_mesh('cuda', (2, 2))\ndist.barrier()\n", []),
    # except blocks
    ("try:\n    save()\nexcept OSError:\n    dist.barrier()\n    raise\n", [(6, "collective-in-except")]),
    ("try:\n    dist.barrier()\nexcept RuntimeError:\n    dist.all_reduce(t)\n", []),
    # group creation under rank branches: every rank of the job must make every group
    ("if rank < 2:\n    g = dist.new_group([0, 1])\n", [(4, "group-rank-branch")]),   # the issue's own
    ("for ranks in ([0, 1], [2, 3]):\n    if rank in ranks:\n        g = dist.new_group(ranks)\n",
     [(5, "group-rank-branch")]),
    ("for ranks in ([0, 1], [2, 3]):\n    g = dist.new_group(ranks)\n    if rank in ranks:\n        mine = g\n", []),
    ("if rank in (0, 1):\n    g = dist.new_group([0, 1], use_local_synchronization=True)\n", []),
    ("if rank == 0:\n    g = dist.new_group([0, 1], timeout=t)\nelse:\n    g = dist.new_group([0, 1])\n", []),
    ("if rank < 2:\n    g = dist.new_group([0, 1])\nelse:\n    g = dist.new_group([2, 3])\n",
     [(4, "group-rank-branch"), (6, "group-rank-branch")]),
    ("from torch.distributed.device_mesh import init_device_mesh\nif dist.get_rank() == 0:\n"
     "    mesh = init_device_mesh('cpu', (1,))\n", [(5, "group-rank-branch")]),
    ("from torch.distributed import new_subgroups, split_group\nif is_main_process:\n    new_subgroups(2)\n"
     "    split_group(split_ranks=[[0, 1]])\n", [(5, "group-rank-branch"), (6, "group-rank-branch")]),
    ("if rank == 0:\n    g = other.new_group([0, 1])\n", []),   # not torch.distributed's
    # suppression
    ("if rank == 0:\n    dist.barrier()  # colltrace: ignore[rank-branch]\n", []),
    ("if rank == 0:\n    dist.barrier()  # colltrace: ignore\n", []),
    ("if rank == 0:\n    dist.barrier()  # colltrace: ignore[default-group]\n", [(4, "rank-branch")]),
])
def test_rule(tmp_path, body, expected):
    assert found(tmp_path, body) == expected


def test_text_output_names_file_line_rule_why_and_how_to_silence(tmp_path):
    (tmp_path / "a.py").write_text(HEAD + "if rank == 0:\n    dist.barrier()\n")
    out = lint(tmp_path)
    assert out.returncode == 1
    first = out.stdout.splitlines()[0]
    assert first.startswith(f"{tmp_path / 'a.py'}:4: rank-branch: barrier runs only where `rank == 0` holds")
    assert "# colltrace: ignore[rank-branch]" in first
    assert out.stdout.splitlines()[-1] == "colltrace lint: 1 finding in 1 file"


@pytest.mark.parametrize("make,why", [
    (lambda p: p / "missing.py", "no such file or folder"),
    (lambda p: (p / "bad.py").write_text("def f(:\n") and p / "bad.py", "cannot parse"),
    (lambda p: None, "unknown rule"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, make, why):
    path = make(tmp_path)
    out = lint(path) if path is not None else lint("--select", "nonsense", tmp_path)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("colltrace: error:") and why in lines[0], out.stderr


def mark(name: str) -> tuple[str, int]:
    for fname in sorted(os.listdir(EXAMPLE)):
        if fname.endswith(".py"):
            with open(os.path.join(EXAMPLE, fname)) as f:
                for i, line in enumerate(f, 1):
                    if re.search(rf"# bug: {re.escape(name)}\b", line):
                        return fname, i
    raise LookupError(name)


def test_the_example_as_shipped_is_clean():
    out = lint(os.path.join(EXAMPLE, ".."))
    assert out.returncode == 0, out.stdout
    assert out.stdout.strip() == "colltrace lint: no findings in 6 files"


@pytest.mark.parametrize("bug", ["checkpoint_barrier", "probe_barrier", "metrics_default_group"])
def test_the_examples_group_switch_turned_on_in_the_source_is_flagged(tmp_path, bug):
    copy = tmp_path / "distill"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for p in copy.glob("*.py"):
        p.write_text(p.read_text().replace(f'bugs.on("{bug}")', "True"))
    out = lint("--json", copy)
    assert out.returncode == 1, out.stderr
    got = [(os.path.basename(f["file"]), f["line"], f["rule"]) for f in json.loads(out.stdout)["findings"]]
    assert got == [(*mark(bug), "default-group")]


def test_default_group_in_a_module_that_imports_the_subgroup_maker(tmp_path):
    for d in ("pkg", "app", "other"):
        (tmp_path / d).mkdir()
    (tmp_path / "pkg" / "groups.py").write_text("import torch.distributed as dist\n\n"
                                                "def training_group(ranks):\n    return dist.new_group(ranks)\n")
    (tmp_path / "app" / "ckpt.py").write_text("import torch.distributed as dist\nfrom pkg import groups\n\n"
                                              "dist.barrier()\n")
    (tmp_path / "other" / "world.py").write_text("import torch.distributed as dist\n\n"
                                                 "pg = dist.new_group(backend='gloo')\ndist.barrier()\n")   # no subset
    out = lint("--json", tmp_path / "app", tmp_path / "other")
    found = json.loads(out.stdout)["findings"]
    assert [(os.path.basename(f["file"]), f["line"], f["rule"]) for f in found] == [("ckpt.py", 4, "default-group")]
    assert "groups.py, imported here, makes subgroups" in found[0]["why"]


def test_a_file_that_does_not_parse_is_named_and_the_others_still_checked(tmp_path):
    (tmp_path / "bad.py").write_text("def f(:\n")
    (tmp_path / "good.py").write_text(HEAD + "if rank == 0:\n    dist.barrier()\n")
    out = lint(tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == f"colltrace: error: {tmp_path / 'bad.py'}:1: cannot parse: invalid syntax"
    assert "good.py:4: rank-branch" in out.stdout
    assert out.stdout.splitlines()[-1] == "colltrace lint: 1 finding in 1 file (1 could not be checked)"
