"""`colltrace run [opts] -- CMD`: runs a job under colltrace, its watchdog in this process, and prints the next command."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from colltrace import config


class RunCommand:
    name = "run"
    help = "Run a job under colltrace (colltrace run [options] -- torchrun ... | python script.py)."

    def prepare_parser(self, p):
        p.add_argument("--dir", help="trace folder (default: colltrace-out/run-<time>)")
        p.add_argument("--stall-s", type=float, help="seconds ranks may wait for a missing rank before a stall finding")
        p.add_argument("--on-hang", choices=config.ON_HANG_CHOICES, help="warn (default), dump stacks, or abort the job")
        p.add_argument("--user-packages", metavar="NAME[,NAME...]",
                       help="installed packages that are your own code (an installed library of yours): verdicts "
                            "name their lines like your scripts' [env COLLTRACE_USER_PACKAGES]")
        p.add_argument("--abort-stall-s", type=float,
                       help="with --on-hang abort: also end a stall whose missing ranks still compute, after this "
                            "many seconds (default: never; frozen ones are ended at once)")
        p.add_argument("--dashboard", metavar="[HOST:]PORT",
                       help="serve the live dashboard while the job runs (127.0.0.1 unless HOST is given; "
                            "another HOST needs COLLTRACE_DASHBOARD_TOKEN; port 0 picks a free one)")

    def run(self, args, parser) -> int:
        from colltrace.errors import UsageError

        if not args.job_argv:
            raise UsageError("nothing to run: give the job after --, e.g. colltrace run -- torchrun --nproc-per-node 4 train.py")
        if args.stall_s is not None and args.stall_s < 0:
            raise UsageError("--stall-s must be >= 0")
        if args.abort_stall_s is not None and args.abort_stall_s < 0:
            raise UsageError("--abort-stall-s must be >= 0")
        directory = args.dir or os.path.join(config.DEFAULT_DIR, time.strftime("run-%Y%m%d-%H%M%S"))
        os.makedirs(directory, exist_ok=True)
        env = dict(os.environ, COLLTRACE="1", COLLTRACE_DIR=directory, COLLTRACE_WATCHDOG="external")
        if args.stall_s is not None:
            env["COLLTRACE_STALL_S"] = str(args.stall_s)
        if args.on_hang:
            env["COLLTRACE_ON_HANG"] = args.on_hang
        if args.user_packages is not None:
            env["COLLTRACE_USER_PACKAGES"] = args.user_packages
        if args.abort_stall_s is not None:
            env["COLLTRACE_ABORT_STALL_S"] = str(args.abort_stall_s)
        if args.dashboard is not None:
            env["COLLTRACE_DASHBOARD"] = _dashboard_bind(args.dashboard, env)
        settings = config.load(env)
        from colltrace.host.watchdog import Watchdog

        # The watchdog runs here, outside the job: a launcher tearing its workers down cannot take it along.
        from colltrace.commands.dashboard import watchdog_starter

        watchdog = Watchdog(directory, job=None, host=None, settings=settings,
                            start_dashboard=watchdog_starter() if settings.dashboard else None)
        stop = threading.Event()
        if settings.dashboard:
            watchdog.serve_dashboard()   # before the job, so its address comes first
        thread = threading.Thread(target=watchdog.run, kwargs={"stop": stop}, name="colltrace-watchdog", daemon=True)
        thread.start()
        sys.stderr.write(f"colltrace: tracing into {directory}\n")
        try:
            child = subprocess.Popen(args.job_argv, env=env)
        except OSError as exc:
            stop.set()
            raise UsageError(f"cannot start {args.job_argv[0]!r}: {exc.strerror}") from None
        previous = signal.signal(signal.SIGINT, lambda *a: child.send_signal(signal.SIGINT))
        try:
            rc = child.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
        time.sleep(2 * settings.poll_s)
        stop.set()
        thread.join(timeout=30)
        n = sum(1 for f in watchdog.findings if not f.get("superseded_by"))
        gone = len(watchdog.findings) - n
        earlier = f" (and {gone} earlier stall superseded by {'it' if n == 1 else 'them'})" if gone else ""
        sys.stderr.write(_verdict_again(watchdog))
        sys.stderr.write(
            f"colltrace: job exited with code {rc}; {n} finding{'s' if n != 1 else ''}{earlier}; trace in {directory}\n"
            f"next: colltrace analyze {directory}   (or: colltrace dump {directory}"
            f"{', or: colltrace dashboard ' + directory if watchdog.dashboard else ''})\n")
        if rc:
            return rc if rc > 0 else 1
        return 1 if n else 0


def _verdict_again(watchdog) -> str:
    """After the job's own output (the launcher's report last): the verdict's first sentence
    once more, and, when colltrace ended the ranks, that the launcher's SIGKILL report is that."""
    from colltrace.reporters.text import clock, headline

    ending = watchdog.on_hang.ending
    standing = [f for f in watchdog.findings if not f.get("superseded_by")]
    acted = [f for f in standing if ending and f.get("key") == ending.get("finding")]
    if not standing:
        return ""
    text = f"colltrace: verdict: {headline((acted or standing)[0])}\n"
    if ending:
        text += (f"colltrace: the ranks reported above as killed by SIGKILL (exitcode: -9) were ended by colltrace "
                 f"at {clock(ending['at'])} (COLLTRACE_ON_HANG=abort: {ending['why']}): that is not a second failure\n")
    return text


def _dashboard_bind(text: str, env: dict) -> str:
    """--dashboard: checked before the job starts (bad address, missing extra or token: exit 2)."""
    from colltrace.errors import UsageError

    try:
        host, port = config.parse_bind(text)
    except ValueError as exc:
        raise UsageError(f"--dashboard: {exc}") from None
    from colltrace.commands.dashboard import require_extra

    require_extra()
    from colltrace_dashboard.server import DashboardError, check_bind

    try:
        check_bind(host, env.get("COLLTRACE_DASHBOARD_TOKEN", "").strip())
    except DashboardError as exc:
        raise UsageError(str(exc)) from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
