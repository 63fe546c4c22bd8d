"""The native route's pure parts: c10d hook op names (2.14 and 2.15 spellings) and attaching."""
from __future__ import annotations

import enum

import pytest

from colltrace.rank import hooks
from helpers.waiting import wait_until


class HookOpName(enum.Enum):   # the spellings torch 2.14 and 2.15 use
    ALLREDUCE = 0
    ALLGATHER = 1
    ALLGATHER_BASE = 2
    REDUCE_SCATTER = 3
    REDUCE_SCATTER_BASE = 4
    ALLTOALL = 5
    ALLTOALL_BASE = 6
    ALLREDUCE_COALESCED = 7
    SEND = 8
    UNKNOWN = 9
    ALLGATHER_INTO_TENSOR_COALESCED = 10


@pytest.mark.parametrize("name, n_in, n_out, expected", [
    (HookOpName.ALLREDUCE, 1, 0, "allreduce"),
    (HookOpName.ALLREDUCE, 2, 0, "allreduce_coalesced"),          # 2.14: a coalesced block
    (HookOpName.ALLREDUCE_COALESCED, 2, 0, "allreduce_coalesced"),  # 2.15 names it
    (HookOpName.ALLGATHER, 1, 4, "allgather"),                    # all_gather: a list out
    (HookOpName.ALLGATHER, 1, 1, "allgather_base"),               # 2.14: all_gather_into_tensor
    (HookOpName.ALLGATHER_BASE, 1, 1, "allgather_base"),          # 2.15
    (HookOpName.REDUCE_SCATTER, 1, 1, "reduce_scatter_base"),
    (HookOpName.REDUCE_SCATTER_BASE, 1, 1, "reduce_scatter_base"),
    (HookOpName.ALLTOALL, 1, 1, "alltoall_base"),
    (HookOpName.ALLTOALL_BASE, 1, 1, "alltoall_base"),
    (HookOpName.ALLGATHER_INTO_TENSOR_COALESCED, 1, 1, "allgather_base"),  # 2.15: a functional all_gather
    (HookOpName.ALLGATHER_INTO_TENSOR_COALESCED, 2, 2, "allgather_into_tensor_coalesced"),
    (HookOpName.ALLREDUCE_COALESCED, 1, 0, "allreduce"),
    (HookOpName.SEND, 1, 0, "send"),
    (HookOpName.UNKNOWN, 0, 0, "unknown"),
    ("HookOpName.ALL_REDUCE", 1, 0, "allreduce"),                 # a str(), any underscores
])
def test_hook_op_names_are_the_backend_ops_the_wrappers_record(name, n_in, n_out, expected):
    assert hooks.op_name(name, n_in, n_out) == expected


class FakeGroup:
    def __init__(self, fail=False):
        self.pre, self.post, self.fail = {}, {}, fail

    def register_pre_hook(self, hook_id, fn):
        if self.fail:
            raise RuntimeError("not on this backend")
        self.pre[hook_id] = fn

    def register_post_hook(self, hook_id, fn):
        self.post[hook_id] = fn

    def unregister_pre_hook(self, hook_id):
        del self.pre[hook_id]

    def unregister_post_hook(self, hook_id):
        del self.post[hook_id]


class FakeShim:
    recorder = None


def test_attach_registers_once_and_a_group_that_refuses_is_left_to_the_wrappers():
    pg = FakeGroup()
    assert hooks.attach(pg, FakeShim) and hooks.attach(pg, FakeShim)
    assert list(pg.pre) == list(pg.post) == [hooks.HOOK_ID]
    pg.pre[hooks.HOOK_ID](object())    # no recorder (a forked child, say): nothing, no error
    assert hooks.attach(FakeGroup(fail=True), FakeShim) is False       # never raises
    assert hooks.attach(object(), FakeShim) is False                   # torch 2.13: no hooks
    hooks.detach_all()
    assert pg.pre == pg.post == {}


# ---- the compiled hook case (fastpath.hook_gates) against the Python hooks ------------------------

class Op(enum.IntEnum):   # HookOpName's values as torch 2.14 numbers them
    SEND = 0
    RECV = 1
    BROADCAST = 2
    ALLREDUCE = 3
    ALLGATHER = 5
    BARRIER = 8


class PreArgs:
    def __init__(self, name, ins, op_id, async_op=False, root=-1, outs=()):
        self.name, self.input_tensors, self.output_tensors = name, list(ins), list(outs)
        self.async_op, self.root, self.op_id = async_op, root, op_id


