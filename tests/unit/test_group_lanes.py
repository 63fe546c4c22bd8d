"""A group of several backends ("cpu:gloo,cuda:nccl", what init_process_group() makes on a GPU
machine): an op goes to the backend of its tensors' device, and each backend counts only its own
ops. Stand-ins here (two ranks in one process, two counters per group, a fake CUDA); a real gloo
group of two backends is tests/integration/test_groups.py's."""
from __future__ import annotations

import dataclasses
import time
import types

import torch

from colltrace import config, verdict
from colltrace.rank import calls, cudamarks, shim
from colltrace.rank.recorder import Recorder
from colltrace.tracefile import reader
from helpers.fakecuda import FakeCuda, FakeTensor
from helpers.waiting import wait_until


class Backend:
    def __init__(self):
        self.seq = 0

    def _get_sequence_number_for_group(self):
        return self.seq


class MixedGroup:
    """c10d's ProcessGroup as colltrace reads one of two backends."""

    def __init__(self):
        self.by_type = {"cpu": Backend(), "cuda": Backend()}
        self.bound_device_id = None

    @property
    def _device_types(self):
        return [torch.device("cuda"), torch.device("cpu")]

    def _get_backend(self, device):
        return self.by_type[device.type]


def describe(pg):
    # c10d's own counter for such a group is its default backend's (NCCL's): CPU ops never move it
    default = pg.by_type["cuda"]._get_sequence_number_for_group
    return "0", "default_pg", [0, 1], "cpu:gloo,cuda:nccl", default, calls.backend_lanes(pg, "cpu:gloo,cuda:nccl")


def all_reduce(tensor, op=None, group=None, async_op=False):
    group.by_type[tensor.device.type].seq += 1


def barrier(group=None, async_op=False, device_ids=None, timeout=None):
    group.by_type["cpu"].seq += 1   # c10d's barrier on such a group: the CPU backend (no device bound)


def test_each_backend_numbers_its_own_ops_and_two_ranks_ordering_them_differently_match(tmp_path, monkeypatch):
    c10d = types.SimpleNamespace(_world=types.SimpleNamespace(default_pg=None, pg_coalesce_state={}),
                                 _get_object_coll_device=lambda group: "cpu")
    monkeypatch.setattr(shim, "_c10d", c10d)
    monkeypatch.setattr(shim, "first_sight", describe)
    monkeypatch.setattr(shim, "_state", dataclasses.replace(shim._state, settings=None))
    ar, bar = shim._make_c10d_wrapper("all_reduce", all_reduce), shim._make_c10d_wrapper("barrier", barrier)
    settings = config.load({"COLLTRACE": "1", "COLLTRACE_DIR": str(tmp_path), "COLLTRACE_POLL_S": "0.02"})
    cpu, gpu = FakeTensor(None), FakeTensor(0)
    ranks = []
    # the same collectives, in another order across the two backends: no deadlock, no mismatch (each
    # backend runs its own ops in the order it gets them)
    for rank, order in ((0, (cpu, gpu, cpu)), (1, (gpu, cpu, cpu))):
        fake = FakeCuda()
        rec = Recorder(settings, rank=rank, world_size=2, backend="cpu:gloo,cuda:nccl",
                       cuda=cudamarks.CudaMarks(fake, cudamarks.CaptureGate()))
        monkeypatch.setattr(shim, "recorder", rec)
        pg = MixedGroup()
        for t in order:
            ar(t, group=pg)
        bar(group=pg)
        fake.current_stream(0).run()
        ranks.append((rec, pg))
    assert all(wait_until(lambda rec=rec: not rec._marks) for rec, _ in ranks)
    snap = reader.load_snapshot(str(tmp_path))
    assert verdict.findings_of(snap, 30.0, time.time() + 60) == []
    for (rec, pg), tr in zip(ranks, reader.load_traces(str(tmp_path)), strict=False):
        got = [(r["group"], r["seq"], r["op"]) for r in tr.all_records()]
        want = {0: [("0:cpu", 1, "all_reduce"), ("0", 1, "all_reduce"), ("0:cpu", 2, "all_reduce"),
                    ("0:cpu", 3, "barrier")],
                1: [("0", 1, "all_reduce"), ("0:cpu", 1, "all_reduce"), ("0:cpu", 2, "all_reduce"),
                    ("0:cpu", 3, "barrier")]}
        assert got == want[tr.rank]   # no "untraced" gaps, no number twice
        assert {g["name"]: g["backend"] for g in tr.groups.values()} == {"0": "nccl", "0:cpu": "gloo"}
        assert rec.fr_names() == {("0", "nccl"): "0", ("0", "gloo"): "0:cpu"}
        assert pg.by_type["cpu"].seq == 3 and pg.by_type["cuda"].seq == 1
        rec.close()


def test_a_group_of_one_backend_has_no_lanes():
    one = MixedGroup()
    one.by_type["cuda"] = one.by_type["cpu"]   # "cpu:gloo,cuda:gloo": one gloo for both
    assert calls.backend_lanes(one, "cpu:gloo,cuda:gloo") is None
    lanes = calls.backend_lanes(MixedGroup(), "cpu:gloo,cuda:nccl")
    assert {t: name for t, (name, _) in lanes.items()} == {"cuda": "nccl", "cpu": "gloo"}
