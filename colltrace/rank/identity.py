"""The job's identity: one string, the same on every rank of one job and different between jobs.

torchrun's run id alone is not enough ("none" for every job without --standalone, none at all
for ranks a test harness spawns), nor is the launcher's pid (one pytest process spawns every
test's ranks). The default group's store is: each job makes its own (a TCPStore's address,
a FileStore's file), read here from c10d's record of it, without a request on it.
"""
from __future__ import annotations

import os

# Begins the part of a job id that differs by host; the readers' half, the part every host of a job
# has (shared_job), is the trace format's: colltrace/tracefile/ringfile.py.
from colltrace.tracefile.ringfile import HOST_PART


def _real(store):
    """The store under any PrefixStore."""
    for _ in range(16):   # PrefixStore(PrefixStore(...)): find the real one
        inner = getattr(store, "underlying_store", None)
        if inner is None:
            break
        store = inner
    return store


def store_id(store) -> str:
    """'tcp:HOST:PORT', 'file:PATH', or the store's type: the store under any PrefixStore."""
    store = _real(store)
    kind = type(store).__name__
    try:
        if kind == "TCPStore":
            return f"tcp:{store.host}:{store.port}"
        if kind == "FileStore":
            return f"file:{os.path.abspath(store.path)}"
    except Exception:   # a store without host/path attributes (a pybind variant): its type names it
        pass
    return kind


def store_address(store) -> tuple[str, int] | None:
    """A TCPStore's (HOST, PORT), under any PrefixStore: where the watchdogs of the job's hosts
    can meet. None for any other store (a FileStore, a HashStore: nothing to meet in)."""
    store = _real(store)
    if type(store).__name__ != "TCPStore":
        return None
    try:
        return str(store.host), int(store.port)
    except Exception:   # a TCPStore whose host/port cannot be read (a closed one): nothing to meet in
        return None


def env_store_id(environ=os.environ) -> str | None:
    """store_id of the store torchrun's worker will meet its job in (env://: MASTER_ADDR:MASTER_PORT,
    the agent's own store or one rank 0 serves there), known before init_process_group makes it."""
    addr, port = environ.get("MASTER_ADDR", "").strip(), environ.get("MASTER_PORT", "").strip()
    return f"tcp:{addr}:{port}" if addr and port.isdigit() else None


def job_id(store=None, environ=os.environ, where: str | None = None) -> str:
    """run id @ store (where: the store's id, known without it). Without a run id that names the
    job, the launcher's pid is added after HOST_PART: it tells apart jobs run one after another on
    the same port, on one host."""
    run = environ.get("TORCHELASTIC_RUN_ID") or ""
    if where is None:
        where = store_id(store) if store is not None else f"port{environ.get('MASTER_PORT', '')}"
    if run and run != "none":
        return f"{run}@{where}"
    return f"{run or 'job'}@{where}{HOST_PART}{os.getppid()}"
