"""Helpers for the dashboard's tests: in-memory sources for synthetic snapshots, and CLI processes
(colltrace dashboard / run) read line by line and killed with everything they started."""
from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time

from colltrace.testing.synthetic import synthetic_snapshot as make_synthetic
from helpers import environ
from helpers.paths import ROOT
from helpers.procs import kill_tree

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _root_conftest():
    """tests/conftest.py as a module of its own name (both conftest files are called conftest)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("colltrace_tests_root_conftest",
                                                  os.path.join(ROOT, "tests", "conftest.py"))
    module = sys.modules.get(spec.name)
    if module is None:
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)   # its dataclasses need it there
        spec.loader.exec_module(module)
    return module


class StaticSource:
    """A source that serves given readings (synthetic snapshots), one per read, the last one after."""

    kind = "test"
    label = "synthetic"

    def __init__(self, *readings):
        self.readings = list(readings)

    def read(self):
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


class Proc:
    """A CLI process whose stderr lines are collected as they come."""

    def __init__(self, cmd, env):
        self.popen = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True)
        self.lines: list[str] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.popen.stdout:
            self._q.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.time() + timeout
        rx = re.compile(pattern)
        for line in self.lines:
            m = rx.search(line)
            if m:
                return m
        while time.time() < deadline:
            try:
                line = self._q.get(timeout=0.2)
            except queue.Empty:
                if self.popen.poll() is not None and self._q.empty():
                    break
                continue
            self.lines.append(line)
            m = rx.search(line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s; output:\n"
                             + "\n".join(self.lines[-60:]))

    def output(self) -> str:
        while not self._q.empty():
            self.lines.append(self._q.get())
        return "\n".join(self.lines)

    def kill(self):
        kill_tree(self.popen.pid, group=True)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def synthetic_snapshot(n_ranks: int, hang: bool = True) -> dict:
    """benchmarks/scale.py's job shape: world + tensor/data-parallel-like groups; with hang, every
    rank but one waits in a world all_reduce that the missing one never enters."""
    return make_synthetic(n_ranks, 4, hang=hang)


def clean_env(**extra) -> dict:
    env = environ.clean("TORCH_DISTRIBUTED_DEBUG")
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def colltrace_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "colltrace.cli", *map(str, args)]


def scrape(text: str) -> dict:
    """/metrics' exposition text, parsed with prometheus-client's own parser: {sample name:
    {frozenset(labels): value}}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out
