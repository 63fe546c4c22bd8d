"""The jobs of tests/gpu/check.py: NCCL and CUDA tensors where there is a GPU, gloo and CPU
tensors otherwise (the check's dry run). Every rank on the one GPU a single-GPU machine has.

    check_job.py fr                   8 all_reduce and a barrier; the rank answers a Flight Recorder
                                      request as it answers its watchdog's; torch's own dump to $FR_OUT
    check_job.py mixed                init_process_group() with no backend (cpu:gloo,cuda:nccl; on CPU a
                                      second gloo for CUDA): ops on either device, an object collective
    check_job.py runahead SHAPE       4 ranks: 0-2 run ahead on the default group, 3 does not come
                                      (cross: 3 gathers on another group; absent: 3 sleeps; same: 3
                                      gathers on the default group at the same number)
    check_job.py timeout              2 ranks, an 8 s group timeout: rank 0 in an all_reduce on the default
                                      group, rank 1 in one on another group: both end of the timeout
    check_job.py graph VARIANT        world 1: eager all_reduces, then a CUDA-graph capture of
                                      all_reduce+matmul (torch.cuda.graph, global mode / raw
                                      CUDAGraph with eager work pending / thread_local), replayed
    check_job.py nosync               world 1: 600 traced all_reduces behind a long kernel, the stream
                                      still busy after; then the cost per call traced and untraced
    check_job.py funcol               2 ranks: functional all_reduces on a tp group, then only
                                      default-group collectives for 8 s

Lines marked `# op: NAME` are what the check looks for in findings and records.
"""
import json
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

mode, args = sys.argv[1], sys.argv[2:]
CUDA = torch.cuda.is_available() and os.environ.get("CHECK_CPU") != "1"
local = int(os.environ.get("LOCAL_RANK", "0"))
if CUDA:
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    backend = "nccl"
else:
    device = torch.device("cpu")
    backend = "gloo"


def say(tag, **kw):
    print(tag, json.dumps(kw, default=str), flush=True)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def recorder():
    from colltrace.rank import shim

    return shim.recorder


if mode == "mixed":
    if CUDA:
        dist.init_process_group(device_id=device)   # no backend: cpu:gloo,cuda:nccl
    else:
        def _side(store, group_rank, group_size, timeout):
            return dist.ProcessGroupGloo(dist.PrefixStore("side", store), group_rank, group_size, timeout=timeout)
        dist.Backend.register_backend("sidegloo", _side, devices=["cuda"])
        dist.init_process_group("cpu:gloo,cuda:sidegloo")
elif mode == "timeout":
    dist.init_process_group(backend, timeout=timedelta(seconds=8))
else:
    dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()

if mode == "fr":
    t = torch.ones(256, device=device)
    for _ in range(8):
        dist.all_reduce(t)  # op: fr_all_reduce
    dist.barrier()  # op: fr_barrier
    sync()
    time.sleep(0.5)   # the poller sees the last events reached
    c = torch._C._distributed_c10d
    counts = {}
    for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
        fn = getattr(c, name, None)
        counts[name] = None if fn is None else len(
            json.loads(fn(includeCollectives=True, onlyActive=False)).get("entries") or [])
    from colltrace.tracefile import asks

    directory = os.environ["COLLTRACE_DIR"]
    asks.request_fr(directory, rank)   # what the watchdog does for a rank others wait for
    deadline = time.time() + 20
    while not asks.fr_answered(directory, rank) and time.time() < deadline:
        time.sleep(0.05)
    with open(asks.fr_dump_path(directory, rank)) as f:
        answer = json.load(f)
    seq = dist.group.WORLD._get_sequence_number_for_group()
    say("FACTS", dumps=counts, answer_error=answer["error"], counter=seq,
        answer=[(e["group"], e["seq"], e["op"]) for e in answer["entries"]],
        routes=recorder().cuda.routes() if CUDA else None)
    dump = getattr(c, "_dump_nccl_trace" if CUDA else "_dump_fr_trace")
    os.makedirs(os.environ["FR_OUT"], exist_ok=True)
    with open(os.path.join(os.environ["FR_OUT"], f"nccl_trace_rank_{rank}"), "wb") as f:
        f.write(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False))

elif mode == "mixed":
    pg = dist.group.WORLD
    cpu = torch.ones(4)
    gpu = torch.ones(4, device="cuda") if CUDA else None
    dist.all_reduce(cpu)  # op: mixed_cpu_1
    if CUDA:
        dist.all_reduce(gpu)  # op: mixed_cuda_1
    dist.all_reduce(cpu)  # op: mixed_cpu_2
    if CUDA:
        dist.all_reduce(gpu)  # op: mixed_cuda_2
    objs = [None] * world
    dist.all_gather_object(objs, rank)  # op: mixed_objects
    sync()
    time.sleep(0.5)
    counters = {}
    for t in ("cpu", "cuda"):
        try:
            counters[t] = pg._get_backend(torch.device(t))._get_sequence_number_for_group()
        except Exception as exc:
            counters[t] = repr(exc)
    say("FACTS", backend=str(dist.get_backend(pg)), counters=counters)

