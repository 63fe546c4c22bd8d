"""`python -m colltrace.host`: one host's watchdog as a process of its own (the ranks' launcher
starts it; colltrace/rank/launcher.py)."""
from __future__ import annotations

import argparse
import os
import signal
import sys

from colltrace import config
from colltrace.commands.dashboard import watchdog_starter
from colltrace.host import storelink
from colltrace.host.watchdog import Watchdog


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m colltrace.host")
    p.add_argument("--dir", required=True)
    p.add_argument("--job")
    p.add_argument("--host")
    p.add_argument("--spawned-by", type=int,
                   help="the rank that started it: gone before any rank was seen, nothing to watch")
    p.add_argument("--store", help="HOST:PORT of the TCPStore the job's default group was made with, or off "
                                   "(the rank that starts the watchdog says which; "
                                   "without it, MASTER_ADDR:MASTER_PORT)")
    p.add_argument("--once", action="store_true")
    args = p.parse_args(argv)
    settings = config.load()
    os.makedirs(args.dir, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    try:
        address = storelink.address_from_env(job_store=args.store)
    except storelink.StoreError as exc:
        sys.stderr.write(f"colltrace: warning: COLLTRACE_STORE: {exc}; watching without the store\n")
        address = None
    wd = Watchdog(args.dir, args.job, args.host, settings, once=args.once, store_address=address,
                  start_dashboard=watchdog_starter() if settings.dashboard else None)
    try:
        return wd.run(spawner=args.spawned_by)
    finally:   # SIGTERM too: never leave our key in the job's store
        wd.close()


def _leave(code) -> None:
    """Exit without Python's finalization. A thread may still be inside c10d's connect to a store
    that does not answer: finalization ends it in C++, and libstdc++ prints "terminate called
    without an active exception" to the rank's stderr, which this process shares."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:   # a stream closed or broken at exit: nothing left to say, the exit goes on
            pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


if __name__ == "__main__":
    code: str | int | None
    try:
        code = main()
    except SystemExit as exc:   # SIGTERM, argparse's errors
        code = exc.code
    _leave(code)
