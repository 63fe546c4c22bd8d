"""Process groups and the traffic between the training ranks and the teacher (lingua's
distributed.py in miniature).

The last rank serves the teacher; the others train, data parallel over their own group. Each
step the training ranks gather their token batches to the teacher over the `ipc` group (every
rank), the teacher runs its forward pass and scatters the logits back.
"""
from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist

import bugs

logger = logging.getLogger("distill")
STOP = -1   # a batch of STOP tokens tells the teacher that training is over


@dataclass
class InterProcessComm:
    rank: int
    world_size: int
    teacher_rank: int
    training_ranks: list
    train_group: object     # the training ranks only: DDP, checkpoints, metrics
    ipc_group: object       # every rank: batches to the teacher, logits back

    @property
    def is_training(self) -> bool:
        return self.rank != self.teacher_rank

    @property
    def train_rank(self) -> int:
        return self.training_ranks.index(self.rank) if self.is_training else -1

    @property
    def is_master(self) -> bool:
        return self.rank == self.training_ranks[0]

    # -- the teacher handshake -------------------------------------------------------------
    def sync_model_loaded(self) -> None:
        """The teacher says its model is ready; the training ranks wait for it."""
        ready = torch.ones(1)
        dist.broadcast(ready, src=self.teacher_rank, group=self.ipc_group)

    # -- per step ---------------------------------------------------------------------------
    def gather_batch_to_teacher(self, tokens: torch.Tensor) -> list | None:
        """Training ranks send their [B, T] token batch; the teacher gets one per training rank."""
        if self.is_training:
            dist.gather(tokens, None, dst=self.teacher_rank, group=self.ipc_group)
            return None
        parts = [torch.empty_like(tokens) for _ in range(self.world_size)]
        dist.gather(tokens, parts, dst=self.teacher_rank, group=self.ipc_group)
        return [parts[r] for r in self.training_ranks]

    def scatter_logits_from_teacher(self, out: torch.Tensor, logits: list | None = None) -> torch.Tensor:
        """The teacher sends each training rank the logits of its own batch."""
        if self.is_training:
            dist.scatter(out, None, src=self.teacher_rank, group=self.ipc_group)
            return out
        parts = [None] * self.world_size
        for r, x in zip(self.training_ranks, logits, strict=False):
            parts[r] = x.contiguous()
        parts[self.teacher_rank] = out
        dist.scatter(out, parts, src=self.teacher_rank, group=self.ipc_group)
        return out

    def send_stop(self, shape) -> None:
        """Training is over (or preempted): one last gather of STOP tokens ends the teacher's loop."""
        self.gather_batch_to_teacher(torch.full(shape, STOP, dtype=torch.long))


def setup_torch_distributed() -> InterProcessComm:
    dist.init_process_group("gloo")   # default timeouts: a hang waits 30 minutes on gloo
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise SystemExit("distill needs at least 2 ranks: N-1 training ranks and 1 teacher")
    teacher = world - 1
    training = list(range(teacher))
    train_group = dist.new_group(training, group_desc="train")
    ipc_group = dist.new_group(list(range(world)), group_desc="ipc")
    return InterProcessComm(rank, world, teacher, training, train_group, ipc_group)


def dist_mean_dict(metrics: dict, ipc: InterProcessComm) -> dict:
    """Average scalar metrics over the training ranks (gloo has no AVG: sum, then divide)."""
    values = torch.tensor([float(v) for v in metrics.values()])
    group = None if bugs.on("metrics_default_group") else ipc.train_group
    dist.all_reduce(values, group=group)  # bug: metrics_default_group
    return {k: v / len(ipc.training_ranks) for k, v in zip(metrics, values.tolist(), strict=True)}


def agree_on_flag(flag: bool, ipc: InterProcessComm) -> bool:
    """True on every training rank as soon as one of them has the flag up."""
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ipc.train_group)
    return bool(t.item())


def init_signal_handler(callback) -> None:
    """SLURM sends SIGUSR2 some time before preemption (lingua's init_signal_handler)."""
    signal.signal(signal.SIGUSR2, lambda signum, frame: callback())