class PostArgs:
    def __init__(self, name, op_id, work, async_op=False):
        self.name, self.op_id, self.work, self.async_op = name, op_id, work, async_op


class DoneWork:
    def __init__(self, done=True):
        self.done = done

    def is_completed(self):
        return self.done


class CountingGroup(FakeGroup):
    seq = 0


def _hook_route_records(tmp_path, pure: bool, monkeypatch):
    import types

    import torch

    from colltrace import config
    from colltrace.rank import fastpath
    from colltrace.rank.recorder import Recorder
    from colltrace.tracefile import reader

    env = {"COLLTRACE": "1", "COLLTRACE_DIR": str(tmp_path), "COLLTRACE_POLL_S": "0.02"}
    if pure:
        env["COLLTRACE_PURE"] = "1"
    settings = config.load(env)
    rec = Recorder(settings, rank=0, world_size=2, backend="gloo")
    pg = CountingGroup()

    def seq_fn(g):
        return g.seq

    def describe(g):
        def get_seq():
            return seq_fn(g)
        get_seq.seq_fn = seq_fn
        return "0", "default_pg", [0, 1], "gloo", get_seq

    shim = types.ModuleType("fake_shim")
    shim.recorder, shim.first_sight, shim.settings = rec, describe, lambda: settings
    kinds = {Op.ALLREDUCE: 1, Op.BARRIER: 1, Op.ALLGATHER: 2}   # what hooks._kinds makes of these names
    monkeypatch.setattr(hooks, "_kinds_table", [bytes(kinds.get(i, 0) for i in range(max(Op) + 1))])
    before = fastpath._fastpath.hook_hits() if fastpath.available() else 0
    assert hooks.attach(pg, shim)
    pre, post = pg.pre[hooks.HOOK_ID], pg.post[hooks.HOOK_ID]
    x, y = torch.ones(3), torch.ones(2, dtype=torch.float64)
    op_id = iter(range(100))

    def op(name, ins, work=None, run=True, post_id=None, **kw):
        i = next(op_id)
        pre(PreArgs(name, ins, i, **kw))
        if run:
            pg.seq += 1
            post(PostArgs(name, i if post_id is None else post_id, work))

    op(Op.ALLREDUCE, [x], DoneWork())
    op(Op.ALLREDUCE, [x], DoneWork())                 # the same again
    op(Op.ALLREDUCE, [y], DoneWork(), async_op=True)  # another signature, async
    op(Op.ALLREDUCE, [x], run=False)                  # raised in the backend: no post-hook
    op(Op.ALLREDUCE, [x], DoneWork())                 # ... found by the next pre-hook
    op(Op.ALLREDUCE, [x], DoneWork(), post_id=99)     # not this thread's op: no RETURN
    op(Op.BROADCAST, [x], DoneWork(), root=1)         # a root: the Python hook
    op(Op.BARRIER, [], DoneWork())
    op(Op.ALLGATHER, [x], DoneWork(), outs=[torch.empty(3), torch.empty(3)])
    pending = DoneWork(False)
    op(Op.ALLREDUCE, [x], pending)                    # not finished yet
    pg.seq += 2                                       # two ops no hook saw
    op(Op.ALLREDUCE, [x], None)                       # no Work: done at once
    pending.done = True
    assert wait_until(lambda: not rec._pending)
    hits = (fastpath._fastpath.hook_hits() if fastpath.available() else 0) - before
    hooks.detach_all()
    rec.close()
    (tr,) = reader.load_traces(str(tmp_path))
    keep = ("group", "seq", "seq_end", "op", "backend_op", "state", "async", "shapes", "dtypes", "root", "count")
    return [{k: r.get(k) for k in keep} | {"frames": [(f["func"], f["line"]) for f in r.get("frames") or []][-2:]}
            for r in tr.all_records()], hits


def test_the_compiled_hook_case_records_what_the_python_hooks_record(tmp_path, monkeypatch):
    from colltrace.rank import fastpath

    if not fastpath.available():
        pytest.skip("the compiled hot path was not built here")
    fast, hits = _hook_route_records(tmp_path / "fast", False, monkeypatch)
    pure, pure_hits = _hook_route_records(tmp_path / "pure", True, monkeypatch)
    assert pure_hits == 0 and hits == 9, hits   # all but the broadcast and the op found left open
    assert fast == pure
    assert [r["state"] for r in fast].count("failed") == 1   # the op whose post-hook never came
    assert any(r["op"] == "untraced" and r["count"] == 2 for r in fast)
