"""Two real hosts: two network namespaces joined by a veth pair, torchrun on each, each host
with its own trace folder (its own disk). The ranks meet over the veth only; so do the
watchdogs (the leader's meeting point, announced in the job's store)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from helpers import environ
from helpers.jobs import findings, frames_line, loc
from helpers.paths import JOBS
from helpers.procs import stacks_of

pytestmark = pytest.mark.slow


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def _can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces"
    return None


@pytest.fixture
def two_hosts():
    """{"a": (namespace, interface, address), "b": ...}; everything removed afterwards, the
    namespaces' processes first."""
    why = _can_make_namespaces()
    if why:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:6]
    hosts = {h: (f"ct{h}-{tag}", f"ct{h}{tag}", f"10.77.0.{i + 1}") for i, h in enumerate("ab")}
    try:
        for ns, _, _ in hosts.values():
            _ip("netns", "add", ns)
        _ip("link", "add", hosts["a"][1], "type", "veth", "peer", "name", hosts["b"][1])
        for ns, dev, addr in hosts.values():
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        _remove(hosts)
        pytest.skip(f"cannot make network namespaces: {exc.stderr.decode(errors='replace').strip()}")
    try:
        yield hosts
    finally:
        _remove(hosts)


def _remove(hosts) -> None:
    for ns, _, _ in hosts.values():
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=20).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)   # takes the veth with it


def _torchrun(hosts, host: str, node_rank: int, directory: str, scenario: str, env: dict, script: str = "scenarios.py"):
    ns, dev, _ = hosts[host]
    e = environ.clean("TORCH_DISTRIBUTED_DEBUG")
    e.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", COLLTRACE="1", COLLTRACE_DIR=directory,
             COLLTRACE_HOST=host, GLOO_SOCKET_IFNAME=dev, **env)
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
           "--node-rank", str(node_rank), "--nproc-per-node", "2", "--master-addr", hosts["a"][2],
           "--master-port", "29517", os.path.join(JOBS, script), *([scenario] if scenario else [])]
    return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _outputs(procs: dict, limit_s: float) -> dict:
    """Each host's (stdout, stderr) once its torchrun ended; past limit_s, the stacks of the
    host's processes, then a kill and a failure."""
    start, outs = time.time(), {}
    for h, p in procs.items():
        try:
            outs[h] = p.communicate(timeout=max(1, limit_s - (time.time() - start)))
        except subprocess.TimeoutExpired:
            stacks = stacks_of([p.pid])
            p.kill()
            outs[h] = p.communicate()
            raise AssertionError(f"host {h}'s torchrun still running after {limit_s:.0f} s:\n"
                                 f"{outs[h][1][-3000:]}\n{stacks}") from None
    return outs


