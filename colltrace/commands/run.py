"""`colltrace run [opts] -- CMD`: runs a job under colltrace, its watchdog in this process, and prints the next
command."""
from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import cast

from colltrace import config
from colltrace.commands import joboutput

_FLOATS = ("stall_s", "abort_stall_s", "straggler_share")


def _plain(markdown: str) -> str:
    """The README's words as a flag's help: no backquotes, links as their text."""
    return re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", markdown).replace("`", "").replace("*", "")


class RunCommand:
    name = "run"
    help = "Run a job under colltrace (colltrace run [options] -- torchrun ... | python script.py)."

    def prepare_parser(self, p):
        p.add_argument("--dir", help="trace folder (default: colltrace-out/run-<time>)")
        p.add_argument("--no-fold", action="store_true",
                       help="pass the job's stderr on untouched: the launcher's failure report and the ranks' "
                            "tracebacks in full (by default, where colltrace knows why each rank failed, they "
                            "are folded to one line and kept whole in DIR/launcher.txt)")
        for v in config.VARIABLES:   # the settings table's flags (README, "Variables")
            if v.flag is not None:
                p.add_argument(v.flag, dest=v.field, metavar=v.metavar, type=float if v.field in _FLOATS else str,
                               choices=config.ON_HANG_CHOICES if v.field == "on_hang" else None,
                               help=f"{v.flag_help or _plain(v.meaning)} [env {v.env}]")
        p.usage = p.format_usage().split(":", 1)[1].strip() + " -- CMD [ARG ...]"   # the job, after --

    def run(self, args, parser) -> int:
        from colltrace.commands import job as jobs

        jobs.first_process()   # as a container's PID 1: a reaping parent stays behind
        with jobs.held() as job:   # before any thread starts: the signals are the job's
            code = self._run(args, parser, job)
        return job.exit_code(code)

    def _run(self, args, parser, job) -> int:
        from colltrace.errors import UsageError

        if not args.job_argv:
            raise UsageError("nothing to run: give the job after --, e.g. "
                             "colltrace run -- torchrun --nproc-per-node 4 train.py")
        # a row with a flag has a field: the flag's dest (prepare_parser)
        flags = {v: getattr(args, cast(str, v.field)) for v in config.VARIABLES
                 if v.flag and getattr(args, cast(str, v.field)) is not None}
        for v, value in flags.items():
            if v.field in _FLOATS and value < 0:
                raise UsageError(f"{v.flag} must be >= 0")
        directory = args.dir or _new_run_dir()
        os.makedirs(directory, exist_ok=True)
        env = dict(os.environ, COLLTRACE="1", COLLTRACE_DIR=directory, COLLTRACE_WATCHDOG="external")
        from colltrace import _boot

        if extra := _boot.checkout_path():   # from a checkout, not installed: the hook through PYTHONPATH
            env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in [env.get("PYTHONPATH")] if p])
        for v, value in flags.items():
            env[v.env] = _dashboard_bind(value, env) if v.field == "dashboard" else str(value)
        settings = config.load(env)
        # The watchdog runs here, outside the job: a launcher tearing its workers down cannot take it along.
        from colltrace.commands.dashboard import watchdog_starter
        from colltrace.host.watchdog import Watchdog

        watchdog = Watchdog(directory, job=None, host=None, settings=settings,
                            start_dashboard=watchdog_starter() if settings.dashboard else None)
        stop = threading.Event()
        if settings.dashboard:
            watchdog.serve_dashboard()   # before the job, so its address comes first
        thread = threading.Thread(target=watchdog.run, kwargs={"stop": stop}, name="colltrace-watchdog", daemon=True)
        thread.start()
        sys.stderr.write(f"colltrace: tracing into {directory}\n")
        relay = None if args.no_fold else joboutput.Relay(sys.stderr, lambda: _explains_failures(watchdog))
        try:
            job.start(args.job_argv, env, stderr=relay.child_fd if relay else None)
        except OSError as exc:
            stop.set()
            raise UsageError(f"cannot start {args.job_argv[0]!r}: {exc.strerror}") from None
        finally:
            if relay is not None:
                relay.start()
        rc = job.wait()   # signals passed on to the job meanwhile
        time.sleep(2 * settings.poll_s)
        stop.set()
        thread.join(timeout=30)
        job.ended_by_colltrace = bool(watchdog.on_hang.ending)
        held = relay.finish() if relay is not None else None
        sys.stderr.write(_after_job(watchdog, settings, held, directory, rc))
        return job_exit_code(rc)


def job_exit_code(rc: int) -> int:
    """colltrace run exits with the job's own code, findings or not (README, docs/findings.md); a
    job ended by a signal (negative here) gives 1, which run() turns into that signal's death
    unless colltrace ended the job (job.Job.exit_code)."""
    return rc if rc >= 0 else 1


def _new_run_dir() -> str:
    """colltrace-out/run-<start time>; a second run started within the same second gets its own."""
    base = os.path.join(config.DEFAULT_DIR, time.strftime("run-%Y%m%d-%H%M%S"))
    directory, n = base, 1
    while os.path.exists(directory):
        n += 1
        directory = f"{base}-{n}"
    return directory


def _explains_failures(watchdog) -> bool:
    """Whether colltrace knows why ranks fail now: it ended ranks, or found one dead (the others'
    collectives then fail, and the launcher ends the rest)."""
    from colltrace.model.finding import DeadRank

    ending = watchdog.on_hang.ending
    return bool(ending and ending.get("ranks")) or any(
        isinstance(f, DeadRank) and not f.superseded_by for f in list(watchdog.findings))


def _after_job(watchdog, settings, held, directory: str, rc: int) -> str:
    """After the job's own output: the launcher's report folded where colltrace knows why each rank
    failed (or shown whole), how colltrace ended the ranks, the verdict, the exit line, the next
    command. The verdict comes last but for where to look next."""
    from colltrace.analysis import HANG_KINDS
    from colltrace.model.finding import DeadRank
    from colltrace.reporters import ending as words
    from colltrace.reporters.text import headline
    from colltrace.words import counted

    standing = [f for f in watchdog.findings if not f.superseded_by]
    ending = watchdog.on_hang.ending
    text = ""
    if held is not None and (held.report or held.tracebacks):
        killed = set((ending or {}).get("ranks") or {})
        dead = {int(f.rank): (f.exit or {}).get("signal") for f in standing if isinstance(f, DeadRank)}
        groups = joboutput.explain(held, killed, dead) if held.report else []
        path = joboutput.write_log(directory, held) if groups is not None else None
        if path is None:
            joboutput.release(sys.stderr, held)
        else:
            if held.tracebacks:
                tbs = held.tracebacks
                text += words.folded_tracebacks_line(sorted({t.rank for t in tbs}), tbs[0].exception, len(tbs), path)
            if groups:
                text += words.folded_report_line(groups, sorted(dead), len(held.report), path)
    signalled = sorted((ending or {}).get("ranks") or {})
    codes = {f.rank: f.code for f in held.failures()} if held is not None else {}
    ended = [r for r in signalled if codes.get(r, -9) == -9]   # the launcher saw their SIGKILL, not its own SIGTERM
    text += words.ending_line(ending, ended, settings.on_hang, any(f.kind in HANG_KINDS for f in standing),
                              already=[r for r in signalled if r not in ended])
    acted = [f for f in standing if ending and f.key == ending.get("finding")]
    if standing:
        text += f"colltrace: verdict: {headline((acted or standing)[0])}\n"
    n, gone = len(standing), len(watchdog.findings) - len(standing)
    earlier = f" (and {gone} earlier stall superseded by {'it' if n == 1 else 'them'})" if gone else ""
    text += (f"colltrace: job exited with code {rc}; {counted(n, 'finding')}{earlier}; trace in {directory}\n"
             f"next: colltrace analyze {directory}   (or: colltrace dump {directory}"
             f"{', or: colltrace dashboard ' + directory if watchdog.dashboard else ''})\n")
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
