"""A tiny HF accelerate job on 2 gloo ranks (torchrun) whose data is split by accelerate
(`healthy`: the loader goes through accelerator.prepare) or not (`own_loader`: the user prepares
the model and optimizer but iterates their own loader, so every rank reads the same batches).

    torchrun --standalone --nproc-per-node 2 accelerate_batches.py SCENARIO
"""
import sys

import torch
from accelerate import Accelerator

scenario = sys.argv[1]
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
shuffle = torch.Generator().manual_seed(1)   # the same order on every rank
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=shuffle)  # op: acc_loader
if scenario == "own_loader":
    model, opt = accelerator.prepare(model, opt)
else:
    model, opt, loader = accelerator.prepare(model, opt, loader)
for _step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)  # op: acc_forward
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
accelerator.wait_for_everyone()
print("DONE", flush=True)
del model, opt, loss   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
accelerator.end_training()   # destroys the process group
