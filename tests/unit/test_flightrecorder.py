"""The Flight Recorder on demand: a rank answers a request file; the reader keeps what the trace
did not see."""
from __future__ import annotations

import json
import os

from colltrace.rank import flightrecorder
from colltrace.tracefile import asks


def test_a_rank_answers_each_request_once(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(flightrecorder, "_dump", lambda: calls.append(1) or [
        {"process_group": ["1", "train"], "collective_seq_id": 8, "is_p2p": False,
         "profiling_name": "gloo:_allgather_base", "input_sizes": [[20]], "input_dtypes": ["BFloat16"],
         "state": "scheduled", "time_created_ns": 5_000_000_000}])
    r = flightrecorder.Responder(str(tmp_path), 3)
    r.poll()
    assert calls == [] and not os.path.exists(asks.fr_dump_path(str(tmp_path), 3))
    asks.request_fr(str(tmp_path), 3)
    r.poll()
    r.poll()
    assert calls == [1]
    with open(asks.fr_dump_path(str(tmp_path), 3)) as f:
        data = json.loads(f.read())
    assert data["error"] is None and data["entries"] == [
        {"group": "1", "seq": 8, "p2p": False, "op": "allgather_base", "backend_op": "allgatherbase",
         "shapes": [[20]], "dtypes": ["bfloat16"], "state": "scheduled", "t": 5.0}]


def test_a_torch_without_it_is_one_error_in_the_answer(tmp_path, monkeypatch):
    def boom():
        raise RuntimeError("this torch has no Flight Recorder dump")

    monkeypatch.setattr(flightrecorder, "_dump", boom)
    asks.request_fr(str(tmp_path), 0)
    flightrecorder.Responder(str(tmp_path), 0).poll()
    with open(asks.fr_dump_path(str(tmp_path), 0)) as f:
        data = json.loads(f.read())
    assert data["entries"] == [] and "no Flight Recorder" in data["error"]


def test_only_what_the_trace_did_not_see_is_kept():
    data = {"t": 10.0, "entries": [
        {"group": "0", "seq": 5, "op": "all_reduce", "t": 1.0},     # traced already
        {"group": "0", "seq": 6, "op": "all_reduce", "t": 2.0},     # DDP's, unseen
        {"group": "1", "seq": 1, "op": "broadcast", "t": 0.5},      # a group the trace never saw
        {"group": "0", "seq": 2, "p2p": True, "op": "send", "t": 3.0},
        {"group": "0", "op": "broken"}]}
    got = asks.untraced_since(data, {"0": {"entered": 5, "completed": 5}})
    assert [(u["group"], u["seq"]) for u in got] == [("1", 1), ("0", 6)]
    assert asks.untraced_since(None, {}) == []


def _entry(group, seq, op, t):
    return {"process_group": [group, ""], "collective_seq_id": seq, "is_p2p": False, "profiling_name": f"x:{op}",
            "input_sizes": [[4]], "input_dtypes": ["Float"], "state": "scheduled", "time_created_ns": t * 10**9}


class C10d:
    """torch._C._distributed_c10d's dumps: NCCL's recorder, gloo's, and a hooked backend's by name."""

    def __init__(self, named=True, nccl_fails=False):
        self.named, self.nccl_fails = named, nccl_fails

    def _dump_nccl_trace_json(self, includeCollectives=True, onlyActive=False):
        if self.nccl_fails:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return json.dumps({"entries": [_entry("0", 7, "allreduce", 3)]}).encode()

    def _dump_fr_trace_json(self, includeCollectives=True, onlyActive=False, **backend):
        if backend and not self.named:
            raise TypeError("_dump_fr_trace_json(): incompatible function arguments")   # pybind's, for an older torch
        if backend == {"backend": "nccl2"}:
            return json.dumps({"entries": [_entry("5", 2, "broadcast", 4)]}).encode()
        return json.dumps({"entries": [_entry("0", 9, "allgather", 1)]}).encode()


def test_every_backends_recorder_is_read_and_a_mixed_groups_lanes_named_apart(tmp_path, monkeypatch):
    # NCCL records into FlightRecorder<CUDAEvent> (_dump_nccl_trace_json), gloo into the default
    # one, nccl2 into its own by name: read alone, gloo's says nothing of an NCCL job
    got = flightrecorder._newest(flightrecorder._dump(C10d()), {("0", "gloo"): "0:cpu"})
    assert sorted((e["group"], e["seq"], e["op"]) for e in got) == [("0", 7, "allreduce"), ("0:cpu", 9, "allgather"),
                                                                    ("5", 2, "broadcast")]
    # a torch without named recorders, and one recorder failing, leave the others read
    got = flightrecorder._dump(C10d(named=False, nccl_fails=True))
    assert [(e["_source"], e["collective_seq_id"]) for e in got] == [("gloo", 9)]

    real = flightrecorder._dump
    monkeypatch.setattr(flightrecorder, "_dump", lambda: real(C10d()))
    asks.request_fr(str(tmp_path), 1)
    flightrecorder.Responder(str(tmp_path), 1, lambda: {("0", "gloo"): "0:cpu"}).poll()
    with open(asks.fr_dump_path(str(tmp_path), 1)) as f:
        data = json.loads(f.read())
    assert data["error"] is None and {e["group"] for e in data["entries"]} == {"0", "0:cpu", "5"}
