"""The torch releases colltrace is tested on, in one place, and what an older one lacks.

colltrace uses what the installed torch offers by feature (c10d's hooks where a group has
`register_pre_hook`, functional collectives where they import, ...), never by version: the
package asks for `torch>=2.4` with no upper bound, because a bound makes pip swap a user's
torch (and its CUDA libraries) for another without a word. The version decides only one thing:
on a torch newer than any CI run has tested, the job says so once, so that a surprise there is
read in that light. What an older torch lacks is found by feature (`unseen_note`) and said once
too, where it changes what a finding can name. Importing this module imports nothing (not torch).
"""
from __future__ import annotations

import json
import re
import sys

# The releases .ci/run runs the suites on (tests/unit/test_torchcompat.py holds it to that); the
# oldest is the floor pyproject.toml asks for.
TESTED = ("2.4.1", "2.9.1", "2.11.0", "2.13.0", "2.14.1", "2.15.0")

_said = False
_said_unseen = False


def minor(version) -> tuple[int, int] | None:
    """"2.16.0+cu130", "2.16.0a0+git1234" -> (2, 16); None when it does not start with X.Y."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _tested_range() -> tuple[tuple[int, int], tuple[int, int]]:
    from typing import cast  # imported here: importing this module imports nothing

    # every TESTED version starts with X.Y: minor() is never None here
    minors = sorted(cast("tuple[int, int]", minor(v)) for v in TESTED)
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
        return _say(note, stream)
    except Exception:   # a note is a nicety: never an exception into the user's job
        return False


def _say(note: str, stream) -> bool:
    stream = stream or sys.stderr
    stream.write(note + "\n")
    stream.flush()
    return True


def _flight_recorder_on(dump) -> bool | None:
    """Whether the Flight Recorder records this job's groups: it lists every group it records in
    `pg_config` from the group's creation on, and none while it is off (its buffer size 0, the
    default of torch 2.9 and older; on by default in torch 2.11). None when the dump cannot be read."""
    try:
        return bool(json.loads(dump(includeCollectives=False, onlyActive=True)).get("pg_config"))
    except Exception:   # a dump that raises (C++, any type) or is not JSON: cannot be told
        return None


def unseen_note(torch) -> str | None:
    """The one line for a torch on which collectives issued from C++ (DDP's gradient all-reduces,
    calls on a ProcessGroup itself) can be counted but not named: no c10d hooks to record them
    (torch 2.14+) and no Flight Recorder to name them when asked. None where they can be named,
    or where that cannot be told. Asks only after init_process_group (the groups exist)."""
    pg = getattr(getattr(torch, "distributed", None), "ProcessGroup", None)
    if callable(getattr(pg, "register_pre_hook", None)):
        return None   # c10d's hooks record them as they are issued
    try:
        backend = str(torch.distributed.get_backend())
    except Exception:   # no default group, a pybind error: cannot be told
        backend = None
    if backend is not None and "gloo" not in backend and "nccl" not in backend:
        return None   # a backend of the program's own (Python-defined): no recorder of torch's lists it either way
    dump = getattr(getattr(torch._C, "_distributed_c10d", None), "_dump_fr_trace_json", None)
    if dump is None:
        lacks, fix = "no Flight Recorder dump (torch._C._distributed_c10d._dump_fr_trace_json)", ""
    else:
        on = _flight_recorder_on(dump)
        if on is not False:
            return None
        lacks, fix = "its Flight Recorder off", "; TORCH_FR_BUFFER_SIZE=2000 turns it on and has them named"
    got = minor(getattr(torch, "__version__", "")) or ("?", "?")
    return (f"colltrace: torch {got[0]}.{got[1]} has no c10d collective hooks (torch 2.14+) and {lacks}: "
            f"collectives issued from C++ (DDP's gradient all-reduces, calls on a ProcessGroup itself) are "
            f"counted, not named{fix}")


def say_if_unseen(stream=None) -> bool:
    """Write unseen_note once per process (the caller picks rank 0, after init_process_group).
    True if written. Never raises: this runs inside the user's job."""
    global _said_unseen
    try:
        torch = sys.modules.get("torch")
        if _said_unseen or torch is None:
            return False
        note = unseen_note(torch)
        if note is None:
            return False
        _said_unseen = True
        return _say(note, stream)
    except Exception:   # a note is a nicety: never an exception into the user's job
        return False
