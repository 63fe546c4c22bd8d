"""Two correct tests built on PyTorch's own MultiProcessTestCase, each with a FileStore of its own,
run in one pytest session whose environment still holds an earlier test's MASTER_ADDR/MASTER_PORT
(a port nobody listens on any more), as PyTorch's c10d test suites leave them."""
import time

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase


class StaleEnvTest(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _sum(self, steps):
        dist.init_process_group("gloo", store=dist.FileStore(self.file_name, self.world_size), rank=self.rank,
                                world_size=self.world_size)
        total = 0.0
        for i in range(steps):   # long enough for a watchdog to try (and give up on) a store
            x = torch.full((4,), float(i))
            dist.all_reduce(x)
            total += float(x.sum())
            time.sleep(0.1)
        dist.barrier()
        dist.destroy_process_group()
        assert total == 2 * 4 * sum(range(steps))

    def test_1_sum(self):
        self._sum(80)

    def test_2_sum(self):
        self._sum(80)
