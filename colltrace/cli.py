"""`colltrace` command line: one class per subcommand (colltrace/commands), registered in one list.

Exit codes (colltrace/errors.py): 0 ran and found nothing wrong, 1 found problems, 2 bad usage or
unreadable input; any ColltraceError a command raises is one line on stderr and its exit code.
"""
from __future__ import annotations

import argparse
import re
import sys

from colltrace import __version__
from colltrace.commands import COMMANDS
from colltrace.errors import ColltraceError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        sys.stderr.write(f"colltrace: error: {message}\n")
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):
        # An unknown flag is named before a missing argument: `colltrace analyze --bogus` is about
        # --bogus, not the folder argparse would ask for first.
        if args is not None and self._subparsers is None:
            unknown = _unknown_option(self, args)
            if unknown:
                self.error(f"unrecognized arguments: {unknown}")
        return super().parse_known_args(args, namespace)


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _unknown_option(parser: argparse.ArgumentParser, args) -> str | None:
    """The first token of `args` that looks like a flag this parser does not know (by name or
    abbreviation); negative numbers are values."""
    known = parser._option_string_actions
    for token in args:
        if token == "--":
            break
        if not token.startswith("-") or token == "-" or _NUMBER.match(token):
            continue
        name = token.split("=", 1)[0]
        if name in known or (name.startswith("--") and any(o.startswith(name) for o in known)):
            continue
        return token
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="colltrace", description="Find which rank is missing from which collective, and where it is.")
    parser.add_argument("--version", action="version", version=f"colltrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for cls in COMMANDS:
        cmd = cls()
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.prepare_parser(p)
        p.set_defaults(_command=cmd)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    # `colltrace run [opts] -- cmd ...`: everything after -- is the job, untouched by argparse
    job = None
    if "--" in argv:
        i = argv.index("--")
        argv, job = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    if not getattr(args, "_command", None):
        parser.print_help(sys.stderr)
        return 2
    args.job_argv = job
    try:
        return args._command.run(args, parser)
    except ColltraceError as exc:
        sys.stderr.write(f"colltrace: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
