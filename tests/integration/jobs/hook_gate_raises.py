"""The gates behind colltrace's c10d hooks raise (something inside colltrace broke): with the C++
hooks (`colltrace build-hooks`) the error stops at the hook, is said once, and every collective
gives what it gives untraced. Collectives are issued on the group object, where only the hooks see
them, and through the wrappers."""
import torch
import torch.distributed as dist

try:
    from colltrace.rank import fastpath

    def raising_gates(*args, **kwargs):
        def gate(hook_args):
            raise RuntimeError("injected: the gate broke")
        return gate, gate

    fastpath.hook_gates = raising_gates   # before the group exists: its hooks get these gates
except ImportError:   # untraced
    pass

dist.init_process_group("gloo")
pg = dist.group.WORLD
x = torch.ones(4) * (dist.get_rank() + 1)
for _ in range(3):
    pg.allreduce([x]).wait()
    dist.all_reduce(x)
pg.barrier().wait()
print("RESULT", x.tolist(), flush=True)
del pg   # a group kept alive past its destruction makes gloo abort at exit
dist.destroy_process_group()
