"""A hang whose user frames carry HTML: the dashboard must show these names as text.

Rank 0 waits in a barrier called from a function named `<script>window.__pwned=1</script>`,
compiled as if from a file named `<img src=x onerror=window.__pwned=2>.py`; rank 1 never comes
(it sleeps in ordinary code), so after COLLTRACE_STALL_S the watchdog reports a stall naming them.
"""
import time

import torch
import torch.distributed as dist

EVIL_FUNC = "<script>window.__pwned=1</script>"
EVIL_FILE = "<img src=x onerror=window.__pwned=2>.py"

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(1))

namespace = {"dist": dist}
exec(compile("def save():\n    dist.barrier()\n", EVIL_FILE, "exec"), namespace)
save = namespace["save"]
save.__code__ = save.__code__.replace(co_name=EVIL_FUNC)
print("READY", flush=True)
if rank == 0:
    save()
else:
    time.sleep(3600)
