"""A correct job whose rank 1 dies of SIGABRT as its interpreter shuts down, after the program's
last line (as gloo aborts at exit when its threads outlive Python); rank 0 stays a few seconds
longer. Nothing waits for rank 1: colltrace reports it and ends no rank, even with abort."""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
dist.barrier()  # op: last_barrier
dist.destroy_process_group()
print("DONE", flush=True)


class AbortAtShutdown:
    def __del__(self):
        os.abort()   # runs when the interpreter clears this module, after every atexit handler


if rank == 1:
    keep = AbortAtShutdown()
else:
    time.sleep(4)   # still running when rank 1 dies: an abort would end it
