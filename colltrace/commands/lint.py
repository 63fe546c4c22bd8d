"""`colltrace lint PATH...`: the static check of Python sources for collective patterns that hang jobs."""
from __future__ import annotations

import json
import os
import sys


class LintCommand:
    name = "lint"
    help = "Check Python sources for collective patterns that hang distributed jobs (static; no torch import)."

    def prepare_parser(self, p):
        p.add_argument("paths", nargs="+", metavar="PATH", help="Python files or folders (searched recursively)")
        p.add_argument("--json", action="store_true", help='print {"findings": [...], "files": N}')
        p.add_argument("--select", default=None, metavar="RULE[,RULE]",
                       help="check only these rules (default: all)")

    def run(self, args, parser) -> int:
        from colltrace.callsites import lint
        from colltrace.errors import UsageError
        from colltrace.words import counted

        select = set(lint.RULES)
        if args.select:
            select = {r.strip() for r in args.select.split(",") if r.strip()}
            unknown = select - set(lint.RULES)
            if unknown:
                raise UsageError(f"unknown rule {sorted(unknown)[0]!r}; one of: {', '.join(lint.RULES)}")
        for p in args.paths:
            if not os.path.exists(p):
                raise UsageError(f"{p}: no such file or folder")
        files = lint.python_files(args.paths)
        if not files:   # nothing checked is no clean bill
            raise UsageError(f"no Python files in {', '.join(args.paths)}")
        findings, unchecked = [], 0
        for path in files:
            # A file that cannot be read or parsed is named on stderr and the others are still
            # checked; the exit code is then 2: the run cannot vouch for that file.
            try:
                findings += [f for f in lint.check_file(path) if f.rule in select]
            except SyntaxError as exc:
                unchecked += 1
                sys.stderr.write(f"colltrace: error: {path}:{exc.lineno}: cannot parse: {exc.msg}\n")
            except (OSError, ValueError, RecursionError) as exc:
                unchecked += 1
                sys.stderr.write(f"colltrace: error: {path}: cannot read: {exc}\n")
        if args.json:
            doc = {"files": len(files) - unchecked, "unchecked": unchecked,
                   "findings": [lint.as_dict(f) for f in findings]}
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            for f in findings:
                sys.stdout.write(f.text() + "\n")
            sys.stdout.write(f"colltrace lint: {counted(len(findings), 'finding')} "
                             f"in {counted(len(files) - unchecked, 'file')}"
                             + (f" ({unchecked} could not be checked)" if unchecked else "") + "\n")
        if unchecked:
            return 2
        return 1 if findings else 0
