"""Fixtures for the dashboard's tests: trace folders recorded from real gloo jobs (tests/fixtures/recorded),
CLI processes killed at the end with everything they started, and a headless Chromium (Debian's, else Playwright's)."""
from __future__ import annotations

import os
import shutil

import pytest

from helpers.dashboard import CHROMIUM, CHROMIUM_ARGS, Proc, clean_env
from helpers.paths import FIXTURES
from helpers.procs import kill_watchdogs

RECORDED = os.path.join(FIXTURES, "recorded")


@pytest.fixture(scope="session")
def recorded():
    """Trace folders recorded from real jobs (tests/fixtures/make_recorded.py): "deadlock" (the
    cross-group deadlock on 4 gloo ranks, ended by COLLTRACE_ON_HANG=abort) and "healthy"
    (2 ranks). Tests read copies (copy_of); the live dashboard tests start their own jobs."""
    return {name: os.path.abspath(os.path.join(RECORDED, name)) for name in ("deadlock", "healthy")}


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
        kill_watchdogs(d)


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
