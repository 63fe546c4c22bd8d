"""The job's TCPStore as the watchdogs' meeting point, for real: two "hosts" (separate trace
folders, separate watchdogs) give one verdict; a store that cannot be reached, or dies while
the job runs, costs one warning and nothing else."""
from __future__ import annotations

import json
import os
import time

import pytest

from colltrace.host.meeting import LEADER_KEY
from helpers.jobs import findings, frames_line, loc

pytestmark = pytest.mark.slow


def test_two_hosts_one_verdict_through_the_store(gloo_job, tmp_path):
    """Ranks 0-1 on host "a", ranks 2-3 on host "b", each host with its own folder (no shared
    file system) and its own watchdog. Host b's ranks reach the leader (host a, which holds rank
    0) only through the store; the leader names the cross-host deadlock and its abort reaches
    host b's ranks through the store too."""
    dirs = {h: str(tmp_path / h) for h in "ab"}
    job = gloo_job("scenarios.py", 4, args=["deadlock"],
                   env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "60"},
                   rank_env=lambda r: {"COLLTRACE_HOST": "ab"[r // 2], "COLLTRACE_DIR": dirs["ab"[r // 2]],
                                       "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": str(r % 2)})
    codes = job.wait(120)
    assert all(c != 0 for c in codes), codes           # every rank ended by the abort, none left hanging
    (f,) = findings(dirs["a"])
    assert f["kind"] == "deadlock" and findings(dirs["b"]) == []
    r = f["ranks"]
    assert r["2"]["host"] == "b" and r["3"]["host"] == "b" and r["0"]["host"] == "a"
    assert r["2"]["op"] == "barrier" and r["3"]["op"] == "gather"
    assert loc("ckpt_barrier") in frames_line(r["2"]) and loc("teacher_gather") in frames_line(r["3"])
    # host b acted on the leader's verdict: it recorded why, ended its ranks, and wrote a stacks
    # file for each (py-spy's dump, or, where the ranks were already failing as host a's were
    # ended, a note: the stacks at the hang are in the finding above, which names their lines)
    with open(os.path.join(dirs["b"], "ended-b.json")) as e:
        record = json.load(e)
    assert record["why"] == "deadlock" and set(record["ranks"]) <= {"2", "3"}   # those still alive then
    for rank in record["ranks"]:
        assert os.path.getsize(os.path.join(dirs["b"], f"rank-0000{rank}.stacks.txt")) > 0


def test_an_unreachable_store_costs_one_warning_and_the_host_is_still_watched(gloo_job, tmp_path, monkeypatch):
    import io
    import threading

    from colltrace import config

    # The watchdog alone: c10d gives up connecting after its timeout (5 s; 1 s here); retried, it says so once.
    from colltrace.host import leader, storelink, watchdog

    connect = storelink.connect
    monkeypatch.setattr(storelink, "connect", lambda host, port, timeout_s: connect(host, port, 1.0))
    monkeypatch.setattr(leader, "STORE_RETRY_S", 0.1)
    stream, stop = io.StringIO(), threading.Event()
    wd = watchdog.Watchdog(str(tmp_path), None, None, config.load({}), stream=stream, store_address=("127.0.0.1", 1))
    thread = threading.Thread(target=wd.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while time.time() < deadline and wd.exchange.next_try == 0.0:
        time.sleep(0.1)
    first_failure = wd.exchange.next_try
    while time.time() < deadline and wd.exchange.next_try == first_failure:   # a second attempt fails too
        time.sleep(0.1)
    stop.set()
    thread.join(30)
    lines = [line for line in stream.getvalue().splitlines() if "cannot reach" in line]
    assert first_failure and len(lines) == 1 and lines[0].startswith("colltrace: warning:"), stream.getvalue()
    assert "still watched" in lines[0]
    # In a job: this host's ranks are judged all the same, the deadlock named.
    job = gloo_job("scenarios.py", 4, args=["deadlock"],
                   env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STORE": "127.0.0.1:1"})
    assert all(c != 0 for c in job.wait(120))
    (f,) = findings(job.dir)
    assert f["kind"] == "deadlock"
    err = "".join(job.stderr(r) for r in range(4))
    assert err.count("cannot reach") <= 1


def test_the_store_dying_mid_run_changes_nothing_for_the_job(gloo_job):
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"COLLTRACE_STORE": f"127.0.0.1:{store.port}", "STEPS": "150", "SLEEP_S": "0.02"}
    plain = gloo_job("steady.py", 2, env=env, traced=False)
    expected = [plain.stdout(r) for r in range(2)] if plain.wait(120) == [0, 0] else None
    job = gloo_job("steady.py", 2, env=env)
    deadline = time.time() + 60   # the watchdog has met the store: it announced its own server there
    while not store.check([LEADER_KEY]):
        assert time.time() < deadline, "the watchdog never announced its server in the job's store"
        time.sleep(0.05)
    del store                 # the store's server goes away mid-run
    assert job.wait(120) == [0, 0]
    assert [job.stdout(r) for r in range(2)] == expected
    err = job.stderr(0) + job.stderr(1)
    assert err.count("colltrace: warning:") <= 1 and "Traceback" not in err, err
    assert findings(job.dir) == []


def test_the_jobs_store_is_left_as_untraced_and_nothing_is_said(gloo_job, tmp_path):
    """A healthy two-host job: colltrace's one key in the job's store (the leader's address) is
    gone when the job ends, so the user's own client sees the keys an untraced run leaves; and
    nothing of colltrace's appears in the ranks' output (no "Broken pipe" at exit)."""
    import psutil

    def start(traced):
        dirs = {h: str(tmp_path / f"{traced}-{h}") for h in "ab"}
        job = gloo_job("scenarios.py", 4, args=["slow_ok"], traced=traced, env={"SLOW_S": "5"},
                       rank_env=lambda r: {"COLLTRACE_HOST": "ab"[r // 2], "COLLTRACE_DIR": dirs["ab"[r // 2]],
                                           "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": str(r % 2)})
        return job, dirs

    def run(job, dirs):
        assert job.wait(120) == [0, 0, 0, 0]
        deadline = time.time() + 30   # the watchdogs end after their ranks: wait for them
        while time.time() < deadline and any("colltrace.host" in (p.info["cmdline"] or [])
                                             and any(d in (p.info["cmdline"] or []) for d in dirs.values())
                                             for p in psutil.process_iter(["cmdline"])):
            time.sleep(0.2)
        out = [job.stdout(r) + job.stderr(r) for r in range(4)]
        return job.store.num_keys(), sorted(job.store.list_keys()), out

    jobs = [start(False), start(True)]   # side by side: each has its own store
    untraced, traced = run(*jobs[0]), run(*jobs[1])
    assert traced[:2] == untraced[:2]
    lines = [line for text in traced[2] for line in text.splitlines()
             if "colltrace" in line.lower() or "pipe" in line.lower()]
    assert lines == []
    assert all(text.count("DONE") == 1 for text in traced[2])
