"""Ranks 1, 2, ... end themselves in load_shard, each the way argv[1] names for it (a comma-separated
list, rank 1's first), after all_reduce #1, while rank 0 goes on into all_reduce #2: gloo fails it
once a peer's process is gone ("Connection closed by peer"), or, where it does not notice (4 ranks),
after the group's timeout, made short once every rank is in. main() runs under torch's launcher
wrapper (@record), which passes a SystemExit on."""
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def load_shard(how):
    if how == "sys_exit":
        sys.exit(3)  # op: end_sys_exit
    if how == "exit":
        exit(5)  # op: end_exit
    if how == "quit":
        quit(7)  # op: end_quit
    if how == "raise":
        raise SystemExit(6)  # op: end_raise
    if how == "os_exit":
        os._exit(4)  # op: end_os_exit
    if how == "error":
        raise ValueError("no shard for this rank")  # op: end_error
    if how == "interrupt":
        # Ctrl-C as Python takes it, even run from a shell that ignores SIGINT (a background job)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.raise_signal(signal.SIGINT)  # op: end_interrupt
    return how != "return"   # return: the program ends early


@record
def main():
    ways = sys.argv[1].split(",")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(2))
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=1))
    if rank and not load_shard(ways[rank - 1]):
        return
    dist.all_reduce(torch.ones(2))  # op: waits


if __name__ == "__main__":
    main()
