"""`colltrace watch DIR`: a host's watchdog in the foreground, for jobs started with COLLTRACE_WATCHDOG=off."""
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
        from colltrace.commands.dashboard import watchdog_starter
        from colltrace.errors import UsageError
        from colltrace.host.watchdog import Watchdog

        if not os.path.isdir(args.dir):
            raise UsageError(f"{args.dir}: no such folder")
        settings = config.load()
        return Watchdog(args.dir, job=None, host=None, settings=settings, once=args.once,
                        start_dashboard=watchdog_starter() if settings.dashboard else None).run()
