"""The failure switches: each reproduces a mistake of a real distillation job, where its code had it.

    torchrun --nproc-per-node 4 train.py --bug checkpoint_barrier

Default: no bug. The code that a switch changes is marked `# bug: NAME` at the faulty line.
"""
from __future__ import annotations

SWITCHES = {
    "checkpoint_barrier": "CheckpointManager syncs its new folder with dist.barrier() on the default group, "
                          "which the teacher never joins (checkpoint.py)",
    "probe_barrier": "the probe folder is created behind torch.distributed.barrier() on the default group "
                     "(train.py)",
    "metrics_default_group": "dist_mean_dict averages the metrics with an all_reduce on the default group "
                             "(distributed.py)",
    "teacher_early": "the teacher starts its serving loop before the training ranks finish setup and skips the "
                     "model-ready handshake (train.py)",
    "preempt_one_rank": "the preemption signal reaches rank 0 only and the flag is not agreed on, so rank 0 "
                        "saves alone (train.py)",
    "loader_before_pg": "the data loader is built before the process group, so no DistributedSampler: every rank "
                        "trains on the same data (train.py, data.py)",
    "segfault": "a native kernel crashes with SIGSEGV on rank 1 in the middle of a step (model.py)",
}

_active: set[str] = set()


def enable(name: str) -> None:
    if name not in SWITCHES:
        raise ValueError(f"unknown bug {name!r}; one of: {', '.join(SWITCHES)}")
    _active.add(name)


def on(name: str) -> bool:
    return name in _active
