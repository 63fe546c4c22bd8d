"""Loads a post-mortem folder into the analyzer's snapshot: colltrace's own traces, or PyTorch
Flight Recorder dumps; a folder with neither is bad input, never an empty (healthy) snapshot."""
from __future__ import annotations

import glob
import os
import sys

from colltrace.model.schema import Snapshot
from colltrace.tracefile import frdump, layout, reader


def _has_traces(directory: str) -> bool:
    return (bool(glob.glob(os.path.join(directory, layout.RINGS)))
            or os.path.exists(os.path.join(directory, layout.SNAPSHOT)))


def resolve(directory: str, stream=None) -> str:
    """DIR, or where DIR is the folder `colltrace run` makes its runs in (colltrace-out, holding
    run-YYYYMMDD-HHMMSS folders and no trace of its own) its newest run, said in one line on
    `stream` (stderr). Every command that reads a trace folder asks here first."""
    if not os.path.isdir(directory) or _has_traces(directory):
        return directory
    runs = sorted(d for d in glob.glob(os.path.join(directory, "run-*")) if os.path.isdir(d) and _has_traces(d))
    if not runs:
        return directory
    newest = runs[-1]   # the names are `colltrace run`'s start times: the last sorts newest
    others = f" (and {len(runs) - 1} older)" if len(runs) > 1 else ""
    (stream or sys.stderr).write(f"colltrace: {directory} holds runs of `colltrace run`: reading the newest, "
                                 f"{newest}{others}\n")
    return newest


def load(directory: str, prefix: str | None = None, damage: list | None = None) -> Snapshot:
    """The snapshot of DIR. Raises reader.TraceError (one line naming the folder or file).
    damage: a list given to reader.load_snapshot: each damaged file is added to it, and the
    folder is judged from what is readable."""
    if not os.path.isdir(directory):
        raise reader.TraceError(f"{directory}: no such folder")
    if reader.rank_files(directory) or os.path.exists(os.path.join(directory, layout.SNAPSHOT)):
        return reader.load_snapshot(directory, damage)
    try:
        dumps = frdump.read(directory, prefix)
    except frdump.DumpError as exc:
        raise reader.TraceError(str(exc)) from None
    if not dumps:
        what = f"files named {prefix}<rank>" if prefix is not None else "files named <prefix><rank>"
        raise reader.TraceError(f"{directory}: no colltrace traces ({layout.RINGS}) and no Flight Recorder dumps "
                               f"({what}) in this folder")
    return frdump.to_snapshot(dumps, directory)
