"""Groups made every way torch offers, FSDP2 and torch.compile, on 4 gloo ranks."""
import json

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
dist.all_reduce(torch.ones(1), group=mesh.get_group("dp"))  # op: mesh_dp
dist.all_reduce(torch.ones(1), group=mesh.get_group("tp"))  # op: mesh_tp
sub, _ = dist.new_subgroups(group_size=2)
dist.barrier(group=sub)  # op: subgroup
# split_group needs a device bound to the default group (NCCL): not available on CPU/gloo.


# A group of two backends, as init_process_group() makes on a GPU machine ("cpu:gloo,cuda:nccl"),
# with a second gloo registered for CUDA tensors in NCCL's place: each backend counts its own ops.
def _side_gloo(store, group_rank, group_size, timeout):
    return dist.ProcessGroupGloo(dist.PrefixStore("side", store), group_rank, group_size, timeout=timeout)


dist.Backend.register_backend("sidegloo", _side_gloo, devices=["cuda"])
mixed = dist.new_group(backend="cpu:gloo,cuda:sidegloo")
dist.all_reduce(torch.ones(1), group=mixed)  # op: mixed_reduce
dist.all_gather_object([None] * dist.get_world_size(), rank, group=mixed)  # op: mixed_objects
dist.barrier(group=mixed)  # op: mixed_barrier
mixed_seq = {t: mixed._get_backend(torch.device(t))._get_sequence_number_for_group() for t in ("cpu", "cuda")}

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(4, 8)).pow(2).mean()  # op: fsdp_forward
    loss.backward()
    opt.step()
    opt.zero_grad()


@torch.compile(backend="eager")
def compiled(x):
    return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1


y = compiled(torch.ones(4))  # op: compiled
dist.all_reduce(torch.ones(1))  # op: after_compile
groups = {name: {"ranks": dist.get_process_group_ranks(pg), "seq": pg._get_sequence_number_for_group()}
          for name, pg in (("dp", mesh.get_group("dp")), ("tp", mesh.get_group("tp")), ("sub", sub),
                           ("world", dist.group.WORLD))}
names = {k: str(pg.group_name) for k, pg in (("dp", mesh.get_group("dp")), ("tp", mesh.get_group("tp")),
                                              ("sub", sub), ("world", dist.group.WORLD))}
names["mixed"] = str(mixed.group_name)
print("COUNTS " + json.dumps({"rank": rank, "groups": groups, "names": names, "compiled": y.tolist(),
                             "mixed": mixed_seq}))
del model, opt, loss, mesh, sub, mixed   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
torch._dynamo.reset()   # nor the compiled function's guards
dist.destroy_process_group()
