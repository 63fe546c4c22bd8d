"""torch.cuda as colltrace's CUDA marks use it (cudamarks.TorchCuda's interface), on a machine with
no GPU, and what the tests need of CUDA's rules to catch a break of them:

- streams run their work in order, as far as the test lets the GPU go (`stream.run(n)`); an
  event is reached once its stream passed it; a stream made to wait for a Work's future passes
  that point once the Work's GPU side is done (`work.finish()`);
- a query made from a thread with no device set makes a context on GPU 0 (`contexts`);
- any CUDA call from another thread while a global-mode capture is under way invalidates it
  (`invalidated`); the capturing thread's own stream reports it is capturing;
- NCCL's Work: `is_completed()` counted (it takes the communicator's lock), its future complete
  at enqueue; gloo's: its future completes with the work (`nccl=False`).
"""
from __future__ import annotations

import contextlib
import threading
import types

import torch

MAIN = threading.main_thread().ident


class FakeStream:
    def __init__(self, cuda, device, name):
        self.cuda, self.device, self.name = cuda, device, name
        self.items = []              # FakeEvent or ("wait", work), in order
        self.limit = None if name == "own" else 0   # how far the GPU went (None: as far as it can)

    def run(self, n: int | None = None) -> None:
        """Let the GPU pass n more items of this stream (all, if n is None)."""
        self.limit = None if n is None else (self.limit or 0) + n

    def passed(self, i: int) -> bool:
        if self.limit is not None and i >= self.limit:
            return False
        return all(not isinstance(x, tuple) or x[1].gpu_done for x in self.items[:i + 1])

    def __repr__(self):
        return f"FakeStream(cuda:{self.device} {self.name})"


class FakeEvent:
    def __init__(self, cuda):
        self.cuda = cuda
        self.device = None
        self.stream = self.pos = None
        self.records = 0

    def record(self, stream=None):
        stream = stream or self.cuda.current_stream(self.cuda.thread_device())
        if self.device is not None and stream.device != self.device:
            raise RuntimeError("Event device does not match recording stream's device")   # as torch's
        self.cuda.call("record", stream.device)
        self.device, self.stream, self.pos = stream.device, stream, len(stream.items)
        self.records += 1
        stream.items.append(self)

    def query(self):
        self.cuda.call("query", self.device)
        return self.stream is None or self.stream.passed(self.pos)


class FakeFuture:
    def __init__(self, work):
        self.work = work

    def done(self):
        return self.work.nccl or self.work.gpu_done

    def value(self):
        if self.work.error:
            raise RuntimeError(self.work.error)
        return [object()]

    def wait(self):
        if self.work.error:
            raise RuntimeError(self.work.error)
        cuda = self.work.cuda
        cuda.call("wait", self.work.device)
        cuda.thread_stream(self.work.device).items.append(("wait", self.work))
        return [object()]


class FakeWork:
    def __init__(self, cuda, device, nccl=True):
        self.cuda, self.device, self.nccl = cuda, device, nccl
        self.gpu_done = False
        self.error = None
        self.asked = 0

    def finish(self):
        self.gpu_done = True

    def is_completed(self):
        self.asked += 1
        self.cuda.call("is_completed", self.device)
        return self.gpu_done

    def get_future(self):
        return FakeFuture(self)


class FakeTensor:
    """A tensor on a CUDA device, as colltrace's wrappers read one."""

    def __init__(self, device: int | None, shape=(4,)):
        self.shape = shape
        self.dtype = torch.float32
        self.is_cuda = device is not None
        self.device = torch.device("cuda", device) if device is not None else torch.device("cpu")
        self._index = -1 if device is None else device

    def get_device(self):
        return self._index


class FakeCuda:
    def __init__(self, own_streams: bool = True):
        self.own_streams = own_streams
        self.current: dict[int, FakeStream] = {}
        self.devices: dict[int, int] = {}        # thread -> device set
        self.overrides: dict[tuple, FakeStream] = {}
        self.contexts: set[int] = set()
        self.capture = None                       # (thread, device, mode) while capturing
        self.invalidated: list[str] = []
        self.log: list[tuple] = []                # (call, thread, device, device set on that thread)
        self.routes = {"own_stream": own_streams, "thread_local_queries": False}

    # what colltrace calls
    def event(self):
        return FakeEvent(self)

    def current_stream(self, device):
        s = self.current.get(device)
        if s is None:
            s = self.current[device] = FakeStream(self, device, "default")
        return s

    def current_device(self):
        return self.thread_device()

    def capturing(self, device):
        c = self.capture
        return c is not None and c[0] == threading.get_ident() and c[1] == device

    def set_device(self, device):
        self.call("set_device", device)
        self.devices[threading.get_ident()] = device

    @contextlib.contextmanager
    def stream(self, s):
        key = (threading.get_ident(), s.device)
        self.overrides[key] = s
        try:
            yield
        finally:
            del self.overrides[key]

    def own_stream(self, device):
        return FakeStream(self, device, "own") if self.own_streams else None

    def thread_local_queries(self):
        return False

    # bookkeeping
    def thread_device(self):
        return self.devices.get(threading.get_ident(), 0)

    def thread_stream(self, device):
        return self.overrides.get((threading.get_ident(), device)) or self.current_stream(device)

    def call(self, what, device):
        me = threading.get_ident()
        c = self.capture
        if c is not None and c[2] == "global" and c[0] != me:
            self.invalidated.append(what)
        if what in ("query", "is_completed", "wait") and me not in self.devices:
            self.contexts.add(0)   # the runtime's current device on a thread that set none
        self.log.append((what, me, device, self.devices.get(me)))

    def graphs_module(self):
        """A torch.cuda.graphs whose CUDAGraph captures on the calling thread's device 0 stream."""
        cuda = self

        class CUDAGraph:
            def capture_begin(self, pool=None, capture_error_mode="global"):
                cuda.capture = (threading.get_ident(), cuda.thread_device(), capture_error_mode)

            def capture_end(self):
                cuda.capture = None

        return types.SimpleNamespace(CUDAGraph=CUDAGraph)
