"""A small DDP or FSDP2 training job on gloo, its data split right or wrong (duplicate_data).

    dp_batches.py WRAP MODE [STEPS] [opaque]
WRAP: ddp | fsdp
MODE: no_sampler    the DataLoader is built before init_process_group, shuffled with one seed:
                    every rank reads the same batches (the mistake)
      sampler       built after init_process_group with a DistributedSampler (correct)
      eval          correct training, then every rank evaluates the same validation batches
                    (under torch.no_grad() and model.eval()) and trains on one shared batch
                    under no_grad only for its loss
      broadcast     correct training after rank 0's weights are broadcast to every rank
      frozen        correct training with the first layer frozen (no gradient on it)
      zeros         every rank feeds all-zero inputs (padding) while its labels differ
      synthetic     no DataLoader: torch.randn from one seed on every rank (a smoke test)
opaque: the model is fed a tensor subclass colltrace does not read (as it does not read GPU
tensors): only the batch the DataLoader gave, on the CPU, can tell the ranks apart.
CT_BREAK_BATCHES=1: colltrace's batch sampling fails (simulated).
Prints "done: N steps" and the final loss.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

wrap, mode = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 12
opaque = sys.argv[4:] == ["opaque"]


class Opaque(torch.Tensor):
    """Stands for a batch colltrace cannot read where the model gets it (a CUDA tensor)."""
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
if mode == "no_sampler":
    order = torch.Generator().manual_seed(1)   # the same shuffle on every rank
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=order)  # op: loader_before
dist.init_process_group("gloo")
rank = dist.get_rank()
if mode != "no_sampler":
    sampler = DistributedSampler(data, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=8, sampler=sampler)  # op: loader_sampler

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
if mode == "frozen":
    for p in model[0].parameters():
        p.requires_grad_(False)
if mode == "broadcast":
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
if wrap == "ddp":
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(model)
else:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
if os.environ.get("CT_BREAK_BATCHES") == "1":   # colltrace's sampling fails (simulated)
    from colltrace.rank import batches

    def broken(*a, **k):
        raise RuntimeError("simulated colltrace bug")

    batches._tensors = broken
opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
loss = None
it = iter(loader)
for step in range(steps):
    if mode == "synthetic":
        x, y = torch.randn(8, 16, generator=torch.Generator().manual_seed(step)), torch.randint(0, 4, (8,))
    else:
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
    if mode == "zeros":
        x = torch.zeros_like(x)
    if opaque:
        x = x.as_subclass(Opaque)
    loss = torch.nn.functional.cross_entropy(model(x), y)  # op: forward
    opt.zero_grad()
    loss.backward()
    opt.step()
if mode == "eval":
    val = torch.randn(8, 16, generator=torch.Generator().manual_seed(7))   # the same on every rank
    model.eval()
    with torch.no_grad():
        for _ in range(6):
            model(val)  # op: validate
    model.train()
    with torch.no_grad():
        for _ in range(6):
            model(val)  # op: no_grad_train_mode
dist.barrier()
print(f"done: {steps} steps, loss {float(loss.detach()):.4f}", flush=True)
del model, opt, loss   # a group DDP holds past destroy_process_group can make gloo abort at exit
dist.destroy_process_group()
