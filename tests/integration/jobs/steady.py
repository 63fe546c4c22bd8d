"""A healthy job: STEPS all_reduces, SLEEP_S apart, then its result (the same with or without
colltrace, whatever happens to colltrace's store).

    python steady.py   (as a rank: RANK, WORLD_SIZE, MASTER_ADDR/PORT set)
"""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
steps, pause = int(os.environ.get("STEPS", "150")), float(os.environ.get("SLEEP_S", "0.02"))
x = torch.ones(8)
total = 0.0
for i in range(steps):
    y = x * (i + 1)
    dist.all_reduce(y)
    total += float(y.sum())
    time.sleep(pause)
dist.barrier()
print("RESULT", total, flush=True)
dist.destroy_process_group()
