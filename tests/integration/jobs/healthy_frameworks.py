"""Correct use of DDP, FSDP2, DTensor and torch.distributed.checkpoint on gloo: no finding expected.
FSDP2 where torch has it public (`torch.distributed.fsdp.fully_shard`, 2.6+): torch 2.4's private
one makes CUDA streams even for a CPU mesh."""
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh

try:   # public from torch 2.5; torch 2.4 has it under its older name
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
except ImportError:
    from torch.distributed._tensor import Replicate, Shard, distribute_tensor
fully_shard = getattr(torch.distributed.fsdp, "fully_shard", None)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
dist.barrier()   # a traced collective first: what DDP runs next, unseen by the wrappers, is a counted gap


ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(3):
    ddp(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()

mesh = init_device_mesh("cpu", (world,))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
if fully_shard is not None:
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()

d = distribute_tensor(torch.arange(world * 4, dtype=torch.float32).reshape(world, 4), mesh, [Shard(0)])
r = d.redistribute(mesh, [Replicate()]).to_local()
assert r.shape == (world, 4)

ckpt = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt)
state = {"model": model.state_dict()}
dcp.load(state, checkpoint_id=ckpt)
dist.barrier()
print("DONE", flush=True)
del ddp, model, opt, mesh, d, r, state   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
if torch.__version__ < (2, 5):   # TorchVersion compares as a release
    # torch 2.4's ProcessGroupGloo joins its threads holding the GIL, while a thread may still be
    # freeing the barrier's Work, whose dcp all_gather tensors need the GIL: a deadlock untraced too
    # (about 1 run in 10, seen with py-spy --native). Its threads get the time to finish first.
    import time

    time.sleep(1.0)
dist.destroy_process_group()
