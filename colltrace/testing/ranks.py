"""Runs one test function on N ranks in child processes: @pytest.mark.distributed.

The parent (the pytest process) writes what the ranks need (the test's file, module, function,
the fixture values it resolved) to a spec file and starts N fresh interpreters
(`python .../rank_main.py SPEC RANK`, never fork: the ranks inherit nothing of
pytest's state). Rank 0 hosts the job's TCPStore on a free port it picks itself (no port race,
and this process need not import torch). Each rank writes its outcome (passed, failed with its
traceback, skipped) to a file; the parent waits, turns the outcomes into one report, and kills
every rank's process group on the way out. A hang is the TestGuard's: it runs around this.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time

from colltrace.words import signal_name

RUNNER_FIXTURES = ("rank", "world_size", "groups")
RANK_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_main.py")
FAIL_GRACE_S = 2.0        # after a rank failed: time the others get to finish by themselves
OUTPUT_TAIL = 20_000      # characters of each rank's output shown in the report


class RankSetupError(Exception):
    """The test cannot be run on ranks as written (one clear line)."""


def parse_marker(marker) -> dict:
    """distributed(world_size=2, backend="gloo", timeout=None) -> validated kwargs."""
    allowed = ("world_size", "backend", "timeout")
    if len(marker.args) > 1:
        raise RankSetupError("distributed marker: give world_size as its only positional argument")
    kw = dict(zip(("world_size",), marker.args, strict=False))
    for k, v in marker.kwargs.items():
        if k not in allowed:
            raise RankSetupError(f"distributed marker: unknown argument {k!r} (known: {', '.join(allowed)})")
        if k in kw:
            raise RankSetupError(f"distributed marker: {k} given twice")
        kw[k] = v
    n = kw.get("world_size", 2)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RankSetupError(f"distributed marker: world_size must be an integer >= 1, got {n!r}")
    backend = kw.get("backend", "gloo")
    if not isinstance(backend, str) or not backend:
        raise RankSetupError(f"distributed marker: backend must be a name such as 'gloo', got {backend!r}")
    timeout = kw.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise RankSetupError(f"distributed marker: timeout must be a number of seconds > 0, got {timeout!r}")
    return {"world_size": n, "backend": backend, "timeout": None if timeout is None else float(timeout)}


def _argnames(item) -> tuple[str, ...]:
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        return tuple(info.argnames)
    import inspect

    names = [p for p in inspect.signature(item.function).parameters]
    return tuple(names[1:] if item.cls is not None else names)


def _sendable_args(item) -> dict:
    """The values pytest resolved here for the function's other arguments; they must pickle."""
    out = {}
    for name in _argnames(item):
        if name in RUNNER_FIXTURES:
            continue
        value = item.funcargs[name]
        try:
            pickle.dumps(value)
        # pickling raises anything (TypeError, PicklingError, a __reduce__'s own): one RankSetupError
        except Exception as exc:
            raise RankSetupError(
                f"argument {name!r} cannot be sent to the ranks ({type(exc).__name__}: {exc}); a distributed test "
                f"gets {', '.join(RUNNER_FIXTURES)} and fixtures whose values pickle (tmp_path, parameters, data)"
            ) from None
        out[name] = value
    return out


