"""Fixtures for the dashboard's tests: trace folders recorded from real gloo jobs, CLI processes
killed at the end with everything they started, and a headless Chromium (Debian's, else Playwright's)."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from helpers.dashboard import CHROMIUM, CHROMIUM_ARGS, Proc, _root_conftest, clean_env


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):
    """Trace folders recorded from real jobs on 4 gloo ranks, once per session:
    "deadlock" (the seeds' cross-group deadlock, ended by COLLTRACE_ON_HANG=abort) and "healthy"."""
    start, cleanup = _root_conftest()._job_starter(tmp_path_factory.mktemp("recorded"))   # none left behind
    try:
        dl = start("scenarios.py", 4, args=["deadlock"], env={"COLLTRACE_ON_HANG": "abort", "COLLTRACE_STALL_S": "2"})
        ok = start("healthy.py", 2, args=[3])
        codes = dl.wait(120)
        assert any(codes), f"the deadlock job was not ended by the watchdog: {codes}"
        assert ok.wait(120) == [0, 0], ok.stderr(0)
        for job in (dl, ok):   # its watchdog writes the last snapshot as it exits
            deadline = time.time() + 30
            while not os.path.exists(os.path.join(job.dir, "snapshot.json")) and time.time() < deadline:
                time.sleep(0.2)
    finally:
        cleanup()
    return {"deadlock": dl.dir, "healthy": ok.dir}


@pytest.fixture
def copy_of(recorded, tmp_path):
    """copy_of("deadlock") -> a private copy of a recorded folder, to damage."""
    def make(name: str) -> str:
        dst = tmp_path / f"{name}-copy"
        shutil.copytree(recorded[name], dst, ignore=shutil.ignore_patterns(".watchdog-*"))
        return str(dst)
    return make


@pytest.fixture
def spawn():
    """spawn(cmd, **env) -> Proc; every process it started (and theirs) is killed at the end."""
    procs: list[Proc] = []
    dirs: list[str] = []

    def start(cmd, env=None, watch_dir=None) -> Proc:
        p = Proc(cmd, env or clean_env())
        procs.append(p)
        if watch_dir:
            dirs.append(watch_dir)
        return p

    yield start
    for p in procs:
        p.kill()
    for d in dirs:
        _root_conftest()._kill_watchdogs(d)


@pytest.fixture
def browser():
    """Headless Chromium driven by Playwright: Debian's where installed, else Playwright's own."""
    from playwright.sync_api import sync_playwright

    # Debian's chromium where it is installed, else Playwright's own build (tests/install-deps.sh
    # installs one of the two); neither: Playwright's launch error names what is missing.
    executable = CHROMIUM if os.path.exists(CHROMIUM) else None
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
