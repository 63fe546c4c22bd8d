"""TestGuard: traces one test, ends its ranks when they hang, and leaves no process behind.

While the test runs, the environment says COLLTRACE=1 with a folder of the test's own, so every
process the test starts (torch.multiprocessing.spawn, subprocess, torchrun) traces itself
through the start-up hook; this process is traced too if it uses torch.distributed itself. A
watchdog (the same class `colltrace run` embeds) judges the folder from a thread here. On its
first finding the guard SIGKILLs every rank it has seen (never this process) with their
children, so the test's own code gets its error at once (mp.spawn raises, a subprocess returns
non-zero, this process's gloo call fails when its peers vanish). If the test still does not
return, the guard interrupts the main thread, and as the last resort ends the process after
dumping every stack, as pytest-timeout does.
"""
from __future__ import annotations

import dataclasses
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from colltrace.model.finding import Finding
from colltrace.model.parts import RankPart

if TYPE_CHECKING:
    from colltrace.rank.patches import Watch

ENV_KEYS = ("COLLTRACE", "COLLTRACE_DIR", "COLLTRACE_WATCHDOG", "COLLTRACE_ON_HANG", "COLLTRACE_STALL_S")
INTERRUPT_AFTER_S = 3.0     # after ending the ranks: time the test gets to return by itself
HARD_EXIT_AFTER_S = 10.0    # after interrupting the main thread: time before the process exits
INTERRUPT_SIGNAL = signal.SIGUSR2


# A test may fork its ranks (mp.start_processes(start_method="fork")) while the guard thread is
# in the middle of an import or holds some other lock: the child would inherit that lock held by
# a thread it does not have, and hang in its first import (seen: colltrace.rank.recorder's). Forks
# wait for the guard thread to finish its round instead: it holds this lock for each round.
_round_lock = threading.RLock()
_fork_hooked = False


def _hold_forks_during_rounds() -> None:
    global _fork_hooked
    if not _fork_hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_round_lock.acquire, after_in_parent=_round_lock.release,
                            after_in_child=_round_lock.release)
        _fork_hooked = True


class HangInterrupt(BaseException):
    """Raised in the main thread when the test did not return after its ranks were ended.
    A BaseException, so that the test's own `except Exception` does not swallow it."""


def _kill_tree(proc) -> list[int]:
    """SIGKILL a psutil.Process and its descendants (children first listed, all killed)."""
    import psutil

    try:
        procs = proc.children(recursive=True) + [proc]
    except psutil.Error:
        procs = [proc]
    killed = []
    for p in procs:
        if p.pid == os.getpid():
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue  # already ended, not yet reaped by its parent
            p.kill()
            killed.append(p.pid)
        except psutil.Error:
            pass
    return killed


