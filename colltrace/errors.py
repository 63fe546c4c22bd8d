"""The one error type: what went wrong in one line, and the exit code the CLI gives for it.

Exit codes (docs/findings.md): 0 ran and found nothing wrong, 1 found problems, 2 bad usage or
unreadable input. Every error colltrace raises for the user to read is a ColltraceError; the
CLI prints `colltrace: error: <message>` and exits with its `exit_code`, never a traceback.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FOUND = 1
EXIT_USAGE = 2


class ColltraceError(Exception):
    """Base of colltrace's errors: str(exc) is the one line a person reads."""

    exit_code = EXIT_USAGE


class UsageError(ColltraceError):
    """Bad flags or values on the command line."""


class InputError(ColltraceError):
    """Input that cannot be read: a missing or malformed trace folder, a file that is not a dump."""