elif mode == "runahead":
    shape = args[0]
    ipc = dist.new_group(list(range(world)))
    t = torch.ones(64, device=device)
    for _ in range(2):   # some history on both groups
        dist.all_reduce(t)
        dist.all_reduce(t, group=ipc)
    sync()
    dist.barrier()
    print("READY", flush=True)
    if rank == world - 1:
        if shape == "absent":
            time.sleep(120)   # never comes
        else:
            out = [torch.empty(64, device=device) for _ in range(world)]
            work = dist.gather(t, out, dst=world - 1, group=ipc if shape == "cross" else None,  # op: r3_gather
                               async_op=not CUDA)
            if work is not None:
                work.wait()
            out[0].cpu()   # where a step would block
    else:
        # NCCL: blocking calls return at enqueue (the CPU runs ahead); gloo: async ones, then a wait
        w = dist.all_reduce(t, async_op=not CUDA)  # op: A
        dist.all_reduce(t, async_op=not CUDA)  # op: B
        if shape == "cross":
            objs = [None] * world
            dist.all_gather_object(objs, rank)  # op: C
        elif CUDA:
            torch.cuda.synchronize()  # op: parked
        else:
            w.wait()  # op: parked_wait
    time.sleep(120)

elif mode == "timeout":
    side = dist.new_group([0, 1])
    t = torch.ones(16, device=device)
    dist.all_reduce(t)
    sync()
    print("READY", flush=True)
    if rank == 1:
        dist.all_reduce(t, group=side)  # op: stuck_other
    else:
        dist.all_reduce(t)  # op: stuck
        dist.all_reduce(t, async_op=True)  # op: stuck_async
    print("VALUE", t.sum().item(), flush=True)   # where a step would block; the backend's timeout ends it first
    time.sleep(120)

elif mode == "graph":
    variant = args[0]
    a = torch.ones(64, device=device)
    m = torch.randn(64, 64, device=device)
    for _ in range(3):
        dist.all_reduce(a)  # op: eager
    static_in = torch.ones(64, device=device)
    static_out = torch.empty(64, device=device)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()

    def body():
        x = static_in
        for _ in range(200):
            dist.all_reduce(x)  # op: captured
            x = (m @ x.unsqueeze(1)).squeeze(1) * 0.0 + x
        static_out.copy_(x)

    if variant == "raw":
        # eager work still queued (behind a kernel) while the capture runs: the poller has events
        # to ask about for the capture's whole length
        torch.cuda._sleep(1 << 30)
        dist.all_reduce(a)  # op: eager_pending
        with torch.cuda.stream(side):
            g.capture_begin()   # global mode, the default
            body()
            time.sleep(1.0)   # the poller wakes ~10 times during the capture
            g.capture_end()
    else:
        mode_kw = {"capture_error_mode": "thread_local"} if variant == "thread_local" else {}
        with torch.cuda.graph(g, **mode_kw):
            body()
            time.sleep(1.0)
    for _ in range(3):
        static_in.fill_(2.0)
        g.replay()
    torch.cuda.synchronize()
    ok = bool(torch.allclose(static_out, torch.full_like(static_out, 2.0)))
    time.sleep(0.5)
    say("GRAPH", ok=ok, variant=variant)

elif mode == "nosync":
    x = torch.ones(1, device=device)
    busy = None
    if CUDA:
        torch.cuda._sleep(1 << 31)   # a second or two of spinning ahead of everything below
    t0 = time.perf_counter()
    works = []
    for _ in range(500):
        dist.all_reduce(x)  # op: nosync_sync
    for _ in range(100):
        works.append(dist.all_reduce(x, async_op=True))  # op: nosync_async
    enqueue_s = time.perf_counter() - t0
    if CUDA:
        busy = not torch.cuda.current_stream().query()   # still spinning: nothing waited for the GPU
    for w in works:
        w.wait()
    sync()
    traced = dist.all_reduce
    plain = getattr(traced, "__colltrace_original__", traced)
    res = {"untraced": [], "traced": []}
    for b in range(16):
        for name, f in (("untraced", plain), ("traced", traced))[::1 if b % 2 else -1]:
            sync()
            t = time.perf_counter()
            for _ in range(200):
                f(x)
            sync()
            res[name].append((time.perf_counter() - t) / 200 * 1e6)
    time.sleep(0.5)
    rec = recorder()
    pooled = {d: len(v) for d, v in rec.cuda._free.items()} if rec is not None and CUDA else None
    say("NOSYNC", busy=busy, enqueue_s=round(enqueue_s, 3),
        us_per_call={k: round(statistics.median(v), 2) for k, v in res.items()},
        pending_marks=len(rec._marks) if rec is not None else None, pooled_events=pooled,
        routes=rec.cuda.routes() if rec is not None and CUDA else None)

elif mode == "funcol":
    import torch._dynamo  # noqa: F401 - what a functional collective's first call imports (seconds)
    import torch.distributed._functional_collectives as funcol

    tp = dist.new_group([0, 1])
    dist.barrier(group=tp)   # the group's communicator made: the threshold then measures waits
    x = torch.ones(8, device=device)
    for _ in range(3):
        y = funcol.all_reduce(x, "sum", tp)  # op: funcol
        x = y * 0.5   # waits for it (AsyncCollectiveTensor)
    sync()
    t = torch.ones(8, device=device)
    end = time.time() + 8
    while time.time() < end:   # the tp group idle; only the default group works
        dist.all_reduce(t)  # op: default_only
        sync()
        time.sleep(0.1)
    say("FUNCOL", value=float(x.sum().item()))

else:
    raise SystemExit(f"unknown mode {mode}")

sync()
dist.destroy_process_group()
