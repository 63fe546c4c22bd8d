"""CUDA collectives followed by events, on a machine with no GPU: tests/helpers/fakecuda.py stands
in for torch.cuda and checks CUDA's rules (a query from a thread with no device set makes a context
on GPU 0; a CUDA call from another thread during a global-mode capture invalidates it). What the
GPU itself does is tests/gpu/check.py's to show."""
from __future__ import annotations

import dataclasses
import sys
import threading
import time
import types
import weakref

import pytest

from colltrace import config
from colltrace.rank import cudamarks, shim
from colltrace.rank.recorder import Recorder
from colltrace.tracefile import reader
from helpers.fakecuda import FakeCuda, FakeTensor, FakeWork
from helpers.waiting import wait_until

POLL_S = 0.02


class Group:
    """A group of one backend with a counter its collectives move."""
    made = 0

    def __init__(self):
        Group.made += 1
        self.name, self.seq = f"g{Group.made}", 0


def describe(pg):
    def get_seq():
        return pg.seq
    return pg.name, "train", [0, 1], "nccl", get_seq


@pytest.fixture
def traced(tmp_path, monkeypatch):
    """(recorder, the fake CUDA, the default group, a c10d stand-in) with shim's wrappers pointed at them."""
    fake = FakeCuda()
    gate = cudamarks.CaptureGate()
    settings = config.load({"COLLTRACE": "1", "COLLTRACE_DIR": str(tmp_path), "COLLTRACE_POLL_S": str(POLL_S)})
    rec = Recorder(settings, rank=0, world_size=2, backend="nccl", cuda=cudamarks.CudaMarks(fake, gate))
    pg = Group()
    c10d = types.SimpleNamespace(_world=types.SimpleNamespace(default_pg=pg, pg_coalesce_state={}),
                                 GroupMember=types.SimpleNamespace(WORLD=pg),
                                 _get_object_coll_device=lambda group: "cuda")
    monkeypatch.setattr(shim, "recorder", rec)
    monkeypatch.setattr(shim, "_c10d", c10d)
    monkeypatch.setattr(shim, "first_sight", describe)
    monkeypatch.setattr(shim, "_state", dataclasses.replace(shim._state, settings=None))   # the Python wrappers alone
    yield types.SimpleNamespace(rec=rec, fake=fake, gate=gate, pg=pg, c10d=c10d, dir=str(tmp_path))
    rec.close()


def wrap(name, fn):
    return shim._make_c10d_wrapper(name, fn)


def collectives(t, works=None):
    """all_reduce and broadcast_object_list as c10d's (their signatures), moving the group's counter."""
    def all_reduce(tensor, op=None, group=None, async_op=False):
        (group or t.pg).seq += 1
        if async_op:
            work = FakeWork(t.fake, tensor.get_device())
            if works is not None:
                works.append(work)
            return work

    def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
        (group or t.pg).seq += 2

    return wrap("all_reduce", all_reduce), wrap("broadcast_object_list", broadcast_object_list)


def record(t, n=-1):
    return [r for r in reader.load_traces(t.dir)[0].all_records() if r["op"] != "untraced"][n]


def test_a_blocking_cuda_collective_is_followed_on_its_tensors_device_from_start_to_end(traced):
    t = traced
    all_reduce, _ = collectives(t)
    x = FakeTensor(device=1)          # the program's current device stays 0: it never called set_device
    all_reduce(x)
    stream = t.fake.current_stream(1)
    assert [type(i).__name__ for i in stream.items] == ["FakeEvent", "FakeEvent"]   # start, end on cuda:1's stream
    assert 0 not in t.fake.current   # nothing recorded on GPU 0's stream
    time.sleep(5 * POLL_S)
    r = record(t)
    assert r["state"] == "in_flight" and r["start_event"] is True and r["started_at"] is None
    stream.run(1)                     # the GPU finished what was queued ahead: the collective starts
    assert wait_until(lambda: record(t)["started_at"] is not None)
    assert record(t)["state"] == "in_flight"
    stream.run()
    assert wait_until(lambda: record(t)["state"] == "completed")
    r = record(t)
    assert r["entered_at"] <= r["started_at"] <= r["completed_at"]
    # the poller queried with its thread's device set to the tensors', never creating a context on GPU 0
    queries = [x for x in t.fake.log if x[0] == "query"]
    assert queries and all(dev == 1 and set_to == 1 for _, _, dev, set_to in queries) and t.fake.contexts == set()


