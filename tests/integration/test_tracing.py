"""The tracing core on real gloo ranks: every way of issuing a collective lands in the trace,
numbered as the backend numbers it, with the user's own file:line."""
from __future__ import annotations

import json
import os

import pytest
import torch.distributed as dist

from colltrace.rank import hooks
from colltrace.tracefile import reader
from helpers.jobs import markers, user_line

NATIVE = hooks.supported(dist.ProcessGroup)   # torch >= 2.14: c10d's collective hooks


def counts(job, rank):
    line = [out for out in job.stdout(rank).splitlines() if out.startswith("COUNTS ")][-1]
    return json.loads(line[len("COUNTS "):])

@pytest.fixture(scope="module")
def all_ops(module_gloo_job):
    """all_ops.py run once, traced, on 3 gloo ranks, for every test of this module."""
    job = module_gloo_job("all_ops.py", 3, env={"COLLTRACE_WATCHDOG": "off"})
    assert job.wait(120) == [0, 0, 0], job.stderr(0)
    return job

def test_every_op_kind_lands_with_the_users_line(all_ops):
    job = all_ops
    lines = markers("all_ops.py")
    traces = {tr.rank: tr for tr in reader.load_traces(job.dir)}
    assert sorted(traces) == [0, 1, 2]
    recs = traces[0].all_records()
    by_line = {}
    for r in recs:
        ln = user_line(r, "all_ops.py")
        if ln is not None:
            by_line.setdefault(ln, []).append(r)
    expected_ops = {
        "all_reduce": "all_reduce", "broadcast": "broadcast", "reduce": "reduce", "all_gather": "all_gather",
        "all_gather_into_tensor": "all_gather_into_tensor", "gather": "gather", "scatter": "scatter",
        "reduce_scatter_tensor": "reduce_scatter_tensor", "all_to_all_single": "all_to_all_single",
        "barrier": "barrier", "all_gather_object": "all_gather_object",
        "broadcast_object_list": "broadcast_object_list", "all_reduce_async": "all_reduce",
        "_coalescing_manager": "_coalescing_manager", "funcol.all_reduce": "funcol.all_reduce",
        "batch_isend_irecv": "batch_isend_irecv", "send": "send", "all_reduce_sub": "all_reduce",
        "all_reduce_last": "all_reduce",
    }
    for marker, op in expected_ops.items():
        got = by_line.get(lines[marker], [])
        assert [r["op"] for r in got] == [op], f"{marker} at all_ops.py:{lines[marker]}: {[r['op'] for r in got]}"
        assert got[0]["state"] == "completed", got[0]
        assert got[0]["entered_at"] <= (got[0]["completed_at"] or 0)
    # fields of one record, as the contract lists them
    ar = by_line[lines["all_reduce"]][0]
    assert ar["shapes"] == [[2, 4]] and ar["dtypes"] == ["float32"] and ar["reduce_op"] == "SUM"
    assert ar["group"] == counts(job, 0)["world_name"] and ar["seq"] == 1 and not ar["async"]
    assert ar["thread"] == "MainThread"
    assert by_line[lines["broadcast"]][0]["root"] == 0
    assert by_line[lines["all_reduce_async"]][0]["async"] is True
    # gloo runs reduce_scatter as an all_reduce: recorded, so ranks compare like with like
    assert by_line[lines["reduce_scatter_tensor"]][0]["backend_op"] == "allreduce"
    # the recv side of the point-to-point pair, on rank 1
    recv = [r for r in traces[1].all_records() if user_line(r, "all_ops.py") == lines["recv"]]
    assert [(r["op"], r["peer"], r["p2p"]) for r in recv] == [("recv", 0, True)]
    send = by_line[lines["send"]][0]
    assert (send["peer"], send["seq"]) == (1, recv[0]["seq"])

def test_numbers_agree_across_ranks_and_with_the_backend(all_ops):
    job = all_ops
    traces = reader.load_traces(job.dir)
    seqs = []
    for tr in traces:
        c = counts(job, tr.rank)
        recs = [r for r in tr.all_records() if not r["p2p"]]
        world = [r for r in recs if r["group"] == c["world_name"]]
        # no holes: the records' numbers cover 1..N for each group, untraced gaps included
        covered = []
        for r in world:
            covered.extend(range(r["seq"], r["seq_end"] + 1))
        assert covered == list(range(1, len(covered) + 1))
        p2p_steps = sum(1 for r in tr.all_records() if r["p2p"] for _ in range(1))
        assert covered[-1] <= c["counts"][c["world_name"]]
        sub = [r for r in recs if r["group"] == c["sub_name"]]
        assert [r["seq"] for r in sub] == [1] == [c["counts"][c["sub_name"]]]
        seqs.append([(r["group"], r["seq"], r["seq_end"], r["op"]) for r in recs])
        assert p2p_steps >= 2
    assert seqs[0] == seqs[1] == seqs[2], "the same collective has the same number on every rank"

def test_ddp_reducer_allreduces_are_records_or_counted_gaps(all_ops):
    job = all_ops
    lines = markers("all_ops.py")
    recs = reader.load_traces(job.dir)[0].all_records()
    if NATIVE:
        # torch >= 2.14: c10d's hooks see DDP's C++ collectives; nothing is merely counted
        assert not [r for r in recs if r["op"] == "untraced"]
        built = [r["op"] for r in recs if user_line(r, "all_ops.py") == lines["ddp"]]
        assert built == ["allgather", "broadcast", "broadcast"]   # shape check, then module states
        i = next(i for i, r in enumerate(recs) if user_line(r, "all_ops.py") == lines["ddp_backward"])
        grad = recs[i]
        assert grad["op"] == "allreduce" and grad["state"] == "completed" and grad["shapes"] == [[20]]
        assert "backward" in [f["func"] for f in grad["frames"]]
        after = recs[i + 1]
        assert user_line(after, "all_ops.py") == lines["all_reduce_last"] and after["seq"] == grad["seq_end"] + 1
        return
    i = next(i for i, r in enumerate(recs) if r["op"] == "untraced")
    gap = recs[i]
    assert gap["count"] >= 2 and gap["seq_end"] - gap["seq"] + 1 == gap["count"]
    # the gap sits between the sub-group all_reduce and the last all_reduce, which follows it directly
    after = recs[i + 1]
    assert user_line(after, "all_ops.py") == lines["all_reduce_last"] and after["seq"] == gap["seq_end"] + 1

def test_object_collective_is_one_logical_op(all_ops):
    job = all_ops
    recs = reader.load_traces(job.dir)[1].all_records()
    ago = [r for r in recs if r["op"] == "all_gather_object"]
    assert len(ago) == 1 and ago[0]["seq_end"] == ago[0]["seq"] + 1   # two backend all_gathers, one record
    assert not [r for r in recs if r["op"] == "all_gather" and r["seq"] in (ago[0]["seq"], ago[0]["seq_end"])]

def test_traced_results_equal_untraced(all_ops, gloo_job):
    traced = all_ops
    plain = gloo_job("all_ops.py", 3, traced=False)
    assert plain.wait(120) == [0, 0, 0]
    for r in range(3):
        a, b = counts(traced, r), counts(plain, r)
        assert a["result"] == b["result"] and a["counts"] == b["counts"]
    assert not os.path.exists(plain.dir)
