"""Three tests built on PyTorch's own MultiProcessTestCase (a FileStore per test, no MASTER_PORT),
run in one pytest session: two correct ones, then one where rank 1 never reaches the barrier."""
import time

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase


class SessionTest(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)

    def _sum(self):
        self._init()
        x = torch.ones(4)
        dist.all_reduce(x)
        dist.barrier()
        dist.destroy_process_group()
        assert float(x.sum()) == 8.0

    def test_1_sum(self):
        self._sum()

    def test_2_sum(self):
        self._sum()

    def test_3_rank1_skips_the_barrier(self):
        self._init()
        x = torch.ones(4)
        dist.all_reduce(x)
        if self.rank == 0:
            dist.barrier()
        else:
            time.sleep(3600)