def test_an_async_cuda_collective_completes_by_colltraces_own_event_never_by_asking_the_work(traced):
    t = traced
    works = []
    all_reduce, _ = collectives(t, works)
    other = Group()
    w1 = all_reduce(FakeTensor(0), async_op=True)
    w2 = all_reduce(FakeTensor(0), group=other, async_op=True)
    t.fake.current_stream(0).run()    # both started: what is left is NCCL's side
    assert wait_until(lambda: all(m.end is not None for _, _, _, m in t.rec._marks))
    w2.finish()                       # the second group's collective ran; the first's is stuck
    recs = lambda: {r["group"]: r for r in reader.load_traces(t.dir)[0].all_records()}   # noqa: E731
    assert wait_until(lambda: recs()[other.name]["state"] == "completed")
    assert recs()[t.pg.name]["state"] == "in_flight"   # not held back by it, nor completed with it
    w1.finish()
    assert wait_until(lambda: recs()[t.pg.name]["state"] == "completed")
    assert w1.asked == w2.asked == 0   # is_completed (NCCL: the communicator's lock, GIL held) never called
    assert t.rec.cuda.routes() == {"own_stream": True, "thread_local_queries": False}
    # the rank lets go of the Works once they are events of its own
    assert all(m.works is None for _, _, _, m in t.rec._marks)


def test_a_work_whose_future_completes_with_it_is_polled_as_before(traced):
    t = traced
    all_reduce, _ = collectives(t)

    def gloo_cuda(tensor, op=None, group=None, async_op=False):
        return FakeWork(t.fake, 0, nccl=False)   # gloo on CUDA tensors: the future completes with the work

    w = wrap("all_reduce", gloo_cuda)(FakeTensor(0), async_op=True)
    assert wait_until(lambda: w.asked > 2)       # polled; waiting on its future would block the poller
    assert record(t)["state"] == "in_flight"
    w.finish()
    assert wait_until(lambda: record(t)["state"] == "completed")


def test_without_a_stream_of_its_own_the_work_is_polled(tmp_path, monkeypatch, traced):
    t = traced
    t.fake.own_streams = False
    works = []
    all_reduce, _ = collectives(t, works)
    all_reduce(FakeTensor(0), async_op=True)
    assert wait_until(lambda: works[0].asked > 0)
    works[0].finish()
    assert wait_until(lambda: record(t)["state"] == "completed")


def test_a_captured_collective_is_never_polled_and_no_cuda_call_is_made_during_a_global_capture(traced):
    t = traced
    all_reduce, _ = collectives(t)
    graphs = t.fake.graphs_module()
    assert cudamarks.watch_captures(t.gate, cls=graphs.CUDAGraph)
    try:
        all_reduce(FakeTensor(0))                 # eager, before the capture: its GPU work still runs
        g = graphs.CUDAGraph()
        g.capture_begin()                         # torch.cuda.graph's default: capture_error_mode="global"
        assert t.gate.captures == 1
        all_reduce(FakeTensor(0))                 # captured: runs at replays
        t.fake.current_stream(0).run()            # the eager one finishes during the capture
        time.sleep(10 * POLL_S)
        assert t.fake.invalidated == []           # the poller made no CUDA call meanwhile
        assert record(t, 0)["state"] == "in_flight"
        captured = record(t, 1)
        assert captured["captured"] is True and captured["state"] == "completed" and "start_event" not in captured
        g.capture_end()
        assert t.gate.captures == 0
        assert wait_until(lambda: record(t, 0)["state"] == "completed")
        assert len(t.fake.current_stream(0).items) == 2   # the eager call's two events; none for the captured one
        # a thread-local capture leaves the poller free
        g.capture_begin(capture_error_mode="thread_local")
        assert t.gate.captures == 0
        g.capture_end()
    finally:
        cudamarks.unwatch_captures(graphs.CUDAGraph)
    assert ("capture_begin" not in vars(graphs.CUDAGraph)
            or not hasattr(graphs.CUDAGraph.capture_begin, "__colltrace_original__"))


