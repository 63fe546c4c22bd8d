"""`colltrace analyze DIR`: findings and culprits from a trace folder or Flight Recorder dumps, after the fact."""
from __future__ import annotations

import json
import sys

from colltrace.tracefile import postmortem
from colltrace.callsites import samekind
from colltrace.errors import EXIT_FOUND, EXIT_OK


class AnalyzeCommand:
    name = "analyze"
    help = ("Find deadlocks, mismatches, stalls and dead ranks in a trace folder or a folder of PyTorch "
            "Flight Recorder dumps (post-mortem).")

    def prepare_parser(self, p):
        p.add_argument("dir", help="the trace folder (COLLTRACE_DIR of the job; colltrace-out: its newest run-*), "
                                   "or a folder of Flight Recorder dumps")
        p.add_argument("--json", action="store_true", help='print {"findings": [...], "culprits": [...], "warnings": [...], "stragglers": [...]}')
        p.add_argument("--stall-s", type=float, default=None,
                       help="stall threshold in seconds (default: the job's COLLTRACE_STALL_S; 0 for Flight "
                            "Recorder dumps, which are written when a collective timed out)")
        p.add_argument("--prefix", default=None,
                       help="Flight Recorder dumps: the file name before the rank (default: the one prefix the "
                            "rank-numbered files share, e.g. nccl_trace_rank_)")

    def run(self, args, parser) -> int:
        from colltrace.analysis import culprits, desync, stragglers
        from colltrace.reporters.text import render_verdict

        args.dir = postmortem.resolve(args.dir)
        snap, findings = analyzed(args.dir, args.prefix, args.stall_s)   # InputError: exit 2
        samekind.annotate(findings)   # reads the user's source files: after the (pure) analysis
        warnings = desync.of_snapshot(snap)
        late = stragglers.find(snap)   # never a finding: the exit code is the findings' alone
        if args.json:
            json.dump({"findings": findings, "culprits": culprits.explain(findings)["culprits"], "warnings": warnings,
                       "stragglers": late}, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(render_verdict(findings, warnings, late) + "\n")   # what report.txt holds
        return EXIT_FOUND if findings else EXIT_OK   # warnings alone: the run is not wrong (yet)


def analyzed(directory: str, prefix: str | None, stall_s: float | None) -> tuple[dict, list[dict]]:
    """(snapshot, findings with their paragraphs) of DIR, judged by `stall_s` or else the job's own
    threshold. Raises reader.TraceError on unreadable input. `colltrace export` draws the same."""
    from colltrace.analysis import analyze
    from colltrace.reporters.text import summarize
    from colltrace.tracefile import reader

    snap = postmortem.load(directory, prefix)
    threshold = stall_s if stall_s is not None else reader.job_stall_s(snap)
    return snap, summarize(analyze(snap, stall_s=threshold, now=snap["taken_at"]))
