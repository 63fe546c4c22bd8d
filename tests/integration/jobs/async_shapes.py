"""Hangs as NCCL makes them, on gloo: calls that return before they run (async_op=True,
functional collectives), the CPU running ahead through more calls, then parking in a wait.

    SHAPE=<shape> python async_shapes.py      (ranks started as torchrun starts them)

Ranks 0..N-2 train on the default group; the last rank plays the teacher on its own group, as in
the reports' distillation job. PG_TIMEOUT_S shortens the backend's timeout.
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

shape = os.environ["SHAPE"]
if shape.startswith("funcol"):
    # what a functional collective's first call imports (seconds on a loaded machine), before
    # anything is traced: the test's stall threshold then measures waits, not imports
    import torch._dynamo  # noqa: F401
    import torch.distributed.tensor  # noqa: F401
kw = {"timeout": timedelta(seconds=float(os.environ["PG_TIMEOUT_S"]))} if os.environ.get("PG_TIMEOUT_S") else {}
dist.init_process_group("gloo", **kw)
rank, world = dist.get_rank(), dist.get_world_size()
teacher = world - 1
ipc = dist.new_group(list(range(world)), **kw)
tp = dist.new_group(list(range(world)), **kw)   # the functional collectives' group (tensor parallel)
x = torch.ones(4)
dist.all_reduce(x)
print("READY", flush=True)


def run_ahead():
    """Three calls that return at once; the first is the one that can hang."""
    first = dist.all_reduce(torch.ones(4), async_op=True)  # op: stuck
    dist.broadcast(torch.ones(3), src=0, async_op=True)  # op: ahead_1
    dist.all_reduce(torch.ones(5), async_op=True)  # op: ahead_2
    return first


if shape == "cross":
    # the reports' hang: the training ranks' all_reduce on the default group, the teacher's
    # gather on its own group; each side parks in a wait
    if rank == teacher:
        w = dist.gather(torch.ones(2), [torch.empty(2) for _ in range(world)],  # op: teacher_gather
                        dst=teacher, group=ipc, async_op=True)
        w.wait()  # op: teacher_parks
    else:
        run_ahead().wait()  # op: parks
elif shape == "same":
    # the teacher calls the other collective at the same number of the default group
    if rank == teacher:
        dist.gather(torch.ones(4), [torch.empty(4) for _ in range(world)], dst=teacher)  # op: odd_gather
    else:
        run_ahead().wait()  # op: parks_behind_mismatch
elif shape == "healthy":
    # every rank runs ahead and waits at the end: nothing is wrong
    works = [dist.all_reduce(torch.ones(4), async_op=True) for _ in range(3)]
    works.append(dist.broadcast(torch.ones(3), src=0, async_op=True))
    time.sleep(float(os.environ.get("IDLE_S", "0")))   # past the stall threshold: still in flight, unwaited
    for w in works:
        w.wait()
    print("DONE", flush=True)
elif shape in ("funcol", "funcol_hung"):
    import torch.distributed._functional_collectives as funcol

    dist.barrier(group=tp)   # the group connected (gloo connects at the first call)
    if shape == "funcol_hung" and rank == teacher:
        time.sleep(3600)  # op: teacher_busy
    for _ in range(3):   # DTensor's and tensor parallelism's path: eager functional collectives
        y = funcol.all_reduce(torch.ones(8), "sum", tp)  # op: funcol_reduce
        y.wait()  # op: funcol_wait
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    full = distribute_tensor(torch.arange(4.0 * world).reshape(world, 4), mesh, [Shard(0)]).full_tensor()
    # then only default-group traffic, past the stall threshold: as many calls on every rank (a
    # loop until a time of each rank's own would leave the last call of one rank unmatched)
    for _ in range(int(float(os.environ.get("IDLE_S", "0")) / 0.05)):
        dist.all_reduce(torch.ones(2))
        time.sleep(0.05)
    print("DONE", float(full.sum()), flush=True)
else:
    raise SystemExit(f"unknown shape {shape}")
dist.destroy_process_group()
