"""Shared fixtures: start real gloo ranks as subprocesses, bounded in time, none left behind.

Ranks are started the way torchrun starts them (the parent hosts the job's TCPStore and every
rank connects as a client), which needs no free-port guessing and starts in about a second;
the end-to-end tests that need torchrun itself use `torchrun_job`.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from helpers import environ
from helpers.paths import JOBS
from helpers.procs import kill_tree, kill_watchdogs, stacks_of

# What libstdc++ prints when a thread ends in a noexcept frame: the signature of gloo's abort at
# interpreter exit. A gloo worker thread (ProcessGroupGloo::runLoop) frees the last work it ran
# (a barrier's, holding the all_gather before it) after the main thread has gone on into
# interpreter shutdown; a tensor's Python object needs the GIL, Python ends the thread
# (pthread_exit), the unwind meets a noexcept frame: std::terminate. Seen untraced (core file,
# torch 2.14.1, 2 of 16 runs of healthy_frameworks.py on 2 loaded cores); pytorch/pytorch#179291.
EXIT_ABORT = "terminate called without an active exception"
EXIT_SEGV = "died of SIGSEGV at interpreter exit, after its program had finished"


class GlooExitAbort(AssertionError):
    """A rank of the job died of gloo's abort at interpreter exit: torch's race, not the behaviour
    under test. pyproject.toml's only_rerun runs such a test again, up to twice
    (pytest-rerunfailures); any other failure, or the same abort three times, fails it."""


def _exit_abort(rank: int, code: int | None, err: str, what: str = "") -> None:
    """Raise GlooExitAbort if `rank` ended that way: SIGABRT after libstdc++'s line for a thread
    ended in a noexcept frame. Only that exit race prints it in these jobs (gloo's mismatch aborts
    say "terminate called after throwing", abort() says nothing; colltrace runs no C++ thread)."""
    if code == -signal.SIGABRT and EXIT_ABORT in err:
        raise GlooExitAbort(f"rank {rank}{what} died of gloo's abort at interpreter exit ({EXIT_ABORT}); "
                            f"stderr:\n{err[-2000:]}")
    # The same race's other ending: gloo's threads fault while Python finalizes. Told apart by
    # colltrace's own verdict, which knows the rank's program had returned (its exit record).
    if code == -signal.SIGSEGV and EXIT_SEGV in err:
        raise GlooExitAbort(f"rank {rank}{what} died of SIGSEGV at interpreter exit, after its program had "
                            f"finished; stderr:\n{err[-2000:]}")


@dataclass
class RanksJob:
    """A job's ranks started one by one as torchrun would start them (gloo_job): one Popen a rank."""

    procs: list
    dir: str
    store: object = None
    outputs: dict = field(default_factory=dict)
    traced: bool = True

    def wait(self, timeout: float) -> list[int]:
        deadline = time.time() + timeout
        codes = []
        for rank, p in enumerate(self.procs):
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                stacks = stacks_of([q.pid for q in self.procs])   # before the kill: where each one hung
                self.kill()
                out, err = p.communicate()
                self.outputs[rank] = (out, err)
                raise AssertionError(
                    f"rank {rank} still running after {timeout} s; stderr:\n{err[-3000:]}\n{stacks}") from None
            self.outputs[rank] = (out, err)
            codes.append(p.returncode)
        for rank, code in enumerate(codes):
            _exit_abort(rank, code, self.stderr(rank), f" of a {'traced' if self.traced else 'plain'} job")
        return codes

    def stderr(self, rank: int) -> str:
        return self.outputs.get(rank, ("", ""))[1]

    def stdout(self, rank: int) -> str:
        return self.outputs.get(rank, ("", ""))[0]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                kill_tree(p.pid, walk=False, group=True)

    def stop(self) -> None:
        """The watchdog ended before the ranks, for a test that reads the findings afterwards: ranks
        it saw vanish would be a finding of the test's own making (a dead rank)."""
        kill_watchdogs(self.dir)
        self.kill()


