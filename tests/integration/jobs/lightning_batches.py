"""A tiny PyTorch Lightning job on 2 gloo ranks (torchrun) whose data is split by Lightning
(`healthy`: it gives the user's loader a DistributedSampler) or not (`own_loader`: the user's own
loader passed in with use_distributed_sampler=False, so every rank reads the same batches).

    torchrun --standalone --nproc-per-node 2 lightning_batches.py SCENARIO
"""
import gc
import sys

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy

scenario = sys.argv[1]


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)  # op: lit_loader
trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=DDPStrategy(process_group_backend="gloo"),
                    max_steps=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, use_distributed_sampler=scenario != "own_loader")
trainer.fit(Model(), loader)
print("DONE", flush=True)
del trainer   # nothing of ours may hold a group past its destruction (gloo aborts at exit)
gc.collect()  # Lightning's objects refer to each other
torch.distributed.destroy_process_group()