class RankRunner:
    def __init__(self, item, options: dict, guard):
        self.item = item
        self.n = options["world_size"]
        self.options = options
        self.guard = guard
        self.dir = os.path.join(guard.dir, "ranks")
        self.procs: list[subprocess.Popen] = []
        self.outcomes: dict[int, dict] = {}
        self.ended_by_runner: set[int] = set()

    def path(self, rank: int, what: str) -> str:
        return os.path.join(self.dir, f"rank-{rank}.{what}")

    def _spec(self) -> dict:
        item = self.item
        style = item.config.getoption("tbstyle", "auto")
        return {
            "module_name": item.module.__name__, "module_path": str(item.path),
            "cls": item.cls.__qualname__ if item.cls is not None else None,
            "func": getattr(item, "originalname", None) or item.name.split("[", 1)[0],
            "args": _sendable_args(item), "runner_args": [a for a in _argnames(item) if a in RUNNER_FIXTURES],
            "world_size": self.n, "backend": self.options["backend"], "timeout": self.options["timeout"],
            "sys_path": list(sys.path), "dir": self.dir, "parent": os.getpid(),
            "tbstyle": "long" if style in (None, "auto", "line") else style,
        }

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        spec_path = os.path.join(self.dir, "spec.pickle")
        with open(spec_path, "wb") as f:
            pickle.dump(self._spec(), f)
        base = dict(os.environ, WORLD_SIZE=str(self.n), LOCAL_WORLD_SIZE=str(self.n), MASTER_ADDR="127.0.0.1")
        base.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: N ranks share the cores
        base.setdefault("PYTHONUNBUFFERED", "1")
        for r in range(self.n):
            with open(self.path(r, "output.txt"), "wb") as out:   # the rank holds its own copy
                self.procs.append(subprocess.Popen(
                    [sys.executable, RANK_MAIN, spec_path, str(r)],
                    env=dict(base, RANK=str(r), LOCAL_RANK=str(r)), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True))

    def _read_outcomes(self) -> None:
        for r in range(self.n):
            if r not in self.outcomes and os.path.exists(self.path(r, "outcome.json")):
                try:
                    with open(self.path(r, "outcome.json")) as f:
                        self.outcomes[r] = json.load(f)
                except (OSError, ValueError):
                    pass  # being written (the rank renames it into place): next round

    def wait(self) -> None:
        first_bad = None
        while True:
            self._read_outcomes()
            codes = [p.poll() for p in self.procs]
            if all(c is not None for c in codes):
                break
            now = time.time()
            ended_badly = [r for r, c in enumerate(codes)
                           if c is not None and self.outcomes.get(r, {}).get("outcome") not in ("passed", "skipped")]
            if first_bad is None and ended_badly:
                first_bad = now
            if first_bad is not None and now - first_bad > FAIL_GRACE_S:
                # The test has failed: as mp.spawn does, do not wait for the others (waiting for
                # the failed rank, they are usually ended by colltrace before this).
                for r, c in enumerate(codes):
                    if c is None:
                        self.ended_by_runner.add(r)
                        self._kill(self.procs[r])
            time.sleep(0.05)
        self._read_outcomes()

    @staticmethod
    def _kill(p: subprocess.Popen) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the rank and anything it started
        except OSError:
            pass

    def cleanup(self) -> None:
        for p in self.procs:
            self._kill(p)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    # -- the report -------------------------------------------------------------------------------
    def output(self, rank: int) -> str:
        try:
            with open(self.path(rank, "output.txt"), errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        return text if len(text) <= OUTPUT_TAIL else "[...]\n" + text[-OUTPUT_TAIL:]

    def _state(self, r: int) -> str:
        o = self.outcomes.get(r)
        if o is not None:
            if o["outcome"] == "passed":
                return "passed"
            if o["outcome"] == "skipped":
                return f"skipped: {o.get('reason')}"
            return ("could not start the test: " if o.get("phase") == "setup" else "failed: ") + o.get("error", "?")
        code = self.procs[r].returncode
        if r in self.guard.ended:
            return "ended by colltrace (SIGKILL)"
        if r in self.ended_by_runner:
            return f"still running {FAIL_GRACE_S:.0f} s after another rank failed: ended"
        if code is not None and code < 0:
            return f"killed by {signal_name(code) or f'signal {-code}'} before the test finished"
        return f"exited with code {code} before the test finished"

    def summary(self, skip=()) -> str:
        from colltrace.words import rank_word

        by_state: dict[str, list[int]] = {}
        for r in range(self.n):
            if r not in skip:
                by_state.setdefault(self._state(r), []).append(r)
        return "\n".join(f"{rank_word(rs)}: {state}" for state, rs in sorted(by_state.items(), key=lambda x: x[1][0]))

    def report(self) -> tuple[str, str] | None:
        """(how, text) for a failed run: how is "failed" or "skipped"; None when every rank passed."""
        # the first rank to fail is the cause; the others usually fail because it left
        failed = sorted((r for r in range(self.n) if self.outcomes.get(r, {}).get("outcome") == "failed"),
                        key=lambda r: self.outcomes[r].get("t", 0))
        if failed:
            first = self.outcomes[failed[0]]
            verb = "could not start the test" if first.get("phase") == "setup" else "failed"
            text = (f"rank {failed[0]} {verb}: {first.get('error', '?')}\n{first.get('traceback', '').rstrip()}\n\n"
                    + self.summary(skip=failed[:1]))
            return "failed", text
        if all(self.outcomes.get(r, {}).get("outcome") == "passed" for r in range(self.n)):
            return None
        if self.guard.findings:  # the verdict says it all; ranks it did not end are listed
            return "failed", self.summary(skip=set(self.guard.ended))
        if all(self.outcomes.get(r, {}).get("outcome") in ("passed", "skipped") for r in range(self.n)):
            reasons = sorted({o.get("reason") or "" for o in self.outcomes.values() if o.get("outcome") == "skipped"})
            return "skipped", "; ".join(reasons)
        bad = [r for r in range(self.n) if r not in self.outcomes]
        tail = self.output(bad[0]).strip().splitlines()[-15:]
        last = f"\n\nlast lines of rank {bad[0]}'s output:\n" + "\n".join(tail) if tail else ""
        return "failed", self.summary() + last


def run_on_ranks(item, options: dict, guard) -> None:
    """The body of pytest_pyfunc_call for a distributed test: returns if every rank passed."""
    import pytest

    __tracebackhide__ = True
    runner = RankRunner(item, options, guard)
    try:
        runner.start()
        runner.wait()
    except RankSetupError as exc:
        pytest.fail(f"colltrace: {exc}", pytrace=False)
    finally:
        runner.cleanup()
    for r in range(runner.n):
        out = runner.output(r)
        if out.strip():
            item.add_report_section("call", f"rank {r} output", out)
    result = runner.report()
    if result is None:
        return
    how, text = result
    if how == "skipped":
        pytest.skip(text)
    if runner.outcomes and guard.findings and any(o.get("outcome") == "failed" for o in runner.outcomes.values()):
        # the rank's own failure comes first; the hang it caused after it
        guard.shown_after_test_error = True
        text += "\n\nthen:\n" + guard.verdict()
    pytest.fail(text, pytrace=False)
