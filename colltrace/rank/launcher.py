"""Starts the node watchdog from inside a job when nothing outside started one.

The first rank on a host to create the claim file spawns it, in a new session so the
launcher's teardown (torchrun SIGTERMs its workers' group within about a second of one
dying) does not take it down with the workers.
"""
from __future__ import annotations

import os
import subprocess
import sys

from colltrace.rank import identity
from colltrace.tracefile import storage

_child = None  # kept referenced so the interpreter does not warn about a running child


def claim_path(directory: str, host: str, job: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{host}-{job}")
    if len(safe) > 120:   # a job id with a long FileStore path: keep the name within NAME_MAX
        import hashlib

        safe = safe[:80] + "-" + hashlib.sha1(safe.encode()).hexdigest()[:16]
    return os.path.join(directory, f".watchdog-{safe}.claim")


def watchdog_env(environ=os.environ) -> dict:
    env = dict(environ)
    env.pop("COLLTRACE", None)  # the watchdog itself is not traced
    # Its stderr is the rank's: c10d's C++ lines for each failed connect to a store would land in
    # the user's output. Its own one-line warning says what matters.
    env["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    return env


def store_arg(store) -> list[str]:
    """The watchdog's --store: the TCPStore the job's default group was made with, or "off" (a
    FileStore, a HashStore); nothing where the rank could not find its store. MASTER_ADDR/PORT
    may be another job's, long gone (an earlier test's, in a test session)."""
    if store is None:
        return []
    where = identity.store_address(store)
    if where is None:
        return ["--store", "off"]
    host = f"[{where[0]}]" if ":" in where[0] else where[0]   # IPv6
    return ["--store", f"{host}:{where[1]}"]


def ensure_watchdog(settings, rec, store=None) -> None:
    global _child
    if settings.watchdog != "auto":
        return
    job = rec.job
    path = claim_path(settings.dir, settings.host, job)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    except OSError as exc:   # a full folder: the ranks are traced, nobody watches them live
        storage.warn_once("claim", f"no watchdog: cannot create {path}: {storage.describe(exc)}")
        return
    try:
        cmd = [sys.executable, "-m", "colltrace.host", "--dir", settings.dir, "--job", job,
               "--host", settings.host, "--spawned-by", str(os.getpid()), *store_arg(store)]
        _child = subprocess.Popen(cmd, env=watchdog_env(), stdin=subprocess.DEVNULL,
                                  start_new_session=True, close_fds=True)
        os.write(fd, f"{_child.pid}\n".encode())
    except OSError as exc:   # the pid is only informative; a watchdog that did not start is said once
        if _child is None:
            storage.warn_once("claim", f"no watchdog: {storage.describe(exc)}")
    finally:
        os.close(fd)
