"""`colltrace dashboard DIR | --store HOST:PORT`: the live web dashboard in the foreground, and its starter for
watchdogs."""
from __future__ import annotations

import os
import sys
from typing import cast

from colltrace.commands import flags

NEEDS = "the dashboard needs: pip install 'colltrace[dashboard]'"
EXTRA = ("fastapi", "uvicorn", "jinja2", "prometheus_client", "fastapi_offline", "colltrace_dashboard")


def require_extra() -> None:
    """UsageError (one line, exit 2) unless the `dashboard` extra is installed."""
    import importlib

    from colltrace.errors import UsageError

    for name in EXTRA:
        try:
            importlib.import_module(name)
        except ImportError:
            raise UsageError(NEEDS) from None


def watchdog_starter():
    """What a watchdog calls to serve the dashboard from its process (COLLTRACE_DASHBOARD), or
    None without the `dashboard` extra: the watchdog then says in one line what to install.
    Entry points pass it in; the watchdog itself never imports the dashboard."""
    try:
        from colltrace_dashboard.server import start_for_watchdog
    except ImportError:
        return None
    return start_for_watchdog


class DashboardCommand:
    name = "dashboard"
    help = ("Serve the live web dashboard (findings, ranks, groups, recent collectives, /api, /metrics) for a "
            "trace folder, live or post-mortem, or for a running job's store.")

    def prepare_parser(self, p):
        p.add_argument("dir", nargs="?", help="the trace folder (COLLTRACE_DIR of the job): live or post-mortem")
        p.add_argument("--store", metavar="HOST:PORT",
                       help="read a running job through its TCPStore (MASTER_ADDR:MASTER_PORT) instead of a folder")
        p.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; any other needs a token)")
        p.add_argument("--port", type=flags.port, default=8765, help="port (default 8765; 0 picks a free one)")
        p.add_argument("--token", help="token every request must carry (default: $COLLTRACE_DASHBOARD_TOKEN)")
        flags.add_stall_s(p, "stall threshold in seconds (default: the job's COLLTRACE_STALL_S)")

    def run(self, args, parser) -> int:
        from colltrace.errors import UsageError

        if (args.dir is None) == (args.store is None):
            raise UsageError("give a trace folder or --store HOST:PORT (one of them)")
        if args.dir is not None and not os.path.isdir(args.dir):
            raise UsageError(f"{args.dir}: no such folder")
        if args.dir is not None:
            from colltrace.tracefile import postmortem

            args.dir = postmortem.resolve(args.dir)
        if not 0 <= args.port < 65536:
            raise UsageError(f"--port {args.port}: not a port number")
        if args.stall_s is not None and args.stall_s < 0:
            raise UsageError("--stall-s must be >= 0")
        require_extra()   # the web stack is an optional extra, imported only here
        from colltrace import config
        from colltrace_dashboard import server, sources

        token = (args.token or config.value("dashboard_token")).strip() or None
        # SourceError and DashboardError are ColltraceErrors: one line, exit 2
        source: sources.StoreSource | sources.FolderSource
        if args.store:
            source = sources.StoreSource(args.store, stall_s=args.stall_s)
        else:   # DIR given, as checked above (but for an empty --store '')
            source = sources.FolderSource(cast(str, args.dir), stall_s=args.stall_s)
        srv = server.Server(source, args.host, args.port, token=token)
        sys.stderr.write(f"colltrace: dashboard for {source.label} at {srv.url}"
                         f"{' (token required)' if token else ''}; Ctrl-C to stop\n")
        sys.stderr.flush()
        srv.run()
        return 0
