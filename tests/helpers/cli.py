"""The colltrace CLI run in-process, as a test reads it: exit code, stdout, stderr."""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

from colltrace import cli


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in args])
        except SystemExit as exc:   # argparse's errors and --version
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Result(rc, out.getvalue(), err.getvalue())


def env_of_run(monkeypatch, flags: dict) -> dict:
    """The environment `colltrace run FLAGS -- true` gives its job (config.load's argument)."""
    import pytest

    from colltrace import config
    from colltrace.cli import build_parser
    from colltrace.commands import run as run_command

    parser = build_parser()
    args = parser.parse_args(["run"] + [x for kv in flags.items() for x in kv])
    args.job_argv = ["true"]   # what cli.main hands it: the job after --
    seen = {}

    class Stop(Exception):
        pass

    def fake_load(env):
        seen.update(env)
        raise Stop

    monkeypatch.setattr(config, "load", fake_load)
    with pytest.raises(Stop):
        run_command.RunCommand().run(args, parser)
    return seen
