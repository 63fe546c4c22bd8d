from __future__ import annotations

import json
import sys

from colltrace import samekind, trace


class AnalyzeCommand:
    name = "analyze"
    help = "Find deadlocks, mismatches, stalls and dead ranks in a trace folder (post-mortem)."

    def prepare_parser(self, p):
        p.add_argument("dir", help="the trace folder (COLLTRACE_DIR of the job)")
        p.add_argument("--json", action="store_true", help='print {"findings": [...]}')
        p.add_argument("--stall-s", type=float, default=None,
                       help="stall threshold in seconds (default: the job's COLLTRACE_STALL_S)")

    def run(self, args, parser) -> int:
        from colltrace.analysis import analyze, render_report
        from colltrace.commands import UsageError

        try:
            snap = trace.load_snapshot(args.dir)
        except trace.TraceError as exc:
            raise UsageError(str(exc)) from None
        stall_s = args.stall_s if args.stall_s is not None else trace.job_stall_s(snap)
        findings = analyze(snap, stall_s=stall_s, now=snap["taken_at"])
        samekind.annotate(findings)
        warnings = _warnings(snap)
        if args.json:
            json.dump({"findings": findings, "warnings": warnings}, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(render_report(findings) + "\n")
            if warnings:
                from colltrace.analysis import desync
                sys.stdout.write("\n" + desync.render(warnings) + "\n")
        return 1 if findings else 0   # warnings alone: the run is not wrong (yet)


def _warnings(snap: dict) -> list[dict]:
    """Silent desyncs (colltrace/analysis/desync.py): warnings, never a reason to fail."""
    from colltrace.analysis import desync
    from colltrace.analysis.snapshot import Snapshot

    try:
        return desync.find(Snapshot(snap))
    except (TypeError, ValueError, KeyError, AttributeError):
        return []
