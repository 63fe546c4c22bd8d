"""A job with a process group defined in Python (a dist.ProcessGroup subclass registered as a
backend, as PyTorch's own tests do) next to a gloo group: argv[1] = "default" makes it the
default group, "new_group" a subgroup. Its collectives complete at once, locally."""
import sys

import torch
import torch.distributed as dist


class LocalWork(dist.Work):
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


class PythonPG(dist.ProcessGroup):
    """All-reduce and barrier that do nothing across ranks (enough to be called)."""

    def __init__(self, rank, world_size):
        super().__init__(rank, world_size)

    def allreduce(self, tensors, opts=None):
        return LocalWork()

    def barrier(self, opts=None):
        return LocalWork()

    def getBackendName(self):
        return "pybackend"


def create(store, rank, world_size, timeout):
    return PythonPG(rank, world_size)


dist.Backend.register_backend("pybackend", create, devices=["cpu"])
where = sys.argv[1] if len(sys.argv) > 1 else "new_group"
x = torch.ones(4)
if where == "default":
    dist.init_process_group("pybackend")
    dist.all_reduce(x)
    dist.barrier()
    gloo = dist.new_group(backend="gloo")
    dist.all_reduce(x, group=gloo)
else:
    dist.init_process_group("gloo")
    py = dist.new_group(backend="pybackend")
    dist.all_reduce(x, group=py)
    dist.all_reduce(x)
    dist.barrier(group=py)
    dist.barrier()
print("RESULT", float(x.sum()))
gloo = py = None   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
dist.destroy_process_group()