def test_a_capture_begins_only_once_a_poll_under_way_left_its_cuda_calls():
    gate = cudamarks.CaptureGate()
    inside, leave = threading.Event(), threading.Event()
    order = []

    def poller():
        with gate.quiet() as free:
            order.append(("poll", free))
            inside.set()
            leave.wait(5)
            order.append("poll done")

    th = threading.Thread(target=poller)
    th.start()
    inside.wait(5)
    begun = threading.Thread(target=lambda: (gate.begin(object()), order.append("capture")))
    begun.start()
    time.sleep(0.1)
    assert order == [("poll", True)]             # the capture waits for the poll
    leave.set()
    th.join(5)
    begun.join(5)
    assert order == [("poll", True), "poll done", "capture"]
    with gate.quiet() as free:
        assert free is False                     # and no poll makes a CUDA call until it ends


def test_an_object_collective_on_a_cuda_group_waits_for_its_event(traced):
    t = traced
    _, bcast = collectives(t)
    bcast([{"a": 1}], src=0)                     # the sender returns before the GPU sent
    time.sleep(5 * POLL_S)
    assert record(t)["state"] == "in_flight"
    t.fake.current_stream(0).run()
    assert wait_until(lambda: record(t)["state"] == "completed")
    t.c10d._get_object_coll_device = lambda group: "cpu"   # a gloo group: done at its return, no event
    bcast([{"a": 1}], src=0)
    assert record(t)["state"] == "completed" and "start_event" not in record(t)


def test_a_blocking_coalesced_block_of_cuda_ops_waits_for_its_event(traced):
    t = traced
    manager = shim._make_coalescing_wrapper(_coalescing_manager(t))
    with manager(group=t.pg):
        t.c10d._world.pg_coalesce_state[t.pg].append(types.SimpleNamespace(tensor=FakeTensor(1)))
    time.sleep(5 * POLL_S)
    r = record(t)
    assert r["op"] == "_coalescing_manager" and r["state"] == "in_flight"
    t.fake.current_stream(1).run()
    assert wait_until(lambda: record(t)["state"] == "completed")


def _coalescing_manager(t):
    import contextlib

    @contextlib.contextmanager
    def _coalescing_manager(group=None, device=None, async_ops=False):
        t.c10d._world.pg_coalesce_state[group] = []
        yield types.SimpleNamespace(works=[])
        t.c10d._world.pg_coalesce_state.pop(group)
        group.seq += 1

    return _coalescing_manager


def test_events_are_reused_per_device(traced):
    t = traced
    all_reduce, _ = collectives(t)
    for i in range(20):
        all_reduce(FakeTensor(i % 2))
        t.fake.current_stream(i % 2).run()
        assert wait_until(lambda: not t.rec._marks)
    events = {id(x) for d in (0, 1) for x in t.fake.current_stream(d).items}
    assert len(events) <= 4   # two per device, recorded again and again, never created per call


def test_a_destroyed_groups_works_are_asked_once_more_then_let_go(traced):
    t = traced
    a, b = Group(), Group()
    gs_a, gs_b = t.rec.group_state(a, describe), t.rec.group_state(b, describe)
    import sys as _sys

    def pending(gs, work):
        ctx = t.rec.enter(gs, 0, _sys._getframe(0), 1)
        t.rec.exit(ctx, done=False, waitable=work)
        return ctx[0]

    done, stuck, other = FakeWork(t.fake, 0), FakeWork(t.fake, 0), FakeWork(t.fake, 0)
    done.gpu_done = True
    with t.rec.cuda.quiet():   # the poller stays out while the test sets up
        ids = pending(gs_a, done), pending(gs_a, stuck), pending(gs_b, other)
    gone = weakref.ref(stuck)
    t.rec.forget_group(a)
    del stuck
    assert gone() is None                                   # not held past its group
    assert [x[0] for x in t.rec._pending] in ([ids[2]], [])  # the other group's stays followed
    states = {r["id"]: r["state"] for r in reader.load_traces(t.dir)[0].all_records()}
    assert states[ids[0]] == "completed" and states[ids[1]] == "in_flight"


def test_on_a_real_torch_the_capture_methods_are_wrapped_and_restored():
    cls = sys.modules["torch.cuda.graphs"].CUDAGraph
    watched = cls in cudamarks._patched   # colltrace installed in this process
    cudamarks.unwatch_captures(cls)
    was = cls.__dict__.get("capture_begin")
    try:
        assert cudamarks.watch_captures(cls=cls)
        assert cls.capture_begin.__colltrace_original__ is (was or cls.__mro__[1].capture_begin)
    finally:
        cudamarks.unwatch_captures(cls)
        assert cls.__dict__.get("capture_begin") is was
        if watched:
            cudamarks.watch_captures(cls=cls)
