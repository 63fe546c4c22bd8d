"""One hang (or crash) per verdict kind, on 4 gloo ranks under torchrun, default timeouts.

    torchrun --standalone --nproc-per-node 4 scenarios.py SCENARIO

Ranks 0-2 form the "train" group; rank 3 plays the teacher, as in a real distillation job.
Each scenario prints READY on every rank just before its faulty step.
"""
import ctypes
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

scenario = sys.argv[1]
# Default timeouts unless PG_TIMEOUT_S is set (benchmarks/detection.py shortens them to show what
# PyTorch alone prints when the timeout finally fires).
kw = {"timeout": timedelta(seconds=float(os.environ["PG_TIMEOUT_S"]))} if os.environ.get("PG_TIMEOUT_S") else {}
dist.init_process_group("gloo", **kw)
rank, world = dist.get_rank(), dist.get_world_size()
train = dist.new_group([0, 1, 2], **kw)
ipc = dist.new_group(list(range(world)), **kw)   # the teacher's group: all ranks, gathers to rank 3
x = torch.ones(4)
dist.all_reduce(x)
dist.barrier()
print("READY", flush=True)


def build_model(seconds):
    """Set-up work: computes (busy, not frozen) for `seconds`."""
    end = time.time() + seconds
    while time.time() < end:
        torch.randn(64, 64) @ torch.randn(64, 64)  # op: late_setup


def evaluate_forever():
    time.sleep(3600)  # op: sleeping


def teacher_gather():
    dist.gather(torch.ones(2), [torch.empty(2) for _ in range(world)] if rank == 3 else None,  # op: teacher_gather
                dst=3, group=ipc)


def save_checkpoint():
    dist.barrier()  # op: ckpt_barrier


if scenario == "mismatch":
    if rank == 3:
        time.sleep(0.5)   # arrives last: the finding then has every rank in place to name
        dist.all_gather([torch.empty(4) for _ in range(world)], x)  # op: odd_op
    else:
        dist.all_reduce(x)  # op: common_op
elif scenario == "root_mismatch":
    dist.broadcast(x, src=1 if rank == 2 else 0)  # op: bcast
elif scenario == "deadlock":
    if rank == 3:
        teacher_gather()
    else:
        save_checkpoint()
elif scenario == "dead_rank":
    if rank == 2:
        time.sleep(0.3)
        ctypes.string_at(0)  # op: segfault
    dist.all_reduce(x)  # op: survivors_wait
elif scenario == "stall":
    if rank == 3:
        evaluate_forever()
    dist.barrier()  # op: stall_barrier
elif scenario == "p2p":
    if rank == 0:
        dist.recv(x, src=1)  # op: lonely_recv
    elif rank == 1:
        evaluate_forever()
elif scenario == "slow_ok":
    if rank == 0:
        time.sleep(float(os.environ.get("SLOW_S", "3")))  # op: slow_eval
    dist.barrier()  # op: slow_barrier
    print("DONE", flush=True)
elif scenario.startswith("late_"):
    # A real job's shape, with its set-up time: one side waits at once while the other builds
    # its model for SETUP_S seconds (past COLLTRACE_STALL_S: first a stall about busy ranks),
    # and only then does what makes the hang certain, or ends it.
    setup_s = float(os.environ.get("SETUP_S", "6"))
    if scenario == "late_dead":
        # ranks 0-2 wait in an all_reduce at once; rank 3 computes, then crashes
        if rank == 3:
            build_model(setup_s)
            ctypes.string_at(0)  # op: late_segfault
        dist.all_reduce(x)  # op: late_survivors
    elif rank == 3:
        if scenario == "late_mismatch":
            dist.all_gather([torch.empty(4) for _ in range(world)], x)  # op: late_odd
        else:   # the teacher waits for its first weights
            dist.broadcast(torch.zeros(4), src=0, group=ipc)  # op: late_teacher_wait
    else:
        build_model(setup_s)
        if scenario == "late_deadlock":
            dist.barrier()  # op: late_barrier
        elif scenario == "late_mismatch":
            dist.all_reduce(x)  # op: late_common
        elif scenario == "late_resolved":
            dist.broadcast(torch.zeros(4), src=0, group=ipc)  # op: late_weights
    print("DONE", flush=True)
elif scenario == "ddp_skip":
    # Rank 3's loss is "not finite": it skips backward and goes on to save, so its barrier meets
    # the others' DDP gradient all-reduce (run in C++, unseen by colltrace's wrappers).
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    loss = model(torch.ones(2, 4)).sum()
    if rank != 3:
        loss.backward()  # op: ddp_backward
    dist.barrier()  # op: skip_barrier
else:
    raise SystemExit(f"unknown scenario {scenario}")
model = train = ipc = None   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
dist.destroy_process_group()
