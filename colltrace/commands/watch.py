from __future__ import annotations


class WatchCommand:
    name = "watch"
    help = "Watch a trace folder live and report problems (when the job was started with COLLTRACE_WATCHDOG=off)."

    def prepare_parser(self, p):
        p.add_argument("dir")
        p.add_argument("--once", action="store_true", help="one round of analysis, then exit")

    def run(self, args, parser) -> int:
        import os

        from colltrace import config
        from colltrace.errors import UsageError
        from colltrace.host.watchdog import Watchdog

        if not os.path.isdir(args.dir):
            raise UsageError(f"{args.dir}: no such folder")
        return Watchdog(args.dir, job=None, host=None, settings=config.load(), once=args.once).run()
