"""A job on NCCL (or torch 2.15's nccl2 / nccl-legacy) with CUDA tensors, for tests/gpu.

    nccl_job.py BACKEND ops    the common collectives through the wrappers, an async one, an object
                               collective and a group-object call; prints RESULT lines
    nccl_job.py BACKEND hang   after one all-reduce, a kernel that does not finish for minutes runs
                               ahead of the next all-reduce on the same stream: every rank enters it,
                               it never completes, the ranks block in a synchronize
    nccl_job.py BACKEND fr     `ops`, then the rank answers a Flight Recorder request the way it
                               answers its watchdog's, and writes NCCL's own dump to $FR_OUT

All ranks may share one GPU (LOCAL_RANK modulo the devices there are).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

backend, mode = sys.argv[1], sys.argv[2]
local = int(os.environ.get("LOCAL_RANK", "0"))
device = torch.device("cuda", local % torch.cuda.device_count())
torch.cuda.set_device(device)
dist.init_process_group(backend, device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()
n = 1024

if mode == "hang":
    t = torch.ones(n, device=device)
    dist.all_reduce(t)  # op: warm
    torch.cuda.synchronize()
    print("READY", flush=True)
    torch.cuda._sleep(1 << 40)   # about ten minutes of spinning at 1.5 GHz, ahead of the next op
    dist.all_reduce(t)  # op: hung
    torch.cuda.synchronize()     # where a training step would block: in .item(), a copy, a sync
    sys.exit(3)                  # not reached within the test's bound

t = torch.full((n,), float(rank + 1), device=device)
dist.all_reduce(t)  # op: all_reduce
work = dist.all_reduce(t, async_op=True)  # op: async_all_reduce
work.wait()
dist.broadcast(t, src=0)  # op: broadcast
gathered = torch.empty(n * world, device=device)
dist.all_gather_into_tensor(gathered, t)  # op: all_gather_into_tensor
scattered = torch.empty(n, device=device)
dist.reduce_scatter_tensor(scattered, torch.ones(n * world, device=device))  # op: reduce_scatter_tensor
objects = [None] * world
dist.all_gather_object(objects, {"rank": rank})  # op: all_gather_object
dist.group.WORLD.allreduce([t]).wait()  # op: group_object
dist.barrier()  # op: barrier
torch.cuda.synchronize()
time.sleep(1.0)   # the rank's poller sees the last CUDA events complete (it polls every 0.1 s)
print("RESULT", t.sum().item(), gathered.sum().item(), scattered.sum().item(),
      sorted(o["rank"] for o in objects), flush=True)

if mode == "fr":
    from colltrace.tracefile import asks

    directory = os.environ["COLLTRACE_DIR"]
    asks.request_fr(directory, rank)   # what the watchdog does for a rank others wait for
    deadline = time.time() + 30
    while not asks.fr_answered(directory, rank) and time.time() < deadline:
        time.sleep(0.05)
    print("FR_ANSWERED", asks.fr_answered(directory, rank), flush=True)
    c = torch._C._distributed_c10d
    # NCCL's own recorder (what NCCL writes on a timeout): gloo's (_dump_fr_trace) holds nothing of NCCL's ops
    data = c._dump_nccl_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    os.makedirs(os.environ["FR_OUT"], exist_ok=True)
    with open(os.path.join(os.environ["FR_OUT"], f"nccl_trace_rank_{rank}"), "wb") as f:
        f.write(data)

dist.destroy_process_group()
