"""A correct little job: a few steps of all_reduce, broadcast and barrier on every rank; with a
second argument `exit`, every rank then ends with sys.exit(0)."""
import sys

import torch
import torch.distributed as dist

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
dist.init_process_group("gloo")
x = torch.ones(16)
for _ in range(steps):
    dist.all_reduce(x)
    dist.broadcast(x, src=0)
dist.barrier()
print("RESULT", float(x.sum()))
dist.destroy_process_group()
if sys.argv[2:] == ["exit"]:
    sys.exit(0)  # op: clean_exit
