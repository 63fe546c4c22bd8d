"""The CUDA work of traced collectives, followed without a sync: a start and an end event per
collective, recorded in the program's threads and queried by the recorder's poller thread.

- Both events go on the current stream of the device the collective's tensors are on, never the
  current device's when they live elsewhere. The start event, recorded before the call, is
  reached when the GPU has finished what was queued ahead of the collective (the Flight
  Recorder's "started"); the end event, recorded after a blocking call (whose Work made that
  stream wait for the collective), when the collective has run.
- The poller sets its own thread's device to the event's before it queries it: a CUDA query
  from a thread with no device set would make a context on GPU 0.
- A call issued while its stream is being captured into a CUDA graph gets no event and is never
  polled: it runs at the graph's replays, which no record follows. While a capture in global
  mode is under way (CUDAGraph.capture_begin to capture_end, watched here) the poller makes no
  CUDA call at all: a query from another thread would invalidate the capture. Where the CUDA
  runtime torch uses can be reached, the poller's thread also queries in thread-local capture
  mode, as PyTorch's own watchdog does.
- An async collective's Work is not asked is_completed(): NCCL's takes its communicator's lock
  with the GIL held, and waits there while NCCL aborts. Its future (complete at enqueue, with
  events on NCCL's stream) is waited for on a stream of colltrace's own (one per device and
  group, non-blocking, made through the CUDA runtime), and the end event recorded there. Where
  no such stream can be made, or the future is not complete at once (gloo's CUDA ops), the Work
  is polled as before.
- Events come from a pool per device and return to it once reached.

Every CUDA call is made through a `TorchCuda` (tests/unit/test_cudamarks.py gives a stand-in).
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from typing import Any, cast

from colltrace.rank import patches

POOL_MAX = 4096         # free events kept per device (a burst of async collectives may hold many)
OWN_STREAMS_MAX = 64    # colltrace's own streams per process; past it, Works are polled instead
BEGIN_WAIT_S = 2.0      # how long a capture's begin waits for a poll under way to finish


class _Captured:
    """What begin() returns for a call being captured into a CUDA graph."""

    def __repr__(self):
        return "CAPTURED"


CAPTURED = _Captured()


class Mark:
    """One collective's CUDA work: where its events are, and which have been seen reached."""
    __slots__ = ("device", "stream", "start", "end", "works", "lane", "started", "route")

    def __init__(self, device: int, stream, start):
        self.device = device
        self.stream = stream
        self.start = start      # an event recorded before the call, or None
        self.end: Any = None    # an event reached once the collective ran
        self.works: list[Any] | None = None   # an async call's Works, until the poller turns them into `end`
        self.lane: Any = None   # (group, peer): an async call's own-stream key
        self.started = False
        self.route: str | None = None   # an async call's: "event" (own stream) or "work" (is_completed)


