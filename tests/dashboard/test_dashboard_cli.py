"""`colltrace dashboard`, `colltrace run --dashboard` and COLLTRACE_DASHBOARD from the outside:
one clear line and exit 2 on bad input, an address printed, a server that answers and stops."""
from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from colltrace import config
from helpers.cli import env_of_run
from helpers.dashboard import clean_env, colltrace_cmd

NEEDS = "colltrace: error: the dashboard needs: pip install 'colltrace[dashboard]'"


def run_cli(*args, env=None, pre="pass", timeout=60):
    """The CLI in a fresh interpreter; `pre` runs first (e.g. to hide a package)."""
    code = f"import sys; {pre}; from colltrace.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env or clean_env())


def one_error_line(out) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out
    assert len(lines) == 1 and lines[0].startswith("colltrace: error:") and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.mark.parametrize("args", [
    ["dashboard"],
    ["dashboard", "DIR", "--store", "127.0.0.1:1"],
    ["dashboard", "/nonexistent/folder"],
    ["dashboard", "--store", "nohostport"],
    ["dashboard", "DIR", "--port", "70000"],
    ["dashboard", "DIR", "--stall-s", "-3"],
    ["run", "--dashboard", "not-an-address", "--", "true"],
])
def test_bad_usage_is_one_line(args, tmp_path):
    one_error_line(run_cli(*[str(tmp_path) if a == "DIR" else a for a in args]))


@pytest.mark.parametrize("hidden", ["fastapi", "uvicorn", "prometheus_client", "jinja2"])
def test_without_the_extra_it_says_what_to_install(hidden, tmp_path):
    pre = f"sys.modules[{hidden!r}] = None"   # as if the package were not installed
    assert one_error_line(run_cli("dashboard", tmp_path, pre=pre)) == NEEDS
    assert one_error_line(run_cli("run", "--dashboard", "0", "--", "true", pre=pre)) == NEEDS


def test_binding_beyond_loopback_needs_a_token(tmp_path):
    line = one_error_line(run_cli("dashboard", tmp_path, "--host", "0.0.0.0", "--port", "0"))
    assert "token" in line
    line = one_error_line(run_cli("run", "--dashboard", "0.0.0.0:0", "--", "true"))
    assert "token" in line and "COLLTRACE_DASHBOARD_TOKEN" in line


def test_a_port_in_use_is_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        line = one_error_line(run_cli("dashboard", tmp_path, "--port", s.getsockname()[1]))
    assert "cannot listen on 127.0.0.1:" in line


def test_bad_setting_is_one_warning_and_no_dashboard():
    s = config.load({"COLLTRACE_DASHBOARD": "localhost:http"})
    assert s.dashboard is None and len(s.warnings) == 1 and "COLLTRACE_DASHBOARD" in s.warnings[0]
    assert config.load({"COLLTRACE_DASHBOARD": "9000"}).dashboard == ("127.0.0.1", 9000)
    assert config.load({"COLLTRACE_DASHBOARD": "0.0.0.0:9000"}).dashboard == ("0.0.0.0", 9000)
    assert config.load({}).dashboard is None
    assert "tok" not in repr(config.load({"COLLTRACE_DASHBOARD_TOKEN": "tok"}))   # never printed


def test_serves_a_folder_and_stops_on_ctrl_c(spawn, recorded):
    p = spawn(colltrace_cmd("dashboard", recorded["deadlock"], "--port", "0"))
    url = p.wait_for(r"dashboard for .* at (http://127\.0\.0\.1:\d+/)", timeout=60).group(1)
    view = httpx.get(url + "api/view", timeout=10).json()
    assert view["verdict"]["problems"] == 1 and view["source"]["kind"] == "folder"
    assert httpx.get(url + "api/status", timeout=10).json()["ok"] is True
    p.popen.send_signal(signal.SIGINT)
    assert p.popen.wait(timeout=20) in (0, 130)
    assert "Traceback" not in p.output()


def test_the_folder_colltrace_run_makes_serves_its_newest_run(spawn, recorded, tmp_path):
    import shutil

    out_dir = tmp_path / "colltrace-out"
    shutil.copytree(recorded["healthy"], out_dir / "run-20261125-090000")
    shutil.copytree(recorded["deadlock"], out_dir / "run-20261125-101500")
    p = spawn(colltrace_cmd("dashboard", out_dir, "--port", "0"))
    url = p.wait_for(r"dashboard for .* at (http://127\.0\.0\.1:\d+/)", timeout=60).group(1)
    assert httpx.get(url + "api/view", timeout=10).json()["verdict"]["problems"] == 1   # the newest: the deadlock
    said = [line for line in p.output().splitlines() if "newest" in line]
    assert len(said) == 1 and str(out_dir / "run-20261125-101500") in said[0], p.output()
    p.popen.send_signal(signal.SIGINT)
    assert p.popen.wait(timeout=20) in (0, 130)


def test_with_a_token_from_the_environment(spawn, recorded):
    env = clean_env(COLLTRACE_DASHBOARD_TOKEN="t0ken")
    p = spawn(colltrace_cmd("dashboard", recorded["deadlock"], "--host", "127.0.0.1", "--port", "0"), env=env)
    url = p.wait_for(r"at (http://\S+/) \(token required\)", timeout=60).group(1)
    assert httpx.get(url + "api/view", timeout=10).status_code == 401
    assert httpx.get(url + "api/view", headers={"Authorization": "Bearer t0ken"}, timeout=10).status_code == 200
    assert "t0ken" not in p.output()


def test_colltrace_runs_dashboard_flag_sets_the_jobs_variable(monkeypatch):
    """The settings table's --dashboard row (tests/unit/test_settings_table.py runs the others)."""
    assert env_of_run(monkeypatch, {"--dashboard": "8765"})["COLLTRACE_DASHBOARD"] == "127.0.0.1:8765"
