"""The job identity: the same on every rank of one job (read from the job's own store), different
between jobs that share a launcher and a run id."""
from __future__ import annotations

import torch.distributed as dist

from colltrace import identity, trace


def test_jobs_with_their_own_stores_differ_and_ranks_of_one_job_agree(tmp_path):
    env = {"TORCHELASTIC_RUN_ID": "none"}        # torchrun without --standalone, every job
    a, b = dist.FileStore(str(tmp_path / "a"), 2), dist.FileStore(str(tmp_path / "b"), 2)
    same_job = dist.FileStore(str(tmp_path / "a"), 2)
    ja = identity.job_id(dist.PrefixStore("default_pg", a), env)
    assert ja == identity.job_id(dist.PrefixStore("default_pg", same_job), env)
    assert ja != identity.job_id(dist.PrefixStore("default_pg", b), env)
    assert identity.shared(ja) == f"none@file:{tmp_path / 'a'}"


def test_a_tcp_store_is_named_by_its_address():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    run = {"TORCHELASTIC_RUN_ID": "abc"}
    assert identity.job_id(dist.PrefixStore("default_pg", server), run) == f"abc@tcp:127.0.0.1:{server.port}"


def test_a_folder_shared_by_hosts_keeps_every_host_of_the_newest_job():
    class T:
        def __init__(self, job, started):
            self.meta, self.error = {"job": job, "started": started}, None

    old = T("none@tcp:h:1#ppid5", 1.0)
    host_a, host_b = T("none@tcp:h:2#ppid7", 5.0), T("none@tcp:h:2#ppid9", 6.0)
    assert trace._newest_job([old, host_a, host_b]) == [host_a, host_b]
