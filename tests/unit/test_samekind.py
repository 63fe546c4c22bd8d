"""The same kind elsewhere, from source files on disk: which call sites a deadlock on the default
group (or on a named group) lists, in which order, and what it leaves out."""
from __future__ import annotations

import textwrap

from colltrace.callsites import samekind
from colltrace.model.finding import Finding


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


def finding(frames, desc="default_pg", name="0", kind="deadlock"):
    f = {"kind": kind, "group": {"name": name, "desc": desc, "ranks": [0, 1, 2]}, "missing_ranks": [2],
         "ranks": {"0": {"frames": frames}, "1": {"frames": frames}}}
    if kind == "deadlock":
        f["cycle"] = [{"waiting": [0, 1], "missing": [2]}]
    else:
        f["waiting"] = [0, 1]
    return Finding.from_json(f)


def where(sites):
    return [(s["file"].rsplit("/", 1)[-1], s["line"], s["func"], s["group"]) for s in sites]


def test_default_group_sites_next_first_then_same_file_then_imported_modules(tmp_path):
    train = write(tmp_path / "train.py", """\
        import torch.distributed as dist
        from helpers import log
        import helpers2

        def early():
            dist.barrier()

        def main(g):
            save()
            dist.all_reduce(t, group=g)
            dist.all_reduce(t)

        def save():
            dist.barrier()
            dist.broadcast(t, 0)
        """)
    write(tmp_path / "helpers.py", """\
        import torch.distributed as dist

        def log(x, group=None):
            dist.all_reduce(x, group=group)
        """)
    write(tmp_path / "helpers2.py", "import torch.distributed as dist\ndist.barrier(group=dist.group.WORLD)\n")
    frames = [{"file": "/usr/lib/python3.11/runpy.py", "line": 1, "func": "run"},
              {"file": train, "line": 9, "func": "main"}, {"file": train, "line": 14, "func": "save"},
              {"file": "/x/site-packages/torch/distributed/distributed_c10d.py", "line": 5, "func": "barrier"}]
    f = finding(frames)
    samekind.annotate([f])
    assert where(f.same_kind) == [
        ("train.py", 15, "save", "default"),        # next in the function that hangs
        ("train.py", 11, "main", "default"),        # next in its caller (the explicit-group call is skipped)
        ("train.py", 6, "early", "default"),        # elsewhere in the files on the stack
        ("helpers.py", 4, "log", "group"),          # imported: a parameter that defaults to None
        ("helpers2.py", 2, "<module>", "dist.group.WORLD"),
    ]
    assert f.same_kind[3]["may_be_default"] == "parameter group=None"


def test_a_named_group_lists_the_calls_on_that_group_only(tmp_path):
    src = write(tmp_path / "ckpt.py", """\
        import torch.distributed as dist

        class Manager:
            def save(self):
                dist.barrier(group=self.ipc.train_group)
                dist.all_reduce(t)
                dist.all_reduce(t, group=self.ipc.ipc_group)
                dist.barrier(group=ipc.train_group)
        """)
    f = finding([{"file": src, "line": 5, "func": "save"}], desc="train", name="1", kind="stall")
    samekind.annotate([f])
    assert where(f.same_kind) == [("ckpt.py", 8, "Manager.save", "ipc.train_group")]


def test_nothing_when_the_sources_are_not_here_or_nobody_is_missing(tmp_path):
    gone = finding([{"file": str(tmp_path / "gone.py"), "line": 3, "func": "f"}])
    mismatch = Finding.from_json(dict(finding([{"file": str(tmp_path / "gone.py"), "line": 3, "func": "f"}]).to_json(),
                                      kind="mismatch"))
    assert "same_kind" not in samekind.annotate([gone])[0].to_json()
    assert "same_kind" not in samekind.annotate([mismatch])[0].to_json()
