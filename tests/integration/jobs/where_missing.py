"""Rank 0 waits in a barrier; rank 1 is somewhere else instead (2 gloo ranks, default timeouts).

    python where_missing.py SCENARIO     (RANK, WORLD_SIZE, MASTER_* from the environment)

sleep: rank 1 sleeps in Python; regex: it spins in C with the GIL held; busy: it computes for
BUSY_S seconds, then joins; raise: it raises; thread_raise: a thread of it raises while its main
thread waits for that thread's result.
"""
import os
import re
import sys
import threading
import time

import torch.distributed as dist

scenario = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
print("READY", flush=True)


def nap():
    time.sleep(3600)  # op: nap


def spin():
    re.match(r"(a+)+$", "a" * 40 + "b")  # op: spin


def long_eval(seconds):
    end = time.time() + seconds
    total = 0
    while time.time() < end:  # op: eval_loop
        total += sum(i * i for i in range(2000))
    return total


def load_batch(n):
    raise ValueError(f"bad batch {n}")  # op: raise


def prefetch(ready):
    batch = 1 / 0  # noqa: F841  # op: thread_raise
    ready.set()


if rank == 1:
    if scenario == "sleep":
        nap()
    elif scenario == "regex":
        spin()
    elif scenario == "busy":
        long_eval(float(os.environ.get("BUSY_S", "5")))
    elif scenario == "raise":
        time.sleep(0.5)
        load_batch(7)
    elif scenario == "thread_raise":
        ready = threading.Event()
        threading.Thread(target=prefetch, args=(ready,), name="prefetcher").start()
        ready.wait()  # op: wait_batch
dist.barrier()  # op: barrier
print("DONE", flush=True)
dist.destroy_process_group()
