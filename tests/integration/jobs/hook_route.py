"""Collectives no torch.distributed wrapper sees (torch >= 2.14: c10d's per-group hooks record them):
of every kind the compiled hook case takes (one site in a loop, alternating signatures, async, a
second thread, a subgroup, DDP's reducer on its autograd thread) and of those it leaves to the
Python hook (a root, p2p, a coalesced block), with wrapped calls in between. Prints the compiled
hook case's own count (HOOKFAST) for the test that compares it with COLLTRACE_PURE=1."""
import json
import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pg = dist.group.WORLD
x = torch.arange(8, dtype=torch.float32).reshape(2, 4) + rank


def original(name):
    f = getattr(dist, name)
    return getattr(f, "__colltrace_original__", f)


for _ in range(3):
    pg.allreduce([x]).wait()   # one site, one signature
original("all_reduce")(x)      # blocking, through torch.distributed's own function
original("all_reduce")(torch.ones(3, dtype=torch.float64), async_op=True).wait()
for i in range(6):             # alternating signatures at one site
    pg.allreduce([torch.ones(i % 2 + 1)]).wait()
pg.allreduce([x, x.clone()]).wait()   # a coalesced block of two
pg.allgather([[torch.empty_like(x) for _ in range(world)]], [x]).wait()
pg._allgather_base(torch.empty(world * 2, 4), x).wait()
pg._reduce_scatter_base(torch.empty(1, 4), torch.ones(world, 4)).wait()
pg.alltoall_base(torch.empty(world * 2), torch.ones(world * 2), [], []).wait()
pg.barrier().wait()
original("broadcast")(x, 0)   # a root: the Python hook
dist.all_reduce(x)             # a wrapped call between
if rank == 0:                  # p2p: the Python hook
    pg.send([torch.ones(3)], 1, 0).wait()
elif rank == 1:
    pg.recv([torch.empty(3)], 0, 0).wait()
work = pg.allreduce([torch.ones(5)])   # async, its Work waited on later
pg.allreduce([torch.ones(5)]).wait()
work.wait()
t = threading.Thread(target=lambda: pg.allreduce([torch.ones(2)]).wait(), name="worker")  # noqa: F821 (pg: above)
t.start()
t.join()
sub = dist.new_group(list(range(world)))
sub.allreduce([torch.ones(1)]).wait()
pg.allreduce([torch.ones(1)]).wait()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
for _ in range(2):
    model(torch.randn(2, 4)).sum().backward()   # the reducer's all-reduces, on autograd's thread
dist.barrier()

from colltrace.rank import fastpath, hooks  # noqa: E402

hits = fastpath._fastpath.hook_hits() if fastpath.available() else None
print("HOOKFAST " + json.dumps({"hits": hits, "compiled": hooks.compiled_in_use()}), flush=True)
del model, work, pg, sub   # nothing of ours may keep a group alive past its destruction (gloo aborts at exit)
dist.destroy_process_group()
