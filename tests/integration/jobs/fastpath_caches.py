"""What the compiled path remembers between calls, on 2 gloo ranks: the last call's signature
(shapes, dtypes and ops that alternate), the caller's stack (more call sites than its cache
holds, met twice), the tensor's type (a parameter, a subclass with a shape of its own), the
calling thread (two threads, one after the other), rooted ops with their root given every way,
and the calls it must leave alone (torch.export's compiling flag, an object collective's parts,
calls made after tracing stepped aside)."""
import json
import sys
import threading

import torch
import torch.compiler
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
sub = dist.new_group([0, 1])
tensors = [torch.ones(3), torch.ones(2, 2, dtype=torch.float64), torch.ones(3, dtype=torch.int32)]
for i in range(9):   # op: alternating
    dist.all_reduce(tensors[i % 3], op=dist.ReduceOp.MAX if i % 2 else dist.ReduceOp.SUM)

# 80 call sites, each its own line (the compiled path caches 64 stacks), all met twice
sites = "".join(f"def site_{k}(t):\n    dist.all_reduce(t)\n" for k in range(80))
space = {"dist": dist}
exec(compile(sites, "generated_sites.py", "exec"), space)
for _ in range(2):
    for k in range(80):
        space[f"site_{k}"](tensors[0])


def other_thread():
    for _ in range(3):
        dist.all_reduce(tensors[0], group=sub)   # op: thread


for _ in range(2):
    t = threading.Thread(target=other_thread, name="worker")
    t.start()
    t.join()
    dist.all_reduce(tensors[0])   # op: main_thread

# tensor types, alternating: a plain tensor's shape and dtype come from torch's own getters, a
# subclass's shape property is read as the Python wrapper reads it (its record says [7, 7])
class Reshaped(torch.Tensor):
    @property
    def shape(self):
        return torch.Size([7, 7])


odd = torch.ones(3).as_subclass(Reshaped)
param = torch.nn.Parameter(torch.ones(3), requires_grad=False)
for t in (param, odd, tensors[0], odd, param):
    dist.all_reduce(t)   # op: tensor_types

# rooted ops: the root given every way torch takes it, alternating so the last call's memo misses
x = torch.ones(2)
for src in (0, 1, 0):
    dist.broadcast(x, src)   # op: root_positional
    dist.broadcast(x, src=src, group=sub)   # op: root_keyword
    dist.broadcast(x, group=sub, group_src=src)   # op: root_group_rank
    dist.reduce(x, dst=src, op=dist.ReduceOp.MAX)   # op: reduce_root
    dist.gather(x, [torch.empty(2), torch.empty(2)] if rank == src else None, dst=src)   # op: gather_root
    dist.scatter(x, [torch.ones(2), torch.ones(2)] if rank == src else None, src=src)   # op: scatter_root

torch.compiler._is_compiling_flag = True   # as torch.export sets it: no wrapper records this call
dist.all_reduce(tensors[0])   # op: exporting
torch.compiler._is_compiling_flag = False
objs = [None, None]
dist.all_gather_object(objs, rank)   # op: object
dist.all_reduce(tensors[0])   # op: last
shim = sys.modules.get("colltrace.rank.shim")
if shim is not None and shim.recorder is not None:   # tracing steps aside for good: no route records what follows
    # first the completions of the calls above, as the poller would have seen them in its next
    # period (a run on loaded cores may not have had one since the exporting call's hook)
    shim.recorder._drain_all()
    shim.recorder.disable("this job's own test")
for _ in range(3):
    dist.all_reduce(tensors[0])   # op: after_disable
sub = None   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
dist.destroy_process_group()
plan = getattr(dist.all_reduce, "__colltrace_plan__", None)
rooted = [getattr(getattr(dist, n), "__colltrace_plan__", None) for n in ("broadcast", "reduce", "gather", "scatter")]
print("FASTPATH " + json.dumps({"hits": plan.hits if plan is not None else None,
                                "rooted": [p.hits if p is not None else None for p in rooted]}))
