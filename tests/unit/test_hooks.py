"""The native route's pure parts: c10d hook op names (2.14 and 2.15 spellings) and attaching."""
from __future__ import annotations

import enum

import pytest

from colltrace.rank import hooks


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
