"""One settings table (colltrace/config.py's VARIABLES) drives the README's table of variables,
`colltrace run`'s flags and the defaults `Settings` holds: these tests keep the three equal."""
from __future__ import annotations

import dataclasses
import os
import re

import pytest

from colltrace import config
from helpers.cli import env_of_run
from helpers.paths import ROOT

# Read by the pytest plugin, documented with its own options (README, "pytest plugin").
PLUGIN_ONLY = {"COLLTRACE_PYTEST"}
# Defaults that are found where they are used, as the README describes them: (words, the field's default)
DESCRIBED = {"host": ("the host name", dataclasses.MISSING), "py_spy": ("on `PATH` or beside `python`", ""),
             "store": ("the job's TCPStore", ""), "leader_port": ("any free port", 0),
             "fanout": ("`32`", 0), "hooks_mode": ("on", "1")}


def test_the_readme_shows_the_table_as_config_writes_it():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert config.markdown_table() in readme


def _shown(value) -> str:
    """How the README shows a Settings default."""
    if value is True:
        return "on"
    if value == ():
        return "none"
    if value in (False, None, 0):
        return "off"
    if isinstance(value, float):
        value = f"{value:g}"
    return f"`{value}`"


@pytest.mark.parametrize("v", [v for v in config.VARIABLES if v.field], ids=lambda v: v.env)
def test_each_rows_default_is_what_settings_holds(v):
    default = config.Settings.__dataclass_fields__[v.field].default
    if v.field == "defs_max_bytes":
        default >>= 20                       # shown in MB, as the variable is given
    if v.field in DESCRIBED:                 # a default found at run time, described
        assert v.shown == DESCRIBED[v.field][0] and default == DESCRIBED[v.field][1]
    elif v.field in ("dashboard_token", "user_packages"):
        assert v.shown == "none" and default in ("", ())
    else:
        assert v.shown == _shown(default)
    assert config.load({}).__getattribute__(v.field) == (
        config.Settings.__dataclass_fields__[v.field].default if v.field != "host" else config.load({}).host)


def test_every_variable_the_code_reads_is_in_the_table():
    read = set()
    for base in ("colltrace", os.path.join("dashboard", "colltrace_dashboard")):
        for folder, _, files in os.walk(os.path.join(ROOT, base)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name)) as f:
                        read |= set(re.findall(r"\bCOLLTRACE(?:_[A-Z0-9]+)*\b", f.read()))
    read = {v for v in read if not v.startswith("COLLTRACE_C10D")}   # a C macro, not a variable
    assert read - PLUGIN_ONLY == {v.env for v in config.VARIABLES}


def test_colltrace_run_has_a_flag_for_each_row_with_one_and_sets_its_variable(monkeypatch):
    flagged = {v.flag: v.env for v in config.VARIABLES if v.flag}
    assert set(flagged) == {"--stall-s", "--on-hang", "--abort-stall-s", "--user-packages", "--straggler-share",
                            "--dashboard"}
    # --dashboard needs the dashboard's extra: tests/dashboard/test_dashboard_cli.py runs it
    values = {"--stall-s": "7", "--on-hang": "abort", "--abort-stall-s": "9", "--user-packages": "mylib",
              "--straggler-share": "0.2"}
    seen = env_of_run(monkeypatch, values)
    assert {flagged[f]: seen.get(flagged[f]) for f in values} == {
        "COLLTRACE_STALL_S": "7.0", "COLLTRACE_ON_HANG": "abort", "COLLTRACE_ABORT_STALL_S": "9.0",
        "COLLTRACE_USER_PACKAGES": "mylib", "COLLTRACE_STRAGGLER_SHARE": "0.2"}


def test_the_watchdogs_own_variables_are_read_in_one_place_and_a_bad_one_is_said():
    s = config.load({"COLLTRACE_PY_SPY": "No", "COLLTRACE_STORE": "OFF", "COLLTRACE_LEADER_PORT": "29600",
                     "COLLTRACE_FANOUT": "8"})
    assert (s.py_spy, s.store, s.leader_port, s.fanout, s.warnings) == ("off", "off", 29600, 8, ())
    bad = config.load({"COLLTRACE_LEADER_PORT": "any", "COLLTRACE_FANOUT": "1"})
    assert (bad.leader_port, bad.fanout) == (0, 0)
    assert [w.split("=")[0] for w in bad.warnings] == ["COLLTRACE_LEADER_PORT", "COLLTRACE_FANOUT"]
    assert config.value("store", {"COLLTRACE_STORE": " 10.0.0.1:29500 "}) == "10.0.0.1:29500"
    from colltrace.host import tree

    assert tree.fanout(10, {"COLLTRACE_FANOUT": "4"}) == 4 and tree.fanout(10, {}) == tree.FANOUT
