"""Collectives behind decorators: the user's own (user_decorators.py, beside it) and an installed
framework's (tinyfw, which the test puts in a site-packages folder). Rank 0 saves in a function
of its own that its timing decorator and the framework's rank-zero decorator wrap, and waits in
a barrier; rank 1 trains on through the framework's engine, whose step an nvtx-style decorator
wraps, and waits in an all_reduce on the framework's own group, made without a description.

    python decorated.py   (as a rank: RANK, WORLD_SIZE, MASTER_ADDR/PORT set; tinyfw importable)
"""
import tinyfw
import torch
import torch.distributed as dist
from user_decorators import timed

dist.init_process_group("gloo")
engine = tinyfw.Engine()


@tinyfw.on_rank_zero
@timed
def save():
    dist.barrier()  # op: deco_barrier


def main():
    for _ in range(3):
        engine.step(torch.ones(4))  # op: deco_step
    save()  # op: deco_save
    engine.step(torch.ones(4))  # op: deco_step_after


main()
