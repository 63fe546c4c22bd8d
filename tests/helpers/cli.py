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
