"""pytest plugin: a hung distributed test fails within seconds and says which collective, which
ranks, where (registered through the pytest11 entry point).

    pytest --colltrace                      trace every test (children included), fail hangs fast
    @pytest.mark.colltrace(stall_s=5)       the same for one test, or tuned for it
    @pytest.mark.distributed(world_size=4)  run the test function on 4 gloo ranks (always traced)

Settings resolve like pytest-timeout's: command line, else environment, else ini file; a
marker on a test overrides them for that test. The machinery is in colltrace.testing; this
module imports nothing heavy (no torch) at load.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from colltrace.testing.guard import TestGuard

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class SessionSettings:
    enabled: bool
    stall_s: float
    dir: str | None        # None: a folder per test under pytest's tmp path, kept only if it fails
    error: str | None = None   # a bad stall/dir value: a usage error only if colltrace is used


GUARD: pytest.StashKey[TestGuard] = pytest.StashKey()
SETTINGS = pytest.StashKey[SessionSettings]()


def pytest_addoption(parser):
    group = parser.getgroup("colltrace", "colltrace: fail hung distributed tests fast, with the verdict")
    group.addoption("--colltrace", action="store_true", default=None,
                    help="trace every test's torch.distributed use (child processes included); a hang fails the "
                         "test with colltrace's verdict [env COLLTRACE_PYTEST=1, ini colltrace]")
    group.addoption("--colltrace-stall-s", metavar="S", default=None,
                    help="seconds ranks may wait for one that never arrives before the test fails (certain "
                         "deadlocks fail at once) [env COLLTRACE_STALL_S, ini colltrace_stall_s; default 30]")
    group.addoption("--colltrace-dir", metavar="DIR", default=None,
                    help="keep every test's trace in DIR/<test> (default: under pytest's tmp path, kept for "
                         "failed tests only) [env COLLTRACE_DIR, ini colltrace_dir]")
    parser.addini("colltrace", "trace every test (like --colltrace)", type="string", default="")
    parser.addini("colltrace_stall_s", "like --colltrace-stall-s", type="string", default="")
    parser.addini("colltrace_dir", "like --colltrace-dir", type="string", default="")
    group.addoption("--colltrace-user-packages", metavar="NAME[,NAME...]", default=None,
                    help="installed packages that are your own code: verdicts name their lines like your tests' "
                         "[env COLLTRACE_USER_PACKAGES, ini colltrace_user_packages]")
    parser.addini("colltrace_user_packages", "like --colltrace-user-packages", type="string", default="")


def _flag(raw, where: str) -> bool | None:
    if raw is None or str(raw).strip() == "":
        return None
    value = str(raw).strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise pytest.UsageError(f"colltrace: {where}={raw!r} is not a yes/no value (use 1/0, true/false)")


def _seconds(raw, where: str) -> float | None:
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if isinstance(raw, bool) or not (0 <= value < float("inf")):
        raise pytest.UsageError(f"colltrace: {where}={raw!r} is not a number of seconds >= 0")
    return value


def _first(*values):
    return next((v for v in values if v is not None), None)


def resolve(config) -> SessionSettings:
    """Command line, else environment, else ini file (pytest-timeout's order). A bad on/off value
    is a usage error at once; a bad threshold only once some test is traced (a stray
    COLLTRACE_STALL_S in the shell must not break test sessions that do not use colltrace)."""
    env = os.environ
    enabled = _first(config.getoption("colltrace"), _flag(env.get("COLLTRACE_PYTEST"), "COLLTRACE_PYTEST"),
                     _flag(config.getini("colltrace"), "colltrace (ini)"), False)
    directory = _first(config.getoption("colltrace_dir") or None, env.get("COLLTRACE_DIR", "").strip() or None,
                       config.getini("colltrace_dir").strip() or None)
    directory = os.path.abspath(directory) if directory else None
    cli = _seconds(config.getoption("colltrace_stall_s"), "--colltrace-stall-s")
    ini = _seconds(config.getini("colltrace_stall_s"), "colltrace_stall_s (ini)")
    try:
        from_env = _seconds(env.get("COLLTRACE_STALL_S"), "COLLTRACE_STALL_S")
    except pytest.UsageError as exc:
        if enabled and cli is None:
            raise
        from_env, error = None, (None if cli is not None else str(exc))
    else:
        error = None
    return SessionSettings(enabled, _first(cli, from_env, ini, 30.0), directory, error=error)


def pytest_configure(config):
    config.addinivalue_line("markers", "colltrace(enabled=True, stall_s=None): trace this test with colltrace "
                                       "(or not: colltrace(False)); stall_s overrides --colltrace-stall-s")
    config.addinivalue_line("markers", "distributed(world_size=2, backend='gloo', timeout=None): run the test "
                                       "function on world_size ranks in child processes, traced by colltrace; "
                                       "fixtures rank, world_size, groups")
    config.stash[SETTINGS] = resolve(config)
    packages = _first(config.getoption("colltrace_user_packages"), os.environ.get("COLLTRACE_USER_PACKAGES"),
                      config.getini("colltrace_user_packages").strip() or None)
    if packages:   # read by each traced rank from its environment, like every other setting
        os.environ["COLLTRACE_USER_PACKAGES"] = packages


def pytest_report_header(config):
    s = config.stash.get(SETTINGS, None)
    if s is not None and s.enabled:
        where = s.dir or "the tmp path (failed tests)"
        return f"colltrace: every test traced, stall_s={s.stall_s:g}, traces in {where}"


def _marker_settings(item) -> tuple[bool | None, float | None]:
    m = item.get_closest_marker("colltrace")
    if m is None:
        return None, None
    unknown = set(m.kwargs) - {"enabled", "stall_s"}
    if unknown or len(m.args) > 1 or (m.args and "enabled" in m.kwargs):
        raise pytest.UsageError(f"colltrace: {item.nodeid}: the marker takes colltrace(enabled=True, stall_s=None)")
    enabled = m.args[0] if m.args else m.kwargs.get("enabled", True)
    if not isinstance(enabled, bool):
        raise pytest.UsageError(
            f"colltrace: {item.nodeid}: colltrace(enabled=...) must be True or False, got {enabled!r}")
    return enabled, _seconds(m.kwargs.get("stall_s"), f"{item.nodeid}: colltrace(stall_s)")


def pytest_collection_modifyitems(config, items):
    # Bad marker arguments, or a bad setting now that some test uses colltrace: one usage error
    # before anything runs.
    error = config.stash[SETTINGS].error
    for item in items:
        enabled, _ = _marker_settings(item)
        if error and (enabled or item.get_closest_marker("distributed") is not None):
            raise pytest.UsageError(error)
        m = item.get_closest_marker("distributed")
        if m is not None:
            from colltrace.testing.ranks import RankSetupError, parse_marker

            try:
                parse_marker(m)
            except RankSetupError as exc:
                raise pytest.UsageError(f"colltrace: {item.nodeid}: {exc}") from None


def _test_dir(item, session: SessionSettings) -> tuple[str, bool]:
    """(folder, is_temporary) for this test's traces."""
    name = re.sub(r"[^\w.-]+", "_", item.nodeid)[-120:].strip("_") or "test"
    if session.dir:
        path = os.path.join(session.dir, name)
        shutil.rmtree(path, ignore_errors=True)  # a rerun's traces replace the last run's
        return path, False
    factory = getattr(item.config, "_tmp_path_factory", None)
    if factory is not None:
        return str(factory.mktemp("colltrace-" + re.sub(r"[^\w]+", "_", item.name)[:30], numbered=True)), True
    import tempfile

    return tempfile.mkdtemp(prefix="colltrace-"), True


def _hard_exit(item):
    config = item.config

    def write(text: str) -> None:
        # As pytest-timeout's thread method: show it on the terminal, not in a capture file.
        capman = config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            try:
                capman.suspend_global_capture(in_=True)
            except Exception:  # a capture plugin of another pytest: the message still goes out
                pass
        tw = config.get_terminal_writer()
        tw.sep("+", f"colltrace: {item.nodeid} is stuck")
        tw.line(text)
        tw.flush()

    return write


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    session = item.config.stash[SETTINGS]
    enabled, stall = _marker_settings(item)
    distributed = item.get_closest_marker("distributed") is not None
    if not (distributed or _first(enabled, session.enabled)):
        return (yield)
    from colltrace.testing.guard import TestGuard

    directory, temporary = _test_dir(item, session)
    guard = TestGuard(directory, _first(stall, session.stall_s), on_hard_exit=_hard_exit(item))
    guard.temporary = temporary
    item.stash[GUARD] = guard
    guard.start()
    try:
        return (yield)
    finally:
        guard.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    m = pyfuncitem.get_closest_marker("distributed")
    if m is None:
        return None
    from colltrace.testing.ranks import parse_marker, run_on_ranks

    run_on_ranks(pyfuncitem, parse_marker(m), pyfuncitem.stash[GUARD])
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    guard = item.stash.get(GUARD, None)
    if guard is None or call.when != "call":
        return report
    if guard.findings and not guard.shown_after_test_error:
        if report.failed:
            own = report.longreprtext.strip()
            after = f"\n\nthe test's own error, after colltrace ended its ranks:\n{own}" if own else ""
        else:
            after = "\n\nthe test itself did not fail: it went on after colltrace ended its ranks"
        report.outcome = "failed"
        report.longrepr = guard.verdict() + after
    elif report.failed and os.path.isdir(guard.dir) and os.listdir(guard.dir):
        report.sections.append(("colltrace", f"trace: {guard.dir}  (colltrace analyze {guard.dir})"))
    log = guard.log.getvalue()
    if report.failed and log.strip() and not guard.findings:  # warnings and errors; a verdict is shown above
        report.sections.append(("colltrace watchdog", log))
    if report.passed and guard.temporary:
        shutil.rmtree(guard.dir, ignore_errors=True)  # kept only for tests that fail
    return report


# -- the fixtures a distributed test's ranks get (real values only in the ranks' processes) ------
class _InRanksOnly:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<{self.name}: set in each rank's process>"


def _runner_fixture(request, name):
    if request.node.get_closest_marker("distributed") is None:
        pytest.fail(f"colltrace: the {name!r} fixture is for tests marked @pytest.mark.distributed(world_size=N)",
                    pytrace=False)
    return _InRanksOnly(name)


@pytest.fixture
def rank(request):
    """This rank's number (a @pytest.mark.distributed test runs once per rank)."""
    return _runner_fixture(request, "rank")


@pytest.fixture
def world_size(request):
    """The number of ranks of a @pytest.mark.distributed test."""
    return _runner_fixture(request, "world_size")


@pytest.fixture
def groups(request):
    """Process groups for a @pytest.mark.distributed test: groups.world, groups.new(ranks), groups.mesh(2, 2)."""
    return _runner_fixture(request, "groups")
