"""CPU-side cost of the CUDA path per traced collective, on a machine with or without a GPU:
colltrace's Python wrapper around a collective that does nothing (so only colltrace's work is
timed), given a tensor on the CPU and one on a CUDA device, with a stand-in for torch.cuda whose
events cost one Python call each (record, query). What the real events cost (cudaEventRecord and
a pool's reuse) is tests/gpu/check.py's step F to measure on a GPU.

    python benchmarks/cuda_path.py [--blocks 30] [--calls 2000]

Prints the median microseconds per call: the bare function, the wrapper on a CPU tensor, the
wrapper on a CUDA tensor (start and end events, the mark handed to the poller), the poller's work
per CUDA call (its two queries, the COMPLETE slot, the events back to the pool), and how many
events the pool made for all of it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


class Event:
    __slots__ = ()
    made = 0

    def __init__(self):
        Event.made += 1

    def record(self, stream):
        pass

    def query(self):
        return True


class Runtime:
    """cudamarks.TorchCuda's interface; every event reached at once."""
    routes: dict = {}

    def __init__(self):
        self.stream = types.SimpleNamespace(device=0)

    event = Event

    def current_stream(self, device):
        return self.stream

    def current_device(self):
        return 0

    def capturing(self, device):
        return False

    def set_device(self, device):
        pass

    def thread_local_queries(self):
        return False


class Tensor:
    def __init__(self, cuda):
        import torch

        self.shape, self.dtype, self.is_cuda = (1,), torch.float32, cuda
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")

    def get_device(self):
        return 0 if self.is_cuda else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    from colltrace import config
    from colltrace.rank import cudamarks, shim
    from colltrace.rank.recorder import Recorder

    class Group:
        seq = 0

    pg = Group()

    def all_reduce(tensor, op=None, group=None, async_op=False):
        pg.seq += 1

    with tempfile.TemporaryDirectory() as tmp:
        # the poller kept out of the timed blocks (it would take the GIL from them): each block's
        # marks are drained after it, timed apart
        settings = config.load({"COLLTRACE": "1", "COLLTRACE_DIR": tmp, "COLLTRACE_PURE": "1",
                                "COLLTRACE_POLL_S": "1000"})
        rec = Recorder(settings, 0, 1, "nccl", cuda=cudamarks.CudaMarks(Runtime(), cudamarks.CaptureGate()))
        shim.recorder, shim.first_sight = rec, lambda g: ("0", "default_pg", [0], "nccl", lambda: g.seq)
        shim._c10d = types.SimpleNamespace(_world=types.SimpleNamespace(default_pg=pg, pg_coalesce_state={}))
        shim._state.settings = None
        wrapped = shim._make_c10d_wrapper("all_reduce", all_reduce)
        cpu, gpu = Tensor(False), Tensor(True)
        routes = [("bare", lambda: all_reduce(cpu)), ("cpu tensor", lambda: wrapped(cpu)),
                  ("cuda tensor", lambda: wrapped(gpu))]
        res: dict = {name: [] for name, _ in routes}
        res["poller, per cuda call"] = []
        for b in range(a.blocks):
            for name, f in routes[b % 3:] + routes[:b % 3]:
                t = time.perf_counter()
                for _ in range(a.calls):
                    f()
                res[name].append((time.perf_counter() - t) / a.calls * 1e6)
                if name == "cuda tensor":   # what the poller then does for them (events back to the pool)
                    t = time.perf_counter()
                    rec._drain_all()
                    res["poller, per cuda call"].append((time.perf_counter() - t) / a.calls * 1e6)
        rec.close()
    out = {k: round(statistics.median(v), 2) for k, v in res.items()}
    out["cuda path adds"] = round(out["cuda tensor"] - out["cpu tensor"], 2)
    out["events made"] = Event.made
    out["events per call without a pool"] = 2
    print(json.dumps(out))


if __name__ == "__main__":
    main()
