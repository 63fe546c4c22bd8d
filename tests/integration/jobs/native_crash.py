"""Rank 1 dies in native code while rank 0 waits for it in a barrier: SIGSEGV in libc (memset on
NULL through ctypes), or SIGSEGV, SIGFPE or an uncaught C++ exception in the small library the
test built (VICTIM_LIB: tests/integration/jobs/victim.cpp); or ("own_handler") it takes a SIGSEGV
its own handler, installed before colltrace's, recovers from, and the job goes on to the end; or
("lock") it hangs in a lock it already holds, in native code (ctypes releases the GIL)."""
import ctypes
import os
import sys

import torch
import torch.distributed as dist

how = sys.argv[1]
lib = ctypes.CDLL(os.environ["VICTIM_LIB"])
if how == "own_handler":
    lib.install_guard()   # before init_process_group, where colltrace installs its handlers


def fused_mlp(kind):
    if kind == "libc":
        ctypes.memset(0, 0, 64)  # op: libc
    elif kind == "segv":
        lib.write_through_null(3)  # op: segv
    elif kind == "fpe":
        lib.divide_by_zero(1)  # op: fpe
    elif kind == "throw":
        lib.throw_uncaught(b"bad shape 7")  # op: throw
    elif kind == "own_handler":
        print("RECOVERED", lib.guarded_fault(), flush=True)  # op: own_handler
    elif kind == "lock":
        lib.take_lock_twice()  # op: lock


dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(2))
if rank == 1:
    fused_mlp(how)
dist.barrier()  # op: barrier
dist.all_reduce(torch.ones(2))
dist.destroy_process_group()
print("DONE", flush=True)