class CaptureGate:
    """Global-mode captures under way in this process, and the poller's CUDA section, kept apart:
    a capture begins only once a poll under way has left its CUDA calls, and no poll makes one
    while a capture is counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.captures = 0
        self._graphs: set = set()

    def begin(self, graph) -> None:
        got = self._lock.acquire(timeout=BEGIN_WAIT_S)   # a poller stuck in CUDA must not stop the program
        try:
            self.captures += 1
            self._graphs.add(id(graph))
        finally:
            if got:
                self._lock.release()

    def end(self, graph) -> None:
        with self._lock:
            if id(graph) in self._graphs:
                self._graphs.discard(id(graph))
                self.captures = max(0, self.captures - 1)

    @contextlib.contextmanager
    def quiet(self):
        """True inside: no global-mode capture is under way, and none begins until the block ends."""
        if not self._lock.acquire(blocking=False):
            yield False   # a capture is beginning: next round
            return
        try:
            yield self.captures == 0
        finally:
            self._lock.release()


GATE = CaptureGate()
_patched: dict = {}   # class -> its capture methods' patches (colltrace/rank/patches.py)


def watch_captures(gate: CaptureGate = GATE, cls=None) -> bool:
    """Wrap torch.cuda.CUDAGraph's capture_begin/capture_end (torch.cuda.graph and
    make_graphed_callables call them) to count global-mode captures in `gate`. torch.cuda must be
    imported already (torch imports it); nothing is imported here. cls: another class (tests)."""
    if cls is None:
        cls = getattr(sys.modules.get("torch.cuda.graphs"), "CUDAGraph", None)
    if cls is None:
        return False
    if cls in _patched:
        return True
    begin, end = getattr(cls, "capture_begin", None), getattr(cls, "capture_end", None)
    if begin is None or end is None:
        return False

    def capture_begin(self, *args, **kwargs):
        mode = kwargs.get("capture_error_mode", args[1] if len(args) > 1 else "global")
        blocks = mode == "global"   # thread_local and relaxed captures leave other threads free
        if blocks:
            gate.begin(self)
        try:
            return begin(self, *args, **kwargs)
        except BaseException:   # re-raised below, after the gate is opened
            if blocks:
                gate.end(self)
            raise

    def capture_end(self, *args, **kwargs):
        try:
            return end(self, *args, **kwargs)
        finally:
            gate.end(self)

    def wrapping(new: Any):
        def factory(old):
            new.__wrapped__ = old
            patches.mark(new, old)
            return new
        return factory

    made = _patched[cls] = patches.Patches()
    made.patch(cls, "capture_begin", wrapping(capture_begin), inherited=True)
    made.patch(cls, "capture_end", wrapping(capture_end), inherited=True)
    return True


def unwatch_captures(cls=None) -> None:
    for klass in [k for k in _patched if cls is None or k is cls]:
        _patched.pop(klass).restore()


class _Cudart:
    """The CUDA runtime library torch loaded, for the two calls torch does not offer: a
    non-blocking stream of colltrace's own, and this thread's capture mode."""

    def __init__(self, lib):
        self.lib = lib

    @classmethod
    def find(cls):
        try:
            with open("/proc/self/maps") as f:
                path = next((line.split()[-1] for line in f if "libcudart.so" in line), None)
            return cls(ctypes.CDLL(path)) if path else None
        except (OSError, StopIteration, IndexError):
            return None

    def stream(self) -> int | None:
        handle = ctypes.c_void_p()
        rc = self.lib.cudaStreamCreateWithFlags(ctypes.byref(handle), ctypes.c_uint(1))   # cudaStreamNonBlocking
        return handle.value if rc == 0 and handle.value else None

    def thread_local_mode(self) -> bool:
        mode = ctypes.c_int(1)   # cudaStreamCaptureModeThreadLocal
        return self.lib.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0


class TorchCuda:
    """The torch.cuda calls the marks make, in one place."""

    def __init__(self):
        import torch

        cuda = torch.cuda
        self._torch = torch
        self.event = cuda.Event   # made at its first record, on that stream's device
        self.current_stream = cuda.current_stream
        self.set_device = cuda.set_device
        self.stream = cuda.stream
        self.current_device = cuda.current_device
        self._capturing = cuda.is_current_stream_capturing
        self._cudart = _Cudart.find()
        self.routes = {"own_stream": self._cudart is not None, "thread_local_queries": False}

    def capturing(self, device: int) -> bool:
        # torch's test is for the current device's current stream; a capture runs on it (torch.cuda.graph
        # makes its stream current), so a call on another device's tensors is not being captured
        return device == self.current_device() and bool(self._capturing())

    def own_stream(self, device: int):
        """A non-blocking stream of colltrace's own on `device` (the thread's device is set), or None."""
        if self._cudart is None:
            return None
        handle = self._cudart.stream()
        if handle is None:
            return None
        return self._torch.cuda.ExternalStream(handle, device=self._torch.device("cuda", device))

    def thread_local_queries(self) -> bool:
        """This thread's CUDA calls in thread-local capture mode: they cannot invalidate another
        thread's global-mode capture."""
        ok = self._cudart is not None and self._cudart.thread_local_mode()
        self.routes["thread_local_queries"] = ok
        return ok


