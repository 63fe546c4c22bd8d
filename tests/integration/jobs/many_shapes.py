"""A correct job whose every step has a new tensor shape: each step is a new signature for the
tracer to define, so its definitions file keeps growing (until a full disk stops it)."""
import sys

import torch
import torch.distributed as dist

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
dist.init_process_group("gloo")
total = 0.0
for i in range(steps):
    x = torch.full((i % 997 + 1,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    total += float(x.sum())
dist.barrier()
print("RESULT", total)
dist.destroy_process_group()
