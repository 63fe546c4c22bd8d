"""The torch releases colltrace is tested on, in one place.

colltrace uses what the installed torch offers by feature (c10d's hooks where a group has
`register_pre_hook`, functional collectives where they import, ...), never by version: the
package asks for `torch>=2.13` with no upper bound, because a bound makes pip swap a user's
newer torch (and its CUDA libraries) for an older one without a word. The version decides only
one thing: on a torch newer than any CI run has tested, the job says so once, so that a surprise
there is read in that light. Importing this module imports nothing (not torch).
"""
from __future__ import annotations

import re
import sys

# The releases .ci/run runs the suites on (tests/unit/test_torchcompat.py holds it to that).
TESTED = ("2.13.0", "2.14.1", "2.15.0")

_said = False


def minor(version) -> tuple[int, int] | None:
    """"2.16.0+cu130", "2.16.0a0+git1234" -> (2, 16); None when it does not start with X.Y."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _tested_range() -> tuple[tuple[int, int], tuple[int, int]]:
    minors = sorted(minor(v) for v in TESTED)
    return minors[0], minors[-1]


def newer_note(version) -> str | None:
    """The one line for a torch newer than the tested ones; None for a tested, older or unreadable one."""
    got = minor(version)
    oldest, newest = _tested_range()
    if got is None or got <= newest:
        return None
    return (f"colltrace: torch {got[0]}.{got[1]} is newer than the versions tested "
            f"({oldest[0]}.{oldest[1]}-{newest[0]}.{newest[1]}): tracing with what it offers")


def say_if_newer(version=None, stream=None) -> bool:
    """Write newer_note once per process (the caller picks one process per job: rank 0).
    True if written. Never raises: this runs inside the user's job."""
    global _said
    try:
        if _said:
            return False
        if version is None:
            torch = sys.modules.get("torch")
            version = getattr(torch, "__version__", None)
        note = newer_note(version) if version is not None else None
        if note is None:
            return False
        _said = True
        stream = stream or sys.stderr
        stream.write(note + "\n")
        stream.flush()
        return True
    except Exception:
        return False
