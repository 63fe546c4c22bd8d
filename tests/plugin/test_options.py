"""The plugin's settings and its errors, in inner pytest sessions that start no ranks (fast)."""
import json

import pytest

pytest_plugins = ["pytester"]

SEES = """
import json, os, sys
import pytest


def _see(name):
    with open(os.environ["SEEN"], "a") as f:
        env = os.environ
        f.write(json.dumps({"test": name, "on": env.get("COLLTRACE"), "stall": env.get("COLLTRACE_STALL_S"),
                            "dir": env.get("COLLTRACE_DIR"), "torch": "torch" in sys.modules}) + "\\n")


def test_plain():
    _see("plain")


@pytest.mark.colltrace(stall_s=1.5)
def test_marker_stall():
    _see("marker_stall")


@pytest.mark.colltrace(False)
def test_marker_off():
    _see("marker_off")
"""


def _seen(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    path.unlink()
    return {r["test"]: r for r in rows}


def test_settings_resolve_cli_then_env_then_ini_and_a_marker_overrides(inner, pytester, monkeypatch):
    pytester.makepyfile(test_sees=SEES)
    pytester.makeini("[pytest]\ncolltrace = true\ncolltrace_stall_s = 7\n")
    seen = pytester.path / "seen.jsonl"
    monkeypatch.setenv("SEEN", str(seen))

    # ini alone: every test traced with its stall_s; the marker tunes one test and turns one off
    assert inner(entry_point=True).result.ret == 0  # registered as any user gets it
    s = _seen(seen)
    assert (s["plain"]["on"], s["plain"]["stall"]) == ("1", "7.0")
    assert (s["marker_stall"]["on"], s["marker_stall"]["stall"]) == ("1", "1.5")
    assert s["marker_off"]["on"] is None
    assert not any(r["torch"] for r in s.values())  # tracing a test imports no torch by itself

    monkeypatch.setenv("COLLTRACE_STALL_S", "5")  # the environment beats the ini file
    assert inner().result.ret == 0
    s = _seen(seen)
    assert s["plain"]["stall"] == "5.0" and s["marker_stall"]["stall"] == "1.5"

    assert inner("--colltrace-stall-s", "3").result.ret == 0  # the command line beats both
    s = _seen(seen)
    assert s["plain"]["stall"] == "3.0" and s["marker_stall"]["stall"] == "1.5"

    monkeypatch.setenv("COLLTRACE_PYTEST", "0")  # off from the environment, over the ini file...
    assert inner().result.ret == 0
    s = _seen(seen)
    assert s["plain"]["on"] is None and s["marker_stall"]["on"] == "1"  # ...but a marker turns one test on

    r = inner("--colltrace")  # the command line beats the environment
    assert r.result.ret == 0
    assert "colltrace: every test traced, stall_s=5" in r.out
    s = _seen(seen)
    assert s["plain"]["on"] == "1"
    assert s["plain"]["dir"] != s["marker_stall"]["dir"]  # a folder per test


def test_colltrace_dir_keeps_a_folder_per_test(inner, pytester, monkeypatch):
    pytester.makepyfile(test_sees=SEES)
    seen = pytester.path / "seen.jsonl"
    monkeypatch.setenv("SEEN", str(seen))
    out = pytester.path / "traces"
    assert inner("--colltrace", "--colltrace-dir", str(out)).result.ret == 0
    s = _seen(seen)
    assert s["plain"]["dir"] == str(out / "test_sees.py_test_plain")
    assert (out / "test_sees.py_test_plain").is_dir()  # kept: the user asked for it


@pytest.mark.parametrize("how, value, says", [
    ("cli", ["--colltrace-stall-s", "soon"], "--colltrace-stall-s='soon' is not a number of seconds >= 0"),
    ("env", {"COLLTRACE_STALL_S": "-2"}, "COLLTRACE_STALL_S='-2' is not a number of seconds >= 0"),
    ("env", {"COLLTRACE_PYTEST": "maybe"}, "COLLTRACE_PYTEST='maybe' is not a yes/no value"),
    ("ini", "colltrace = perhaps", "colltrace (ini)='perhaps' is not a yes/no value"),
    ("marker", "@pytest.mark.colltrace(stall_s='soon')", "colltrace(stall_s)='soon' is not a number of seconds"),
    ("marker", "@pytest.mark.distributed(world_size=0)", "world_size must be an integer >= 1, got 0"),
    ("marker", "@pytest.mark.distributed(2, ranks=4)", "unknown argument 'ranks'"),
])
def test_a_bad_value_is_one_usage_error(inner, pytester, monkeypatch, how, value, says):
    args = []
    marker = ""
    if how == "cli":
        args = value
    elif how == "env":
        for k, v in value.items():
            monkeypatch.setenv(k, v)
    elif how == "ini":
        pytester.makeini(f"[pytest]\n{value}\n")
    else:
        marker = value
    pytester.makepyfile(test_bad=f"import pytest\n\n{marker}\ndef test_x():\n    pass\n")
    r = inner(*args, *(["--colltrace"] if how == "env" and "COLLTRACE_STALL_S" in value else []))
    assert r.result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in r.err.splitlines() if line.strip()]
    assert len(errors) == 1, r.err
    assert errors[0].startswith("ERROR: colltrace: ") and says in errors[0], errors[0]


def test_a_stray_bad_threshold_breaks_no_session_that_does_not_use_colltrace(inner, pytester, monkeypatch):
    monkeypatch.setenv("COLLTRACE_STALL_S", "soon")
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    assert inner().result.ret == 0
    pytester.makepyfile(test_marked="import pytest\n\n@pytest.mark.colltrace\ndef test_y():\n    pass\n")
    r = inner()
    assert r.result.ret == pytest.ExitCode.USAGE_ERROR and "COLLTRACE_STALL_S='soon'" in r.err


def test_runner_fixtures_and_arguments_that_cannot_reach_the_ranks_say_why(inner, pytester):
    pytester.makepyfile(test_misuse="""
        import threading
        import pytest

        @pytest.fixture
        def lock():
            return threading.Lock()

        def test_rank_without_marker(rank):
            pass

        @pytest.mark.distributed(world_size=2)
        def test_unpicklable_fixture(rank, lock):
            pass
    """)
    r = inner()
    assert r.case("test_rank_without_marker")["outcome"] == "error"
    assert "the 'rank' fixture is for tests marked @pytest.mark.distributed(world_size=N)" in r.out
    assert r.case("test_unpicklable_fixture")["outcome"] == "failed"
    assert "argument 'lock' cannot be sent to the ranks" in r.out
    assert "rank, world_size, groups and fixtures whose values pickle" in r.out


def test_a_traced_test_keeps_its_own_signal_handler(inner, pytester):
    # The guard holds SIGUSR2 (to interrupt a test stuck after a hang); until then it passes it on.
    pytester.makeconftest("""
        import signal

        got = []
        signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    """)
    pytester.makepyfile(test_sig="""
        import os, signal, time
        import conftest

        def test_own_handler_runs():
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.1)
            assert conftest.got == [signal.SIGUSR2]
    """)
    inner("--colltrace").result.assert_outcomes(passed=1)
