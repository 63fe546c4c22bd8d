"""The GPU suite's job starter: tests/gpu/jobs/nccl_job.py on NCCL, every rank on the one GPU a
single-GPU machine has (LOCAL_RANK modulo the devices).

NCCL refuses two ranks of one communicator on the same GPU of the same host ("Duplicate GPU
detected"); it tells hosts apart by NCCL_HOSTID, so each rank of a world of 2 is given its own:
the ranks then share the GPU and talk over loopback sockets, as ranks on two hosts would. Not
part of the CPU suite (pyproject's testpaths leave tests/gpu out): `python3 -m pytest tests/gpu`
on a machine with a GPU.
"""
from __future__ import annotations

import pytest

from helpers.gpu import SCRIPT


@pytest.fixture
def nccl_job(gloo_job, tmp_path):
    """start(backend, mode, nprocs=1, env=None, traced=True) -> Job (tests/conftest.py's, killed after)."""

    def start(backend: str, mode: str, nprocs: int = 1, env: dict | None = None, traced: bool = True):
        extra = {"NCCL_SOCKET_IFNAME": "lo",             # the ranks' sockets stay on this machine
                 "TORCH_FR_BUFFER_SIZE": "2000",         # the Flight Recorder on, whatever the default
                 "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                 "FR_OUT": str(tmp_path / f"fr-{backend}-{mode}-{nprocs}")}
        extra.update(env or {})
        return gloo_job(SCRIPT, nprocs, env=extra, args=(backend, mode), traced=traced,
                        rank_env=lambda r: {"NCCL_HOSTID": f"colltrace-gpu-{r}"} if nprocs > 1 else {})

    return start
