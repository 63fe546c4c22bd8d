"""`colltrace run [opts] -- CMD`: runs a job under colltrace, its watchdog in this process, and prints the next command."""
from __future__ import annotations

import os
import re
import sys
import threading
import time

from colltrace import config


_FLOATS = ("stall_s", "abort_stall_s", "straggler_share")


def _plain(markdown: str) -> str:
    """The README's words as a flag's help: no backquotes, links as their text."""
    return re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", markdown).replace("`", "").replace("*", "")


class RunCommand:
    name = "run"
    help = "Run a job under colltrace (colltrace run [options] -- torchrun ... | python script.py)."

    def prepare_parser(self, p):
        p.add_argument("--dir", help="trace folder (default: colltrace-out/run-<time>)")
        for v in config.VARIABLES:   # the settings table's flags (README, "Variables")
            if v.flag is not None:
                p.add_argument(v.flag, dest=v.field, metavar=v.metavar, type=float if v.field in _FLOATS else str,
                               choices=config.ON_HANG_CHOICES if v.field == "on_hang" else None,
                               help=f"{v.flag_help or _plain(v.meaning)} [env {v.env}]")

    def run(self, args, parser) -> int:
        from colltrace.commands import job as jobs

        jobs.first_process()   # as a container's PID 1: a reaping parent stays behind
        with jobs.held() as job:   # before any thread starts: the signals are the job's
            code = self._run(args, parser, job)
        return job.exit_code(code)

    def _run(self, args, parser, job) -> int:
        from colltrace.errors import UsageError

        if not args.job_argv:
            raise UsageError("nothing to run: give the job after --, e.g. colltrace run -- torchrun --nproc-per-node 4 train.py")
        flags = {v: getattr(args, v.field) for v in config.VARIABLES if v.flag and getattr(args, v.field) is not None}
        for v, value in flags.items():
            if v.field in _FLOATS and value < 0:
                raise UsageError(f"{v.flag} must be >= 0")
        directory = args.dir or os.path.join(config.DEFAULT_DIR, time.strftime("run-%Y%m%d-%H%M%S"))
        os.makedirs(directory, exist_ok=True)
        env = dict(os.environ, COLLTRACE="1", COLLTRACE_DIR=directory, COLLTRACE_WATCHDOG="external")
        from colltrace import _boot

        if extra := _boot.checkout_path():   # from a checkout, not installed: the hook through PYTHONPATH
            env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in [env.get("PYTHONPATH")] if p])
        for v, value in flags.items():
            env[v.env] = _dashboard_bind(value, env) if v.field == "dashboard" else str(value)
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
            job.start(args.job_argv, env)
        except OSError as exc:
            stop.set()
            raise UsageError(f"cannot start {args.job_argv[0]!r}: {exc.strerror}") from None
        rc = job.wait()   # signals passed on to the job meanwhile
        time.sleep(2 * settings.poll_s)
        stop.set()
        thread.join(timeout=30)
        n = sum(1 for f in watchdog.findings if not f.superseded_by)
        gone = len(watchdog.findings) - n
        earlier = f" (and {gone} earlier stall superseded by {'it' if n == 1 else 'them'})" if gone else ""
        job.ended_by_colltrace = bool(watchdog.on_hang.ending)
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
    from colltrace.reporters.phrases import clock
    from colltrace.reporters.text import headline

    ending = watchdog.on_hang.ending
    standing = [f for f in watchdog.findings if not f.superseded_by]
    acted = [f for f in standing if ending and f.key == ending.get("finding")]
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
