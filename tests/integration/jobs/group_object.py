"""Collectives called on the group object (pg.allreduce, as PyTorch's own tests and some libraries
do), which no torch.distributed wrapper sees. Default (long) timeouts.

    group_object.py mismatch   rank 1 calls pg.allgather where rank 0 calls pg.allreduce: a hang
    group_object.py inject RANK_POINT...   colltrace's hook fails inside (pre or post, per rank)
"""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pg = dist.group.WORLD
x = torch.ones(4) * (rank + 1)
pg.allreduce([x]).wait()  # op: first
print("READY", flush=True)

if sys.argv[1] == "mismatch":
    if rank == 0:
        pg.allreduce([x]).wait()  # op: pg_allreduce
    else:
        pg.allgather([[torch.empty(4) for _ in range(world)]], [x]).wait()  # op: pg_allgather
elif sys.argv[1] == "inject":
    # colltrace's own code fails inside its hook, before (pre) or after (post) the backend call.
    from colltrace.rank import hooks, shim

    def broken(*a, **k):
        raise RuntimeError("simulated colltrace bug")

    point = dict(a.split("=") for a in sys.argv[2:]).get(str(rank))
    if point == "pre":
        hooks.op_name = broken
        hooks._names.clear()   # op names already seen are cached: the next op calls op_name
    elif point == "post" and shim.recorder is not None:
        shim.recorder.exit = broken
    pg.allreduce([x]).wait()
    out = [torch.empty(4) for _ in range(world)]
    pg.allgather([out], [x]).wait()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1, bias=False))
    with torch.no_grad():
        model.module.weight.fill_(1.0)
    model(torch.ones(1, 4) * (rank + 1)).sum().backward()
    dist.barrier()
    print("RESULT", x.tolist(), [t.tolist() for t in out], model.module.weight.grad.tolist(), flush=True)
    del model   # DDP holds the group
del pg   # a group kept alive past destroy_process_group makes gloo abort at exit
dist.destroy_process_group()
