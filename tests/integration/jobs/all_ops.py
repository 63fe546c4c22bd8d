"""Issues one of every kind of collective on 2+ gloo ranks; prints the backend's own counts.

The test compares colltrace's trace with these counts and with the calls made here (the line
numbers of the calls are looked up by the test from this file's text: `# op: NAME` markers).
"""
import json
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed import P2POp  # by-name import: before tracing starts
from torch.distributed import isend as captured_isend

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
peer = (rank + 1) % world
prev = (rank - 1) % world
x = torch.arange(8, dtype=torch.float32).reshape(2, 4) + rank

dist.all_reduce(x)  # op: all_reduce
dist.broadcast(x, src=0)  # op: broadcast
dist.reduce(x, dst=0)  # op: reduce
dist.all_gather([torch.empty_like(x) for _ in range(world)], x)  # op: all_gather
dist.all_gather_into_tensor(torch.empty(world * 2, 4), x)  # op: all_gather_into_tensor
dist.gather(x, [torch.empty_like(x) for _ in range(world)] if rank == 0 else None, dst=0)  # op: gather
dist.scatter(x, [torch.ones(2, 4) for _ in range(world)] if rank == 0 else None, src=0)  # op: scatter
dist.reduce_scatter_tensor(torch.empty(1, 4), torch.ones(world, 4))  # op: reduce_scatter_tensor
dist.all_to_all_single(torch.empty(world * 2), torch.ones(world * 2))  # op: all_to_all_single
dist.barrier()  # op: barrier
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})  # op: all_gather_object
lst = [{"step": 3}] if rank == 0 else [None]
dist.broadcast_object_list(lst, src=0)  # op: broadcast_object_list
work = dist.all_reduce(x, async_op=True)  # op: all_reduce_async
work.wait()
with dist._coalescing_manager():  # op: _coalescing_manager
    dist.all_reduce(torch.ones(3))
    dist.all_reduce(torch.ones(5))
out = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)  # op: funcol.all_reduce
out = out + 0  # waits for the result
reqs = dist.batch_isend_irecv([P2POp(dist.isend, torch.ones(2), peer),  # op: batch_isend_irecv
                               P2POp(dist.irecv, torch.empty(2), prev)])
for r in reqs:
    r.wait()
pre = P2POp(captured_isend, torch.ones(2), peer)  # a P2POp from a function captured before tracing
reqs = dist.batch_isend_irecv([pre, P2POp(dist.irecv, torch.empty(2), prev)])
for r in reqs:
    r.wait()
if rank == 0:
    dist.send(torch.ones(3), 1)  # op: send
elif rank == 1:
    dist.recv(torch.empty(3), 0)  # op: recv
sub = dist.new_group(list(range(world)))
dist.all_reduce(torch.ones(1), group=sub)  # op: all_reduce_sub
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))  # op: ddp
model(torch.randn(2, 4)).sum().backward()  # op: ddp_backward
dist.all_reduce(x)  # op: all_reduce_last

counts = {str(dist.group.WORLD.group_name): dist.group.WORLD._get_sequence_number_for_group(),
          str(sub.group_name): sub._get_sequence_number_for_group()}
print("COUNTS " + json.dumps({"rank": rank, "counts": counts, "world_name": str(dist.group.WORLD.group_name),
                              "sub_name": str(sub.group_name), "result": x.tolist()}))
del model, sub   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
dist.destroy_process_group()
plan = getattr(dist.all_reduce, "__colltrace_plan__", None)   # colltrace's compiled hot path, if it is on
rooted = [getattr(getattr(dist, n), "__colltrace_plan__", None) for n in ("broadcast", "reduce", "gather", "scatter")]
compiled = sys.modules.get("colltrace.rank.hooks")   # build-hooks' module: loaded where built and allowed
print("FASTPATH " + json.dumps({"hits": plan.hits if plan is not None else None,
                                "rooted": [p.hits if p is not None else None for p in rooted],
                                "compiled": compiled.compiled_in_use() if compiled is not None else None}))
