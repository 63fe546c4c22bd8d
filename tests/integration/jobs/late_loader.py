"""A training loop whose data loading is slow on one rank (LATE_RANK, or every rank with
LATE_RANK=all): it sleeps LOAD_S in load_batch before each all_reduce, STEPS times.

    python late_loader.py   (as a rank: RANK, WORLD_SIZE, MASTER_ADDR/PORT set)
"""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
steps, load_s, late = (int(os.environ.get("STEPS", "150")), float(os.environ.get("LOAD_S", "0.04")),
                       os.environ.get("LATE_RANK", "2"))


def load_batch(step):
    if late == "all" or str(rank) == late:
        time.sleep(load_s)   # a slow disk under this rank's loader
    return torch.full((8,), float(step))


for step in range(steps):
    batch = load_batch(step)
    dist.all_reduce(batch)  # op: grad_sync
dist.barrier()
dist.destroy_process_group()
