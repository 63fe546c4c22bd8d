"""`colltrace export DIR --perfetto OUT.json`: a timeline of a trace folder or Flight Recorder dumps for
ui.perfetto.dev."""
from __future__ import annotations

import json
import os
import sys

from colltrace.commands import flags
from colltrace.tracefile import postmortem


class ExportCommand:
    name = "export"
    help = "Write a Chrome/Perfetto timeline (ui.perfetto.dev) of a trace folder or of Flight Recorder dumps."

    def prepare_parser(self, p):
        p.add_argument("dir", help="the trace folder, or a folder of Flight Recorder dumps")
        p.add_argument("--perfetto", metavar="OUT.json", required=True,
                       help="the file to write (Chrome trace event JSON; open it in ui.perfetto.dev)")
        flags.add_frdump_prefix(p, "Flight Recorder dumps: the file name before the rank")
        flags.add_stall_s(p, "stall threshold for the findings drawn")

    def run(self, args, parser) -> int:
        from colltrace.commands.analyze import judged, say_damage  # the verdict `colltrace analyze` shows
        from colltrace.errors import UsageError
        from colltrace.reporters import timeline
        from colltrace.words import counted

        args.dir = postmortem.resolve(args.dir)
        snap, v = judged(args.dir, args.prefix, args.stall_s)   # InputError: exit 2
        say_damage(v.damage)
        findings = v.findings
        doc = timeline.build(snap, findings, v.culprits)
        tmp = args.perfetto + ".tmp"
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps(doc, default=str))
            os.replace(tmp, args.perfetto)
        except OSError as exc:
            raise UsageError(f"{args.perfetto}: cannot be written ({exc.strerror or exc})") from None
        n = sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
        sys.stderr.write(f"colltrace: wrote {args.perfetto} ({counted(len(snap['ranks']), 'rank')}, "
                         f"{counted(n, 'slice')}, {counted(len(findings), 'finding')}); open it in https://ui.perfetto.dev\n")
        return 0
