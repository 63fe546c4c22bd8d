"""colltrace itself fails mid-run (simulated): the program's collectives and results must not change."""
import torch
import torch.distributed as dist

from colltrace.rank import shim

dist.init_process_group("gloo")
x = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(x)


def broken(*a, **k):
    raise RuntimeError("simulated colltrace bug")


shim.recorder.sig_id = broken
for _ in range(3):
    dist.all_reduce(x)
dist.barrier()
print("RESULT", x.tolist(), flush=True)
dist.destroy_process_group()
