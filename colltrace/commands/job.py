"""The job `colltrace run` starts, held the way a launcher holds its workers, so that a signal does
to a job under colltrace what it does without it.

- Every signal a launcher passes on (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) is passed
  on to the job, which then ends its own way (torchrun sends it on to its workers and exits 1; a
  script's handler saves its checkpoint) while colltrace waits for it and writes its report. A
  signal colltrace was started ignoring (nohup's SIGHUP) stays ignored, by the job too.
- One signal is not passed on: what a terminal sends to its whole foreground process group (^C,
  ^\\, a hang-up), which the job, in colltrace's group, got too; passed on, it would come twice.
- The job's ending is passed up as it was: its exit code, or its death by a signal re-enacted on
  colltrace itself (`die_of`).
- As a container's first process (PID 1) colltrace forks: the first process only passes signals
  on and reaps the orphans the kernel gives it, as tini does; colltrace proper runs in the child.

The signals are blocked in every thread and taken with sigtimedwait, which says who sent them
(si_code), before any thread starts: a thread that did not block one would take it with its
default action (SIGTERM: the end of colltrace, the job orphaned).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys

PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# si_code of a signal the kernel raised itself: a terminal's ^C, ^\ or hang-up, sent to the whole
# foreground process group (a kill(2) says SI_USER). Not in Python's signal module.
SI_KERNEL = 0x80
# Python ignores these; the job gets their defaults, as subprocess.Popen gives them (restore_signals).
_RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)
# Signals whose default action dumps core: colltrace re-enacting the job's death leaves no core file.
_CORE = frozenset(getattr(signal, n) for n in ("SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE",
                                               "SIGSEGV", "SIGXCPU", "SIGXFSZ", "SIGSYS") if hasattr(signal, n))
POLL_S = 0.2   # how often the wait looks at the job when no signal comes (SIGCHLD wakes it at once)
_given_mask: list = []   # the signal mask colltrace was started with, when PID 1's fork already blocked them


class Job:
    """The job's process: start(), wait() for it passing signals on, its returncode as Popen's."""

    def __init__(self, passed_on: tuple, mask):
        self.passed_on = passed_on
        self._mask = mask
        self.pid: int | None = None
        self.returncode: int | None = None
        self.ended_by_colltrace = False   # COLLTRACE_ON_HANG=abort ended it: its SIGKILL is colltrace's own

    def start(self, argv: list, env: dict, stderr: int | None = None) -> None:
        """The job with the signal mask colltrace was given and default actions where colltrace
        catches (a shell's exec gives the same); `stderr`: a descriptor its stderr goes to (the
        launcher's report is folded from it). OSError if it cannot be started."""
        actions = [(os.POSIX_SPAWN_DUP2, stderr, 2)] if stderr is not None else []
        self.pid = os.posix_spawnp(argv[0], argv, env, setsigmask=self._mask,
                                   setsigdef=self.passed_on + _RESTORED, file_actions=actions)

    def wait(self) -> int:
        """Until the job ends: each signal that comes is passed on; the job's returncode
        (negative: killed by that signal)."""
        job_pid = self.pid
        assert job_pid is not None   # wait() follows a start() that did not raise
        waited = set(self.passed_on) | {signal.SIGCHLD}
        while self.returncode is None:
            info = signal.sigtimedwait(waited, POLL_S)
            if info is not None and info.si_signo != signal.SIGCHLD:
                self._pass_on(info)
            pid, status = os.waitpid(job_pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def _pass_on(self, info) -> None:
        pid = self.pid
        assert pid is not None   # called from wait() only
        if info.si_code == SI_KERNEL and _in_my_group(pid):
            return   # the terminal sent it to the whole foreground group: the job has it already
        try:
            os.kill(pid, info.si_signo)
        except ProcessLookupError:
            pass

    def exit_code(self, code: int) -> int:
        """The exit code `colltrace run` gives, `code` as worked out from the job's own: a job
        killed by a signal is re-enacted (die_of), unless colltrace ended it itself."""
        rc = self.returncode
        if rc is None or rc >= 0 or self.ended_by_colltrace:
            return code
        return die_of(-rc)


def _in_my_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return False


@contextlib.contextmanager
def held():
    """A Job whose signals are taken from here on, in this thread and every thread started
    after (enter before any); on leaving, signals that came after the job ended (no one to pass
    them to) are dropped, and the mask is as it was. An exception while the job runs leaves it
    running: colltrace waits for it (passing signals on) before the exception goes on."""
    passed_on = tuple(s for s in PASSED_ON if signal.getsignal(s) != signal.SIG_IGN)
    waited = set(passed_on) | {signal.SIGCHLD}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    given = _given_mask.pop() if _given_mask else mask
    job = Job(passed_on, given)
    try:
        yield job
    finally:
        try:
            if job.pid is not None and job.returncode is None:
                job.wait()
        finally:
            while signal.sigtimedwait(waited, 0) is not None:
                pass
            signal.pthread_sigmask(signal.SIG_SETMASK, given)


def die_of(signum: int) -> int:
    """End colltrace killed by `signum`, as the job was: its parent (a shell, a scheduler, a
    test's subprocess) reads the status the job alone gives it. An exit code 128+N is what a shell
    prints for both, but not the same status: Python's subprocess reads -N for one and 128+N for
    the other, and bash ends a script whose foreground command died of SIGINT, not one that
    exited 130. No core file of colltrace's is written for a job's core-dumping signal.

    Returns 128+N where the kernel will not end this process by a signal: a container's first
    process (PID 1) has no default action for signals, and exits with 128+N, as tini does."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if os.getpid() != 1:
        import faulthandler

        faulthandler.disable()   # a SIGSEGV re-enacted is not colltrace's own crash to report
        if signum in _CORE:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):   # SIGKILL has no handler to reset
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
    return 128 + signum


def first_process() -> None:
    """As a container's first process (PID 1), fork: the parent stays PID 1, passes signals on to
    the child and reaps every process the kernel reparents to it (orphans of the job, left as
    zombies otherwise) until the child ends, then exits as it did (128+N for a signal: PID 1
    cannot die of one). The child returns and runs `colltrace run` as any other process does,
    its signals already blocked (held() takes them from there). Elsewhere: nothing."""
    if os.getpid() != 1:
        return
    waited = set(PASSED_ON) | {signal.SIGCHLD}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    child = os.fork()
    if child == 0:
        _given_mask.append(mask)
        return
    status = None
    while status is None:
        info = signal.sigwaitinfo(waited)
        if info.si_signo != signal.SIGCHLD:
            if info.si_code != SI_KERNEL:   # the terminal's went to the child's group as well
                try:
                    os.kill(child, info.si_signo)
                except ProcessLookupError:
                    pass
            continue
        while True:   # SIGCHLDs coalesce: reap until none is left
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == child:
                status = st
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)