class CudaMarks:
    """Begin/end in the program's threads; poll in the poller's (inside quiet())."""

    def __init__(self, runtime=None, gate: CaptureGate = GATE):
        self.rt = runtime if runtime is not None else TorchCuda()
        self.gate = gate
        self._free: dict[int, list] = {}
        self._own: dict[tuple, object] = {}
        self._device: int | None = None   # the poller thread's, once set
        self._mode_set = False
        self.home: int | None = None      # the device of the first collective: the poller's until another's

    # -- the program's threads ---------------------------------------------------------
    def _event(self, device: int):
        free = self._free.get(device)
        return free.pop() if free else self.rt.event()

    def begin(self, device: int, start: bool = True):
        """Before a collective on `device`'s tensors: a Mark (its start event recorded on that
        device's current stream when `start`), or CAPTURED."""
        rt = self.rt
        if self.home is None:
            self.home = device
        if rt.capturing(device):
            return CAPTURED
        stream = rt.current_stream(device)
        ev = None
        if start:
            ev = self._event(device)
            ev.record(stream)
        return Mark(device, stream, ev)

    def end(self, mark: Mark) -> Mark:
        """After a blocking call: the end event, on the stream the call's Work made wait for it."""
        ev = self._event(mark.device)
        ev.record(mark.stream)
        mark.end = ev
        return mark

    def after_async(self, mark: Mark, works, lane) -> Mark:
        """After an async call: its Works, turned into an end event by the poller."""
        mark.works = list(works) if isinstance(works, (list, tuple)) else [works]
        mark.lane = lane
        return mark

    # -- the poller's thread -----------------------------------------------------------
    def quiet(self):
        return self.gate.quiet()

    def _on(self, device: int) -> None:
        if self._device != device:
            self.rt.set_device(device)
            self._device = device
            if not self._mode_set:
                self._mode_set = True
                self.rt.thread_local_queries()

    def settle(self) -> None:
        """The poller thread's device set (to the first collective's) before CUDA calls made for
        it by torch (a Work's is_completed, NCCL's Flight Recorder dump)."""
        if self._device is None and self.home is not None:
            try:
                self._on(self.home)
            except Exception:   # a CUDA error: poll meets it again and makes it the mark's outcome
                pass

    def poll(self, mark: Mark):
        """(reached its start just now, outcome): outcome False while the collective runs, True once
        it ran, a reason (str) where it failed (the CUDA error, the Work's future's error), as
        recorder._waitable_done answers."""
        try:
            self._on(mark.device)
            if mark.end is None and mark.route is None:
                self._to_event(mark)
            # no end event yet: an async call's Works, set by after_async (the cast says so to mypy)
            done = (mark.end.query() if mark.end is not None
                    else all(w.is_completed() for w in cast("list[Any]", mark.works)))
            started = False
            if not done and mark.start is not None and not mark.started and mark.start.query():
                mark.started = started = True
            if done:
                self.release(mark)
            return started, bool(done)
        # a CUDA or Work error (torch's, no type we can name): this mark's outcome, not the poller's end
        except Exception as exc:
            self.release(mark, reuse=False)
            return False, f"{type(exc).__name__}: {exc}"[:2000]

    def _to_event(self, mark: Mark) -> None:
        """An async call's Works -> an end event on a stream of colltrace's own made to wait for their
        futures; else (no such stream, a future not complete at once) the Works, polled."""
        mark.route = "work"
        futures = []
        for w in cast("list[Any]", mark.works):   # an async call's, set by after_async
            try:
                fut = w.get_future()
            except Exception:   # a backend without futures
                return
            # completes with the work itself (gloo): waiting on it would block this thread
            if fut is None or not fut.done():
                return
            futures.append(fut)
        stream = self._own_stream(mark.device, mark.lane)
        if stream is None:
            return
        with self.rt.stream(stream):
            for fut in futures:
                fut.wait()   # stream-ordered: the stream waits for the events NCCL recorded after the collective
        ev = self._event(mark.device)
        ev.record(stream)
        mark.end, mark.works, mark.route = ev, None, "event"

    def _own_stream(self, device: int, lane):
        # One per device and group (per peer for p2p): a collective stuck in one group must not
        # hold back the end events of another's.
        key = (device, lane)
        if key not in self._own and len(self._own) < OWN_STREAMS_MAX:
            try:
                self._own[key] = self.rt.own_stream(device)
            except Exception:   # the runtime refused: this lane's Works are polled
                self._own[key] = None
        return self._own.get(key)

    def release(self, mark: Mark, reuse: bool = True) -> None:
        for ev in (mark.start, mark.end):
            if ev is not None and reuse:
                free = self._free.setdefault(mark.device, [])
                if len(free) < POOL_MAX:
                    free.append(ev)
        mark.start = mark.end = mark.works = None

    def drop_works(self, mark: Mark) -> bool:
        """Let go of the Works a mark still holds (their group is being destroyed); True if it
        keeps an event to follow."""
        mark.works = None
        return mark.end is not None

    def routes(self) -> dict:
        return dict(getattr(self.rt, "routes", {}))