class TestGuard:
    __test__ = False  # not a test class, whatever pytest's collection patterns say

    def __init__(self, directory: str, stall_s: float, poll_s: float = 0.1, on_hard_exit=None):
        self.dir = directory
        self.stall_s = stall_s
        self.poll_s = poll_s
        self.on_hard_exit = on_hard_exit
        self.log = io.StringIO()          # what the watchdog prints, kept for the report
        self.findings: list[Finding] = []
        self.aborted_at: float | None = None
        self.ended: dict[int, int] = {}   # rank -> pid this guard ended
        self.interrupted = False
        self.temporary = False            # the folder goes away if the test passes
        self.shown_after_test_error = False   # the distributed runner put the verdict in its report
        self._seen: dict[int, tuple[int, float]] = {}   # pid -> (rank, when its trace started)
        self._launchers: dict[int, float] = {}           # pid -> create time: parents of ranks we started
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wd = None
        self._saved_env: dict = {}
        self._watch: Watch | None = None   # the start-up hook's, waiting for torch.distributed
        self._installed_here = False
        self._prev_handler: Callable[[int, FrameType | None], Any] | int | None = None
        self._handler_set = False
        self._interrupt_sent_at: float | None = None

    # -- the test's environment ---------------------------------------------------------------
    def env(self) -> dict:
        # COLLTRACE_ON_HANG=abort tells a reader of the rank's environment what happens; the
        # ranks themselves start no watchdog (external): this process hosts it.
        return {"COLLTRACE": "1", "COLLTRACE_DIR": self.dir, "COLLTRACE_WATCHDOG": "external",
                "COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": repr(self.stall_s)}

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        self._saved_env = {k: os.environ.get(k) for k in ENV_KEYS}
        os.environ.update(self.env())
        self._trace_this_process()
        if threading.current_thread() is threading.main_thread():
            # Only the main thread may set a handler, so it is set now; until a hang it passes
            # the signal on to whatever handled it before.
            self._prev_handler = signal.signal(INTERRUPT_SIGNAL, self._on_interrupt)
            self._handler_set = True
        _hold_forks_during_rounds()
        self._thread = threading.Thread(target=self._loop, name="colltrace-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End of the test call: one last judgement (unless the ranks were ended), then clean up."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self.aborted_at is not None:
            self._end_jobs(launchers=True)
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._untrace_this_process()
        if self._handler_set:
            signal.signal(INTERRUPT_SIGNAL, self._prev_handler if self._prev_handler is not None else signal.SIG_DFL)
            self._handler_set = False

    # -- this process as a rank ---------------------------------------------------------------
    def _trace_this_process(self) -> None:
        from colltrace import _boot
        from colltrace.rank import shim

        if shim.is_installed():
            return  # the user traces this process already (COLLTRACE=1 pytest ...): theirs
        if "torch.distributed.distributed_c10d" in sys.modules:
            shim.install()
            self._installed_here = True
        else:  # patch torch.distributed only if the test imports it
            self._watch = _boot.watch()

    def _untrace_this_process(self) -> None:
        from colltrace.rank import shim

        fired = False
        if self._watch is not None:
            fired = not self._watch.cancel()
            self._watch = None
        if (self._installed_here or fired) and shim.is_installed():
            shim.uninstall()  # the next test's trace goes to its own folder
        self._installed_here = False

    # -- the watchdog thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with _round_lock:
                if self._round():
                    return
            self._stop.wait(self.poll_s)

    def _round(self) -> bool:
        """One round of the guard thread (forks wait for it); True when the thread is done."""
        if self._wd is None:
            self._wd = self._start_watchdog()
            if self._wd is None:
                return True
        wd = self._wd
        final = self._stop.is_set()
        if self.aborted_at is None:
            # Judged until the first finding only: what follows the abort (the ranks it ended
            # "vanished") is its consequence, not news.
            try:
                new = wd.step()
            except Exception as exc:  # a bad round (a file mid-write, a store reply): logged, the guard keeps watching
                self.log.write(f"colltrace: watchdog error (continuing): {exc!r}\n")
                new = []
            self._remember(wd)
            if new:
                self.findings.extend(new)
                # ranks whose files say they ended by themselves (they may still be tearing down)
                self._abort(finished={p.rank for p in wd.processes() if p.ended})
        if final:
            return True
        if self.aborted_at is not None:
            self._escalate()
        return False

    def _start_watchdog(self):
        try:
            from colltrace import config
            from colltrace.host.watchdog import Watchdog

            # The guard ends the ranks itself (never this process): the watchdog only judges.
            env = dict(os.environ, **self.env())
            env.update(COLLTRACE_ON_HANG="warn", COLLTRACE_POLL_S=repr(self.poll_s))
            settings = config.load(env)
            return Watchdog(self.dir, job=None, host=None, settings=settings, stream=self.log)
        except Exception as exc:  # a broken guard must not break the test
            self.log.write(f"colltrace: guard could not start its watchdog: {exc!r}\n")
            return None

    def _remember(self, wd) -> None:
        for p in wd.processes():
            if p.pid and p.pid not in self._seen:
                self._seen[p.pid] = (p.rank, p.started)

    def _alive(self, pid: int, started: float):
        """The process with this pid if it is still the one that wrote the trace."""
        import psutil

        try:
            p = psutil.Process(pid)
            if started and p.create_time() > started + 1.0:
                return None  # the pid was reused by another process
            return p
        except psutil.Error:
            return None

    def _abort(self, finished=frozenset()) -> None:
        import psutil

        self.aborted_at = time.time()
        me = os.getpid()
        for pid, (rank, started) in list(self._seen.items()):
            if pid == me:
                continue  # this process is a rank: its peers' deaths release it
            p = self._alive(pid, started)
            if p is None:
                continue
            # A launcher between us and the rank (torchrun's agent, a script): ended later, only if
            # the test does not return by itself, so that it can report its workers' failure first.
            try:
                chain = p.parents()
            except psutil.Error:
                chain = []
            pids = [a.pid for a in chain]
            if me in pids:
                for a in chain[:pids.index(me)]:
                    try:
                        self._launchers.setdefault(a.pid, a.create_time())
                    except psutil.Error:
                        pass
            if _kill_tree(p) and rank not in finished:
                self.ended[rank] = pid
        from colltrace.words import format_ranks

        kind = self.findings[0].kind if self.findings else "hang"
        self.log.write(f"colltrace: {kind}: ended ranks {format_ranks(self.ended) or '(none left)'}\n")

    def _end_jobs(self, launchers: bool) -> None:
        for pid, (_rank, started) in list(self._seen.items()):
            if pid != os.getpid():
                p = self._alive(pid, started)
                if p is not None:
                    _kill_tree(p)
        if launchers:
            import psutil

            for pid, created in list(self._launchers.items()):
                try:
                    p = psutil.Process(pid)
                    if abs(p.create_time() - created) < 0.01:
                        _kill_tree(p)
                except psutil.Error:
                    pass

    def _escalate(self) -> None:
        now = time.time()
        aborted_at = self.aborted_at
        assert aborted_at is not None   # _round() escalates only after _abort() set it
        if self._interrupt_sent_at is None:
            if now - aborted_at < INTERRUPT_AFTER_S:
                return
            self._end_jobs(launchers=True)
            self._interrupt_sent_at = now
            if self._handler_set:
                # to the main thread itself: its blocking call returns EINTR and the handler runs
                main_ident = threading.main_thread().ident
                assert main_ident is not None   # the main thread has started: it runs the test
                signal.pthread_kill(main_ident, INTERRUPT_SIGNAL)
            return
        if now - self._interrupt_sent_at >= HARD_EXIT_AFTER_S:
            waited = INTERRUPT_AFTER_S + HARD_EXIT_AFTER_S
            text: str | None = self.verdict() + (f"\ncolltrace: the test did not return {waited:.0f} s "
                                     "after its ranks were ended (stuck in native code?): ending this process")
            if self.on_hard_exit is not None:
                try:
                    self.on_hard_exit(text)
                    text = None  # shown already
                except Exception:  # a hook that fails (a terminal gone): the dump below still says it
                    pass
            _dump_and_exit(text)

    def _on_interrupt(self, signum, frame):
        __tracebackhide__ = True
        if self.aborted_at is None or self.interrupted:  # not ours: as if the guard were not there
            prev = self._prev_handler
            if callable(prev):
                return prev(signum, frame)
            if prev in (signal.SIG_DFL, None):
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return None
        self.interrupted = True
        raise HangInterrupt(f"colltrace: the test did not return {INTERRUPT_AFTER_S:.0f} s after its ranks were ended")

    # -- what to show ---------------------------------------------------------------------------
    def verdict(self) -> str:
        """Every finding's paragraph and stack classes, what was ended, where the files are."""
        from colltrace.reporters.stacks import render_stack_classes
        from colltrace.reporters.text import paragraph
        from colltrace.words import rank_word

        blocks = []
        for f in list(self.findings):
            f = _for_display(f)
            block = "colltrace: " + paragraph(f)
            classes = render_stack_classes(f)
            if classes:
                block += "\n" + classes
            blocks.append(block)
        tail = []
        if self.ended:
            tail.append(f"colltrace ended {rank_word(self.ended)} (SIGKILL) instead of waiting for the timeout.")
        tail.append(f"trace: {self.dir}  (colltrace analyze {self.dir})")
        return "\n\n".join(blocks) + "\n" + "\n".join(tail)


def _harness_paths() -> tuple[tuple[str, ...], tuple[str, ...]]:
    import sysconfig

    paths = sysconfig.get_paths()
    stdlib = tuple(os.path.join(paths[k], "") for k in ("stdlib", "platstdlib") if paths.get(k))
    site = tuple(os.path.join(paths[k], "") for k in ("purelib", "platlib") if paths.get(k))
    return stdlib, site


def _is_harness(path: object, paths=None) -> bool:
    """pytest, pluggy, the standard library (multiprocessing, runpy): how a test is run, not what it does."""
    if not isinstance(path, str) or path.startswith("<frozen "):
        return True
    if "/_pytest/" in path or "/pluggy/" in path or path.endswith("/pytest/__main__.py"):
        return True
    stdlib, site = paths or _harness_paths()
    return path.startswith(stdlib) and not path.startswith(site)


def _for_display(finding: Finding) -> Finding:
    """The finding with harness frames left out of each rank's stacks (the files keep them all)."""
    paths = _harness_paths()
    ranks = {}
    for r, e in finding.ranks.items():
        if isinstance(e, dict):
            e = cast(RankPart, dict(e))   # a copy: the files keep every frame
            for key in ("frames", "stack"):
                frames = e.get(key)
                if isinstance(frames, list):
                    harness = [isinstance(f, dict) and _is_harness(f.get("file"), paths) for f in frames]
                    # `python -c "...spawn_main(...)"`: the <string> frame that starts multiprocessing
                    harness = [h or (isinstance(f, dict) and f.get("file") == "<string>" and i + 1 < len(frames)
                                     and harness[i + 1]) for i, (f, h) in enumerate(zip(frames, harness, strict=True))]
                    kept = [f for f, h in zip(frames, harness, strict=True) if not h]
                    e[key] = kept or frames
        ranks[r] = e
    return dataclasses.replace(finding, ranks=ranks)


def _dump_and_exit(text: str | None) -> None:
    """The last resort (the test is stuck where no signal reaches): every stack, then exit."""
    import faulthandler

    try:
        stderr = sys.__stderr__
        if stderr is None:
            return   # no stream to write to (as before, when this raised): the exit below all the same
        if text:
            stderr.write("\n" + text + "\n")
        stderr.write("\nevery thread of this process:\n")
        stderr.flush()
        faulthandler.dump_traceback(file=stderr, all_threads=True)
    finally:
        os._exit(1)
