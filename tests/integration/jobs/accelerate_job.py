"""A tiny HF accelerate training script on 2 gloo ranks (torchrun), healthy or with a hang bug
of the user's own. `# op:` comments mark the lines a verdict must name.

    torchrun --standalone --nproc-per-node 2 accelerate_job.py SCENARIO OUT
"""
import hashlib
import sys

import torch
from accelerate import Accelerator

scenario, out = sys.argv[1], sys.argv[2]


def log_metrics(accelerator, loss):
    if accelerator.is_main_process:
        return accelerator.gather(loss.detach()[None])  # op: acc_gather
    return None


def main():
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        if scenario == "wait_on_main" and step == 2 and accelerator.is_main_process:
            accelerator.wait_for_everyone()  # op: acc_wait
        if scenario == "gather_on_main" and step == 2:
            log_metrics(accelerator, loss)  # op: acc_log
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        params = accelerator.unwrap_model(model).parameters()
        with open(out, "w") as f:
            f.write(hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in params)).hexdigest())
    print("DONE", flush=True)
    del model, opt, loss   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
    accelerator.end_training()     # destroys the process group


main()
