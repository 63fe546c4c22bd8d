"""Rank 1 enters a barrier that rank 0 never joins, then dies there: by SIGSEGV (a real segfault
from a helper thread, while the main thread waits inside gloo), by SIGABRT (abort() in native
code, as gloo's collective-mismatch check does) or waits to be SIGKILLed."""
import ctypes
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

how = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(2))
if rank == 1:
    if how == "segv":
        threading.Timer(0.5, lambda: ctypes.string_at(0)).start()
    elif how == "abrt":
        threading.Timer(0.5, os.abort).start()
    print("ENTERING", flush=True)
    dist.barrier()  # op: doomed_barrier
else:
    time.sleep(3600)  # rank 0 never joins: its peer waits in the barrier