def test_a_hang_across_two_hosts_is_named_by_the_leader_and_abort_ends_both(two_hosts, tmp_path):
    """The cross-group deadlock with ranks 2-3 on host b, default (long) timeouts: the leader
    (host a) names host b's ranks where they wait, and abort ends the ranks of both hosts."""
    dirs = {h: str(tmp_path / h) for h in "ab"}
    env = {"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "60"}
    procs = {h: _torchrun(two_hosts, h, i, dirs[h], "deadlock", env) for i, h in enumerate("ab")}
    outs = _outputs(procs, 150)
    assert procs["a"].returncode != 0 and procs["b"].returncode != 0, outs
    (f,) = findings(dirs["a"])
    assert f["kind"] == "deadlock" and findings(dirs["b"]) == []
    r = f["ranks"]
    assert r["0"]["host"] == "a" and r["2"]["host"] == "b" and r["3"]["host"] == "b"
    assert r["2"]["op"] == "barrier" and r["3"]["op"] == "gather"
    assert loc("ckpt_barrier") in frames_line(r["2"]) and loc("teacher_gather") in frames_line(r["3"])
    assert re.search(r"COLLTRACE_ON_HANG=abort \(deadlock\): ended ranks? 2", outs["b"][1]), outs["b"][1][-3000:]
    # each host recorded which of its ranks it ended, and why: the leader's verdict reached host b
    for h, ranks in (("a", ["0", "1"]), ("b", ["2", "3"])):
        with open(os.path.join(dirs[h], f"ended-{h}.json")) as e:
            record = json.load(e)
        assert sorted(record["ranks"]) == ranks and record["why"] == "deadlock"


def test_a_healthy_two_host_job_says_nothing(two_hosts, tmp_path):
    """Traced, a healthy job on two hosts ends as untraced: exit 0, no colltrace line and no
    "Broken pipe" in either host's output."""
    dirs = {h: str(tmp_path / h) for h in "ab"}
    procs = {h: _torchrun(two_hosts, h, i, dirs[h], "slow_ok", {"SLOW_S": "3"}) for i, h in enumerate("ab")}
    outs = _outputs(procs, 120)
    assert procs["a"].returncode == 0 and procs["b"].returncode == 0, outs
    text = "".join(o + e for o, e in outs.values())
    assert text.count("DONE") == 4
    assert [line for line in text.splitlines() if "colltrace" in line.lower() or "broken pipe" in line.lower()] == []


def _met_the_leader(directory: str) -> bool:
    """Host b's watchdog holds a connection to a server other than the job's store: the leader's.
    Read from /proc/PID/net (the process's own network namespace; psutil reads this one's)."""
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if "colltrace.host" in cmd and directory in cmd:
            try:
                mine = {os.readlink(f"/proc/{p.pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{p.pid}/fd")
                        if os.readlink(f"/proc/{p.pid}/fd/{fd}").startswith("socket:[")}
                rows = []
                for t in ("tcp", "tcp6"):
                    with open(f"/proc/{p.pid}/net/{t}") as table:
                        rows += [line.split() for line in table.readlines()[1:]]
            except OSError:
                return False
            # columns: sl, local, remote (HEX_ADDR:HEX_PORT), state (01: established), ..., inode (10th)
            return any(r[3] == "01" and r[9] in mine and int(r[2].rsplit(":", 1)[1], 16) != 29517 for r in rows)
    return False


def test_when_the_leaders_host_dies_another_host_reports(two_hosts, tmp_path):
    """Host a (the leader, and the job's store) vanishes while host b's ranks wait in a barrier
    for it: host b's job ends within seconds and its watchdog names what vanished, once."""
    dirs = {h: str(tmp_path / h) for h in "ab"}
    env = {"SLOW_S": "600", "COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "300"}
    procs = {h: _torchrun(two_hosts, h, i, dirs[h], "slow_ok", env) for i, h in enumerate("ab")}
    deadline = time.time() + 90
    while time.time() < deadline and not _met_the_leader(dirs["b"]):
        time.sleep(0.2)
    assert time.time() < deadline, "host b's watchdog never connected to the leader's server"
    time.sleep(2)   # it copies the leader's summary on its first round with the link (every LEADER_COPY_S)
    for pid in subprocess.run(["ip", "netns", "pids", two_hosts["a"][0]], capture_output=True, text=True,
                              timeout=20).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    killed = time.time()
    try:
        out, err = procs["b"].communicate(timeout=60)
    except subprocess.TimeoutExpired:
        procs["b"].kill()
        out, err = procs["b"].communicate()
        raise AssertionError(f"host b's job still running 60 s after host a died:\n{err[-3000:]}") from None
    ended = time.time() - killed
    # gloo tells b's ranks at once here (their sockets to a are closed); colltrace on b names
    # what vanished, in one line, instead of waiting for a leader that is gone.
    assert procs["b"].returncode != 0 and ended < 30, ended
    lines = [line for line in err.splitlines() if line.startswith("colltrace:")]
    assert lines == ["colltrace: warning: the leader's host (a, ranks 0-1) stopped answering; "
                     "this host's ranks are still watched from their files"], err[-3000:]


def test_a_late_rank_on_the_other_host_is_named_live_by_the_leader(two_hosts, tmp_path):
    """Rank 3, on host b, sleeps 40 ms in its loading before each of 250 all_reduces: the leader on
    host a names it from the records host b sends through the store (its clock is the same
    machine's here: the lags are the job's own), with where it was while the others waited: the
    leader asked through the store, host b asked its rank, the rank sampled itself. Nothing else
    is said; both jobs end well."""
    dirs = {h: str(tmp_path / h) for h in "ab"}
    # 250 steps (about 11 s): host b's records reach the leader 4-6 s into the job (its watchdog
    # finds the leader, connects, measures its clock), and the line waits for a judging with samples
    env = {"LATE_RANK": "3", "STEPS": "250", "COLLTRACE_STRAGGLER_WINDOW_S": "2"}
    procs = {h: _torchrun(two_hosts, h, i, dirs[h], "", env, script="late_loader.py") for i, h in enumerate("ab")}
    outs = _outputs(procs, 120)
    assert procs["a"].returncode == 0 and procs["b"].returncode == 0, outs
    said = {h: [line for line in outs[h][1].splitlines() if line.startswith("colltrace:")] for h in "ab"}
    assert said["b"] == [] and len(said["a"]) == 1, said
    assert said["a"][0].startswith("colltrace: straggler: rank 3 arrived last at ")
    assert "while they waited it was at late_loader.py:" in said["a"][0] and "(load_batch) in " in said["a"][0], said
    # host b measured its clock against the leader's through the store: the same machine's clock
    # here, so the offset lies within its bound, and the bound is a local round trip's
    with open(os.path.join(dirs["a"], "snapshot.json")) as f:
        clocks = json.load(f)["clocks"]
    offset, bound = clocks["b"]
    assert clocks["a"] == [0.0, 0.0] and 0 < bound < 0.01 and abs(offset) <= bound + 1e-6, clocks
    assert "(hosts' clocks matched to within " in said["a"][0], said
