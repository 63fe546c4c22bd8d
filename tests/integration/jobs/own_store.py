"""A job that makes its own store, as PyTorch's own c10d tests do, while MASTER_ADDR/MASTER_PORT
in its environment are another test's, long gone: STEPS all_reduces, SLEEP_S apart, then its result.

    python own_store.py tcp PORT WORLD   (a client of the TCPStore the test hosts on PORT)
    python own_store.py file PATH WORLD  (a FileStore at PATH)
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

kind, where, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank = int(os.environ["RANK"])
if kind == "tcp":
    store = dist.TCPStore("127.0.0.1", int(where), world, is_master=False, timeout=timedelta(seconds=60))
else:
    store = dist.FileStore(where, world)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
steps, pause = int(os.environ.get("STEPS", "40")), float(os.environ.get("SLEEP_S", "0.2"))
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
