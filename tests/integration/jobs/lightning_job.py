"""A tiny PyTorch Lightning job on 2 gloo ranks (torchrun), healthy or with a hang bug of the
user's own in their LightningModule. `# op:` comments mark the lines a verdict must name.

    torchrun --standalone --nproc-per-node 2 lightning_job.py SCENARIO OUT
"""
import gc
import hashlib
import sys

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy

scenario, out = sys.argv[1], sys.argv[2]
STEPS = 4


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if scenario == "barrier_on_rank0" and self.global_rank == 0 and batch_idx == 2:
            self.trainer.strategy.barrier()  # op: lit_barrier
        if scenario == "gather_on_rank0" and batch_idx == 2 and self.global_rank == 0:
            self.all_gather(loss.detach())  # op: lit_gather
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
model = Model()
trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=DDPStrategy(process_group_backend="gloo"),
                    max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model, loader)
if trainer.global_rank == 0:
    with open(out, "w") as f:
        f.write(hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
print("DONE", flush=True)
del trainer, model   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
gc.collect()         # Lightning's objects refer to each other
torch.distributed.destroy_process_group()