def _job_starter(tmp_path):
    """start(script, nprocs, env=..., args=...) -> RanksJob, and a cleanup that kills them all."""
    from torch.distributed import TCPStore

    jobs = []

    def start(script: str, nprocs: int = 2, env: dict | None = None, args=(), traced: bool = True, directory=None,
              rank_env=None) -> RanksJob:
        """rank_env(rank) -> extra variables for that rank (e.g. another host name and folder).
        "{store}" in a value stands for the job's store address (for COLLTRACE_STORE)."""
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        d = str(directory or tmp_path / f"trace{len(jobs)}")
        base = environ.clean("TORCH_DISTRIBUTED_DEBUG")
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(nprocs),
                    LOCAL_WORLD_SIZE=str(nprocs), TORCHELASTIC_USE_AGENT_STORE="True",
                    TORCHELASTIC_RESTART_COUNT="0",   # torchrun sets it too; torch 2.4's rendezvous reads it
                    TORCHELASTIC_RUN_ID=f"test-{os.getpid()}-{time.time_ns()}", OMP_NUM_THREADS="1",
                    PYTHONUNBUFFERED="1")
        if traced:
            base.update(COLLTRACE="1", COLLTRACE_DIR=d)
        base.update(env or {})
        base = {k: v.replace("{store}", f"127.0.0.1:{store.port}") for k, v in base.items()}   # the job's store
        path = script if os.path.isabs(script) else os.path.join(JOBS, script)
        procs = [subprocess.Popen([sys.executable, path, *map(str, args)],
                                  env={**base, "RANK": str(r), "LOCAL_RANK": str(r),
                                       **(rank_env(r) if rank_env else {})},
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
                 for r in range(nprocs)]
        job = RanksJob(procs, d, store, traced=traced)
        jobs.append(job)
        return job

    def cleanup():
        for job in jobs:
            job.kill()
            for p in job.procs:
                try:
                    p.communicate(timeout=10)
                except Exception:
                    pass
            kill_watchdogs(job.dir)

    return start, cleanup


@pytest.fixture
def gloo_job(tmp_path):
    start, cleanup = _job_starter(tmp_path)
    yield start
    cleanup()


@pytest.fixture(scope="module")
def module_gloo_job(tmp_path_factory):
    """gloo_job for a job shared by the tests of one module."""
    start, cleanup = _job_starter(tmp_path_factory.mktemp("job"))
    yield start
    cleanup()


@dataclass
class TorchrunJob:
    """A job started by torchrun itself (torchrun_job): one Popen, torchrun's, its ranks below it."""

    proc: subprocess.Popen
    dir: str
    started: float
    traced: bool = True
    out: str = ""
    err: str = ""

    def wait(self, timeout: float) -> int:
        try:
            self.out, self.err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = stacks_of([self.proc.pid])
            kill_tree(self.proc.pid)
            self.out, self.err = self.proc.communicate()
            raise AssertionError(
                f"torchrun still running after {timeout} s; stderr:\n{self.err[-4000:]}\n{stacks}") from None
        # torchrun's failure table names the rank that died first ("rank : 1 ... exitcode : -6")
        for m in re.finditer(r"rank\s*:\s*(\d+)[^\n]*\n[^\n]*exitcode\s*:\s*(-?\d+)", self.err):
            _exit_abort(int(m.group(1)), int(m.group(2)), self.err, f" of a {'traced' if self.traced else 'plain'} job")
        return self.proc.returncode

    def findings(self) -> list[dict]:
        from helpers.jobs import findings

        return findings(self.dir)


@pytest.fixture
def torchrun_job(tmp_path):
    """start(script, nprocs, args=..., env=...) -> TorchrunJob: `COLLTRACE=1 torchrun --standalone ...`."""
    jobs = []

    def start(script: str, nprocs: int = 4, args=(), env: dict | None = None, traced: bool = True) -> TorchrunJob:
        d = str(tmp_path / f"trace{len(jobs)}")
        e = environ.clean("TORCH_DISTRIBUTED_DEBUG")
        e.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        if traced:
            e.update(COLLTRACE="1", COLLTRACE_DIR=d)
        e.update(env or {})
        path = script if os.path.isabs(script) else os.path.join(JOBS, script)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}",
               path, *map(str, args)]
        proc = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        job = TorchrunJob(proc, d, time.time(), traced)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        if job.proc.poll() is None:
            kill_tree(job.proc.pid)
            try:
                job.proc.communicate(timeout=10)
            except Exception:
                pass
        kill_watchdogs(job.dir)
