"""`colltrace analyze DIR`: findings and culprits from a trace folder or Flight Recorder dumps, after the
fact."""
from __future__ import annotations

import json
import sys
from typing import cast

from colltrace.commands import flags
from colltrace.errors import EXIT_FOUND, EXIT_OK
from colltrace.model.schema import Snapshot
from colltrace.tracefile import postmortem


class AnalyzeCommand:
    name = "analyze"
    help = ("Find deadlocks, mismatches, stalls and dead ranks in a trace folder or a folder of PyTorch "
            "Flight Recorder dumps (post-mortem).")

    def prepare_parser(self, p):
        p.add_argument("dir", help="the trace folder (COLLTRACE_DIR of the job; colltrace-out: its newest run-*), "
                                   "or a folder of Flight Recorder dumps")
        p.add_argument("--json", action="store_true",
                       help='print {"findings": [...], "culprits": [...], "warnings": [...], "stragglers": [...]}')
        flags.add_stall_s(p, "stall threshold in seconds (default: the job's COLLTRACE_STALL_S; 0 for Flight "
                             "Recorder dumps, which are written when a collective timed out)")
        flags.add_frdump_prefix(p, "Flight Recorder dumps: the file name before the rank (default: the one prefix "
                                   "the rank-numbered files share, e.g. nccl_trace_rank_)")

    def run(self, args, parser) -> int:
        args.dir = postmortem.resolve(args.dir)
        snap, v = judged(args.dir, args.prefix, args.stall_s)   # InputError: exit 2 (nothing readable)
        say_damage(v.damage)
        if args.json:
            sys.stdout.write(json.dumps(v.as_json(), indent=2, default=str) + "\n")
        else:
            sys.stdout.write(v.text() + "\n")   # what report.txt holds
        return EXIT_FOUND if v.findings else EXIT_OK   # warnings and stragglers alone: the run is not wrong (yet)


def judged(directory: str, prefix: str | None, stall_s: float | None):
    """(snapshot, verdict) of DIR, judged by `stall_s` or else the job's own threshold, at the
    snapshot's time, from what is readable (the damaged files are the verdict's `damage`). Raises
    reader.TraceError when nothing is. `colltrace export` draws the same."""
    from colltrace import verdict
    from colltrace.tracefile import reader

    damage: list = []
    snap = cast(Snapshot, postmortem.load(directory, prefix, damage))   # annotated as a plain dict there
    threshold = stall_s if stall_s is not None else reader.job_stall_s(snap)
    return snap, verdict.of_snapshot(snap, stall_s=threshold, now=snap["taken_at"], damage=damage)


def say_damage(damage) -> None:
    """Each damaged file, with its reason, one line on stderr (the verdict is from the rest)."""
    for d in damage:
        sys.stderr.write(f"colltrace: warning: {d.text()}\n")
