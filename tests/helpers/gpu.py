"""What the GPU suite (tests/gpu) decides at collection: whether a GPU is there, which NCCL
backends this torch has, and the job script."""
from __future__ import annotations

import os

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "gpu", "jobs", "nccl_job.py")


def cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.distributed.is_nccl_available()


def has_backend(name: str) -> bool:
    """nccl2 (torchcomms' engine, what "nccl" resolves to by default on 2.15) and nccl-legacy
    (the ProcessGroupNCCL of torch <= 2.14) exist from torch 2.15 on."""
    if name == "nccl":
        return True
    import torch

    return hasattr(getattr(torch._C, "_distributed_c10d", None), "ProcessGroupNCCL2")


# The backends whose groups colltrace hooks and traces: nccl on every torch, nccl2 and nccl-legacy where they exist.
BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(cuda() and not has_backend(b),
                                                      reason=f"no {b} backend in this torch (torch >= 2.15 has it)"))
            for b in ("nccl", "nccl2", "nccl-legacy")]
