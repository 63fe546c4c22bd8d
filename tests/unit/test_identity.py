"""The job identity: the same on every rank of one job (read from the job's own store), different
between jobs that share a launcher and a run id."""
from __future__ import annotations

import torch.distributed as dist

from colltrace.rank import identity
from colltrace.tracefile import reader, ringfile


def test_jobs_with_their_own_stores_differ_and_ranks_of_one_job_agree(tmp_path):
    env = {"TORCHELASTIC_RUN_ID": "none"}        # torchrun without --standalone, every job
    a, b = dist.FileStore(str(tmp_path / "a"), 2), dist.FileStore(str(tmp_path / "b"), 2)
    same_job = dist.FileStore(str(tmp_path / "a"), 2)
    ja = identity.job_id(dist.PrefixStore("default_pg", a), env)
    assert ja == identity.job_id(dist.PrefixStore("default_pg", same_job), env)
    assert ja != identity.job_id(dist.PrefixStore("default_pg", b), env)
    assert ringfile.shared_job(ja) == f"none@file:{tmp_path / 'a'}"


def test_a_tcp_store_is_named_by_its_address():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    run = {"TORCHELASTIC_RUN_ID": "abc"}
    assert identity.job_id(dist.PrefixStore("default_pg", server), run) == f"abc@tcp:127.0.0.1:{server.port}"


def test_the_watchdog_is_told_the_store_the_default_group_was_made_with(tmp_path):
    """Not MASTER_ADDR/MASTER_PORT: in a test session they may be an earlier test's."""
    from colltrace.rank import launcher

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    assert launcher.store_arg(dist.PrefixStore("default_pg", server)) == ["--store", f"127.0.0.1:{server.port}"]
    assert (launcher.store_arg(dist.PrefixStore("default_pg", dist.FileStore(str(tmp_path / "f"), 1)))
            == ["--store", "off"])
    assert launcher.store_arg(dist.HashStore()) == ["--store", "off"]
    assert launcher.store_arg(None) == []   # not found: the watchdog decides as before
    assert launcher.watchdog_env({"COLLTRACE": "1", "TORCH_CPP_LOG_LEVEL": "INFO"})["TORCH_CPP_LOG_LEVEL"] == "FATAL"


def test_a_folder_shared_by_hosts_keeps_every_host_of_the_newest_job():
    class T:
        def __init__(self, job, started):
            self.meta, self.error = {"job": job, "started": started}, None

    old = T("none@tcp:h:1#ppid5", 1.0)
    host_a, host_b = T("none@tcp:h:2#ppid7", 5.0), T("none@tcp:h:2#ppid9", 6.0)
    assert reader._newest_job([old, host_a, host_b]) == [host_a, host_b]


def test_a_watchdog_never_reads_a_later_job_in_its_folder_as_its_own(tmp_path):
    from colltrace import config
    from colltrace.host.nodeview import NodeView
    from colltrace.rank.recorder import Recorder

    settings = config.load({"COLLTRACE": "1", "COLLTRACE_DIR": str(tmp_path), "COLLTRACE_POLL_S": "0.02"})
    first = Recorder(settings, rank=0, world_size=1, backend="gloo", job="test-1@file:/a")
    old, new = (NodeView(str(tmp_path), "test-1@file:/a", settings.host),
                NodeView(str(tmp_path), "test-2@file:/b", settings.host))
    old.poll()
    new.poll()        # started while the folder still holds the previous test's rank 0
    assert list(old.traces) == [0] and not new.traces
    first.close()
    second = Recorder(settings, rank=0, world_size=1, backend="gloo", job="test-2@file:/b")
    old.poll()
    new.poll()
    assert not old.traces and old.all_gone()      # its rank is gone: it ends, reading nothing of test 2
    assert list(new.traces) == [0] and new.traces[0].meta["job"] == "test-2@file:/b"
    second.close()
