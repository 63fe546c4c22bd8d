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
        p.add_argument("--json", action="store_true", help='print {"findings": [...], "culprits": [...]}')
        p.add_argument("--stall-s", type=float, default=None,
                       help="stall threshold in seconds (default: the job's COLLTRACE_STALL_S; 0 for Flight "
                            "Recorder dumps, which are written when a collective timed out)")
        p.add_argument("--prefix", default=None,
                       help="Flight Recorder dumps: the file name before the rank (default: the one prefix the "
                            "rank-numbered files share, e.g. nccl_trace_rank_)")

    def run(self, args, parser) -> int:
        from colltrace.analysis import culprits
        from colltrace.reporters.text import render_report

        args.dir = postmortem.resolve(args.dir)
        snap, findings = postmortem.analyzed(args.dir, args.prefix, args.stall_s)   # InputError: exit 2
        samekind.annotate(findings)   # reads the user's source files: after the (pure) analysis
        verdict = culprits.explain(findings)
        warnings = _warnings(snap)
        if args.json:
            json.dump({"findings": findings, "culprits": verdict["culprits"], "warnings": warnings}, sys.stdout,
                      indent=2, default=str)
            sys.stdout.write("\n")
        else:
            text = self._text(findings, verdict, render_report)
            sys.stdout.write(text + "\n")
            if warnings:
                from colltrace.reporters.text import render_warnings
                sys.stdout.write("\n" + render_warnings(warnings) + "\n")
        return EXIT_FOUND if findings else EXIT_OK   # warnings alone: the run is not wrong (yet)

    @staticmethod
    def _text(findings, verdict, render_report) -> str:
        """The culprits first; findings that are only work stuck behind them (NCCL queues a whole
        step behind one stuck rank) are counted, not printed: --json lists every one."""
        from colltrace.reporters.text import culprit_paragraph

        paragraph = culprit_paragraph(verdict["culprits"], verdict["reasons"], verdict["others"])
        if not paragraph:
            return render_report(findings)
        behind = set(verdict["consequences"])
        shown = [f for f in findings if f.get("key") not in behind]
        text = paragraph + "\n\n" + render_report(shown)
        if len(shown) < len(findings):
            text += (f"\n\n{len(findings) - len(shown)} more findings are collectives stuck behind the culprits "
                     f"on the other ranks (every member arrived; the work never completes): see --json.")
        return text


def _warnings(snap: dict) -> list[dict]:
    """Silent desyncs (colltrace/analysis/desync.py): warnings, never a reason to fail."""
    from colltrace.analysis import desync
    from colltrace.analysis.view import Snapshot

    try:
        return desync.find(Snapshot(snap))
    except (TypeError, ValueError, KeyError, AttributeError):
        return []
