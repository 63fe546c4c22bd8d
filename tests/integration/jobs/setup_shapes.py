"""Hangs that are not collectives: group creation, the rendezvous, a store wait.

    SHAPE=<shape> python setup_shapes.py      (ranks started as torchrun starts them)

member_skips     the last rank, gone to serve, never makes the group its peers make with it
nonmember_skips  rank 1, not a member, skips new_group([0]); then both make new_group([0, 1])
order            rank 0 makes groups A then B, rank 1 makes B then A
no_init          rank 1 is stuck loading data before init_process_group
mesh_subset      rank 0 alone makes a DeviceMesh of itself; then both make new_group([0, 1])
store_get        rank 0 waits for a key of the job's store nobody sets; rank 1 goes on to a barrier
slow_start       healthy: the last rank joins late and makes the job's group late (SLOW_S, under the
                 stall threshold); then the others make a group of their own with use_local_synchronization
local_then_world rank 0 makes new_group([0], use_local_synchronization=True); then both make
                 new_group([0, 1]): healthy where torch does not count the local group in the next
                 one's name (before 2.14), a hang where it does
"""
import os
import time

shape = os.environ["SHAPE"]
slow_s = float(os.environ.get("SLOW_S", "0"))
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])


def load_data():
    while True:
        time.sleep(0.1)  # op: loading


if shape == "no_init" and rank == 1:
    load_data()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if shape == "slow_start" and rank == world - 1:
    time.sleep(slow_s)  # op: late_start

dist.init_process_group("gloo")  # op: init
print("READY", flush=True)


def serve():
    while True:
        time.sleep(0.1)  # op: serving


def local_group(ranks):
    """new_group(ranks, use_local_synchronization=True), saying whether torch counted it in the
    names of the groups made after it (torch 2.14 on: then every rank must make one here)."""
    before = dist.distributed_c10d._world.group_count
    group = dist.new_group(ranks, use_local_synchronization=True)
    print(f"COUNTED {dist.distributed_c10d._world.group_count != before}", flush=True)
    return group


def make_groups():
    return dist.new_group(list(range(world)))  # op: make_world_group


if shape == "member_skips":
    if rank == world - 1:
        serve()
    g = make_groups()
elif shape == "nonmember_skips":
    if rank == 0:
        solo = dist.new_group([0])  # op: solo
    pair = dist.new_group([0, 1])  # op: pair
elif shape == "order":
    if rank == 0:
        a = dist.new_group([0, 1])  # op: a_first
        b = dist.new_group([0])  # op: b_second
    else:
        b = dist.new_group([0])  # op: b_first
        a = dist.new_group([0, 1])  # op: a_second
elif shape == "mesh_subset":
    if rank == 0:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh("cpu", [0])  # op: mesh
    pair = dist.new_group([0, 1])  # op: pair_after_mesh
elif shape == "store_get":
    if rank == 0:
        store = dist.distributed_c10d._get_default_store()
        store.get("weights_ready")  # op: store_get
    dist.barrier()  # op: barrier_after
elif shape == "slow_start":
    if rank == world - 1:
        time.sleep(slow_s)  # op: late_group
    g = dist.new_group(list(range(world)))  # op: world_group
    for _ in range(3):
        dist.all_reduce(torch.ones(4), group=g)
    if rank < world - 1:   # the last rank, no member, has no part in it
        own = local_group(list(range(world - 1)))  # op: local_group
        dist.all_reduce(torch.ones(2), group=own)
    dist.barrier()
    print("DONE", flush=True)
elif shape == "local_then_world":
    if rank == 0:
        own = local_group([0])  # op: local_first
    g = dist.new_group(list(range(world)))  # op: world_after_local
    dist.all_reduce(torch.ones(4), group=g)
    print("DONE", flush=True)
else:
    raise SystemExit(f"unknown shape {shape}")
dist.destroy_process_group()
