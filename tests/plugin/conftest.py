"""Runs inner pytest sessions (real processes, through pytester) with the colltrace plugin, and
checks after each that nothing it started is still running."""
from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import pytest

INNER_TIMEOUT_S = 240   # pytester kills a stuck inner session after this (then the test fails)


@dataclass
class Inner:
    result: pytest.RunResult
    seconds: float
    cases: dict          # test name -> {"outcome", "time", "text"} from the inner junit xml

    @property
    def out(self) -> str:
        return self.result.stdout.str()

    @property
    def err(self) -> str:
        return self.result.stderr.str()

    def case(self, name: str) -> dict:
        return self.cases[name]


def _mentions(proc, needle: str) -> bool:
    import psutil

    try:
        if needle in " ".join(proc.cmdline()) or (proc.cwd() or "").startswith(needle):
            return True
        return any(needle in v for v in proc.environ().values())
    except psutil.Error:
        return False


def leftovers(needle: str) -> list:
    """Live processes (not this one nor its ancestors) whose command line, working folder or
    environment mention `needle`: an inner session's ranks, mp.spawn children, launchers."""
    import psutil

    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for p in psutil.process_iter():
        if p.pid in mine:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if _mentions(p, needle):
            found.append(p)
    return found


def _junit(path) -> dict:
    cases = {}
    if not os.path.exists(path):
        return cases
    for tc in ET.parse(path).getroot().iter("testcase"):
        outcome, text = "passed", ""
        for child in tc:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                text = child.text or child.get("message") or ""  # the failure report as pytest printed it
        cases[tc.get("name")] = {"outcome": outcome, "time": float(tc.get("time") or 0), "text": text}
    return cases


@pytest.fixture
def inner(pytester, monkeypatch):
    """run(*args) -> Inner: `pytest *args` in a subprocess in pytester's folder; afterwards no
    process that mentions that folder may remain (any found is killed and the test fails)."""
    for k in list(os.environ):
        if k.startswith("COLLTRACE"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    runs = []

    def run(*args: str, timeout: float = INNER_TIMEOUT_S, entry_point: bool = False) -> Inner:
        """entry_point=True: plugins load as for a user (the pytest11 entry point, and every other
        installed plugin); else only colltrace's, by name: seconds faster per session here."""
        xml = pytester.path / f"junit-{len(runs)}.xml"
        if entry_point:
            monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
            load = []
        else:
            monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
            load = ["-p", "colltrace.pytest_plugin"]
        t = time.time()
        result = pytester.runpytest_subprocess(*load, "-p", "no:cacheprovider", f"--junitxml={xml}", *args,
                                               timeout=timeout)
        inner = Inner(result, time.time() - t, _junit(xml))
        runs.append(inner)
        return inner

    yield run
    needle = str(pytester.path)
    deadline = time.time() + 5   # SIGKILLed processes may take a moment to be reaped
    left = leftovers(needle)
    while left and time.time() < deadline:
        time.sleep(0.2)
        left = leftovers(needle)
    described = []
    for p in left:
        try:
            described.append(f"{p.pid} {' '.join(p.cmdline())[:200]}")
            p.kill()
        except Exception:
            pass
    assert not left, "processes left behind: " + "; ".join(described)
