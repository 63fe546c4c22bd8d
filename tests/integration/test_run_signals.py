"""A signal to `colltrace run` does to the job what it does without colltrace: SIGTERM (what
`docker stop` and Kubernetes send) and SIGUSR2 (told to torchrun to pass on) reach torchrun's
workers, whose own handler runs; colltrace exits as torchrun alone does and leaves no process
behind. The docker image's command, run as a container's first process (PID 1, in a PID
namespace of its own), does the same and reaps the orphans the job leaves. A job that dies of a
signal has colltrace die of it too, and a terminal's ^C reaches the job once, not twice.

The workers are torch-free (jobs/on_signal.py): the launcher's handling is what is tried. All
the runs of a comparison start together and share one wait."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers import environ
from helpers.paths import JOBS, ROOT
from helpers.procs import kill_mentioning, kill_tree
from helpers.waiting import wait_until

JOB = os.path.join(JOBS, "on_signal.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
COLLTRACE = [sys.executable, "-m", "colltrace"]
# torchrun passes on SIGTERM, SIGINT, SIGHUP and SIGQUIT unless told more (alone it dies of
# SIGUSR2, its workers left running, as it does under colltrace)
USR2_TOO = ["--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"]


def _env(**extra) -> dict:
    env = environ.clean("TORCHELASTIC")
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _pid1_works() -> bool:
    """`unshare --pid` (root, or user namespaces allowed): a process is its namespace's PID 1."""
    try:
        return subprocess.run(["unshare", "-fp", "--mount-proc", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def docker_command() -> list[str]:
    """The image's CMD (docker/Dockerfile), as JSON."""
    with open(os.path.join(ROOT, "docker", "Dockerfile")) as f:
        text = f.read()
    cmd = re.search(r"^CMD (\[.*?\])\s*$", text, re.S | re.M).group(1)
    return json.loads(cmd.replace("\\\n", " "))


class Run:
    """One process tree started for a comparison, in a session of its own; `out` is the folder its
    workers write to (and part of every command line in the tree)."""

    def __init__(self, cmd, out, env):
        self.out = str(out)
        os.makedirs(self.out, exist_ok=True)
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.rc = None
        self.err = ""
        self.reaped, self.children = False, []   # PID 1's: its orphans reaped while it ran

    def files(self, prefix: str) -> list[str]:
        return sorted(n for n in os.listdir(self.out) if n.startswith(prefix))

    def signals(self) -> list[list[str]]:
        """Each worker's signals, in the order its handler saw them."""
        return [open(os.path.join(self.out, n)).read().split() for n in self.files("signalled-")]

    def finish(self, timeout: float = 90) -> None:
        try:
            _, self.err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout} s: {self.proc.args}") from None
        self.rc = self.proc.returncode

    def left(self) -> list[str]:
        """Processes of this run still there (the folder is in every command line of the tree)."""
        out = []
        for p in psutil.process_iter(["cmdline", "status"]):
            try:
                if self.out in " ".join(p.info["cmdline"] or ()) and p.info["status"] != psutil.STATUS_ZOMBIE:
                    out.append(f"{p.pid}: {' '.join(p.info['cmdline'])[:200]}")
            except psutil.Error:
                continue
        return out

    def kill(self) -> None:
        kill_mentioning(self.out)
        kill_tree(self.proc.pid, walk=False, group=True)
        self.proc.communicate()


def _ready(runs: dict, counts: dict) -> None:
    """Until every run's workers have their handlers set (and the orphans they leave are written)."""
    def ready():
        for name, run in runs.items():
            if run.proc.poll() is not None:
                raise AssertionError(f"{name} ended before its signal: {run.proc.communicate()[1][-3000:]}")
        return all(len(runs[n].files(prefix)) >= k for n, (prefix, k) in counts.items())
    assert wait_until(ready, timeout=120), {n: os.listdir(r.out) for n, r in runs.items()}


def _pid1(run: Run) -> psutil.Process:
    """The namespace's PID 1 under `unshare --fork`: unshare's child."""
    (child,) = psutil.Process(run.proc.pid).children()
    return child


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run signalled and ended: torchrun alone and under `colltrace run` for SIGTERM and
    SIGUSR2; the docker image's command as PID 1 for SIGTERM (its job leaving orphans); a script
    without handlers alone and under colltrace for SIGUSR2."""
    base = tmp_path_factory.mktemp("signals")
    trace = str(base / "trace")
    run_cmd = COLLTRACE + ["run", "--dir", trace, "--"]
    specs = {
        "torchrun SIGTERM": (TORCHRUN + [JOB, base / "a"], _env()),
        "traced SIGTERM": (run_cmd + TORCHRUN + [JOB, base / "b"], _env()),
        "torchrun SIGUSR2": (TORCHRUN + USR2_TOO + [JOB, base / "c"], _env()),
        "traced SIGUSR2": (run_cmd + TORCHRUN + USR2_TOO + [JOB, base / "d"], _env()),
        "script SIGUSR2": ([sys.executable, JOB, base / "e"], _env(HANDLE="")),
        "traced script SIGUSR2": (run_cmd + [sys.executable, JOB, base / "f"], _env(HANDLE="")),
    }
    if _pid1_works():
        cmd = docker_command()
        i = cmd.index("--")
        opts = cmd[2:i]
        opts[opts.index("--dir") + 1] = str(base / "docker-trace")
        opts[opts.index("--dashboard") + 1] = "127.0.0.1:0"   # the image's 0.0.0.0 wants a token; a port of its own
        specs["docker SIGTERM"] = (["unshare", "-fp", "--mount-proc"] + COLLTRACE + ["run"] + opts + ["--"]
                                   + TORCHRUN + [JOB, base / "g"], _env(ORPHAN="1"))
    started = {}
    try:
        for name, (cmd, env) in specs.items():
            started[name] = Run([str(c) for c in cmd], cmd[-1], env)
        counts = {n: ("ready-", 1 if "script" in n else 2) for n in started}
        _ready(started, counts)
        if "docker SIGTERM" in started:   # each worker's orphan has exited and is reaped by PID 1
            docker = started["docker SIGTERM"]
            _ready(started, {"docker SIGTERM": ("orphan-", 2)})
            init = _pid1(docker)
            docker.reaped = wait_until(lambda: all(c.status() != psutil.STATUS_ZOMBIE for c in init.children()),
                                       timeout=30)
            docker.children = [(c.pid, c.status()) for c in init.children()]
        for name, run in started.items():
            sig = signal.SIGTERM if name.endswith("SIGTERM") else signal.SIGUSR2
            os.kill(_pid1(run).pid if name.startswith("docker") else run.proc.pid, sig)   # docker stop: PID 1
        for run in started.values():
            run.finish()
        yield started
    finally:
        for run in started.values():
            if run.proc.poll() is None or run.left():
                run.kill()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR2"])
def test_torchruns_workers_get_the_signal_and_colltrace_exits_as_torchrun_does(runs, sig):
    alone, traced = runs[f"torchrun {sig}"], runs[f"traced {sig}"]
    assert alone.signals() == [[sig], [sig]], alone.err[-2000:]
    assert traced.signals() == [[sig], [sig]], traced.err[-3000:]   # each worker's own handler ran
    assert traced.rc == alone.rc != 0, (traced.rc, alone.rc, traced.err[-3000:])
    assert alone.left() == [] and traced.left() == []
    assert f"colltrace: job exited with code {alone.rc}" in traced.err   # the report, after the job


def test_a_job_killed_by_a_signal_has_colltrace_killed_by_it(runs):
    """No handler: the script dies of SIGUSR2, and so does `colltrace run` (its parent reads -12,
    as from the script alone, not an exit code)."""
    alone, traced = runs["script SIGUSR2"], runs["traced script SIGUSR2"]
    assert alone.rc == traced.rc == -signal.SIGUSR2, traced.err[-3000:]
    assert "tracing into" in traced.err and "job exited" in traced.err   # it reported before it went
    assert traced.left() == []


def test_the_docker_images_command_as_pid_1(runs):
    """The image's CMD as a container's first process: `docker stop`'s SIGTERM reaches the
    workers, whose handlers run; it exits as torchrun alone does; the orphans its job left were
    reaped while it ran, and nothing is left."""
    if "docker SIGTERM" not in runs:
        pytest.skip("no PID namespace here (unshare --pid refused)")
    docker, alone = runs["docker SIGTERM"], runs["torchrun SIGTERM"]
    assert docker.reaped, f"zombies under PID 1: {docker.children}"
    assert docker.signals() == [["SIGTERM"], ["SIGTERM"]], docker.err[-3000:]
    assert docker.rc == alone.rc, (docker.rc, docker.err[-3000:])
    assert docker.left() == []
    assert "colltrace: dashboard at http://127.0.0.1:" in docker.err   # the image's dashboard was on


def test_a_terminals_ctrl_c_reaches_the_job_once(tmp_path):
    """^C in a terminal goes to the whole foreground process group, the job included: colltrace
    does not pass it on a second time. A SIGUSR1 sent to colltrace after it (passed on: the job
    sees it after any SIGINT colltrace would have sent) ends the job."""
    import pty

    seen = {}
    for name, cmd in (("alone", [sys.executable, JOB, tmp_path / "alone"]),
                      ("traced", COLLTRACE + ["run", "--dir", tmp_path / "trace", "--", sys.executable, JOB,
                                              tmp_path / "traced"])):
        out = tmp_path / name
        out.mkdir()
        pid, fd = pty.fork()   # the child leads a session whose terminal is the pty
        if pid == 0:
            env = _env(EXIT_ON="SIGUSR1")
            os.execve(cmd[0], [str(c) for c in cmd], env)
        try:
            output = []
            assert wait_until(lambda out=out: any(n.startswith("ready-") for n in os.listdir(out)), timeout=60), name
            os.write(fd, b"\x03")   # ^C
            assert wait_until(lambda out=out: any(n.startswith("signalled-") for n in os.listdir(out)),
                              timeout=30), name
            os.kill(pid, signal.SIGUSR1)
            deadline = time.time() + 60
            while time.time() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                try:
                    output.append(os.read(fd, 65536))
                except OSError:
                    pass
                if done:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"{name} still running: {b''.join(output)[-2000:]!r}")
            seen[name] = (os.waitstatus_to_exitcode(status),
                          [(out / n).read_text().split() for n in os.listdir(out) if n.startswith("signalled-")])
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            os.close(fd)
    assert seen["alone"] == (0, [["SIGINT", "SIGUSR1"]])
    assert seen["traced"] == seen["alone"]
