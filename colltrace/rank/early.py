"""A rank seen before it joins: its recorder, started by the start-up hook from torchrun's
environment, before the program imports torch.

torchrun gives each worker its number and the job's size (RANK, WORLD_SIZE) and the store the job
meets in (MASTER_ADDR:MASTER_PORT, under TORCHELASTIC_RUN_ID). With them the rank's trace and its
host's watchdog exist from the interpreter's start: a rank that never reaches init_process_group
(its data loading hangs first) is a member the others wait for in init_process_group #1, seen
where it is (its live stack); one that waits in it is seen waiting. Without them (a test harness,
mp.spawn) the recorder starts at init_process_group, as before.

Costs the start of every such worker about 40 ms of CPU (colltrace's modules, a ring file;
benchmarks/setup_costs.py), small beside torch's import: torch is not imported. A process the rank
starts (a spawned DataLoader worker, a compile worker) inherits the environment: it finds the rank's
ring held by a live process, not itself, and stays out.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from colltrace.rank.recorder import Recorder

_recorder: Recorder | None = None


def torchrun_rank(environ=os.environ) -> tuple[int, int] | None:
    """(rank, world size) of a worker torchrun started, else None."""
    if "TORCHELASTIC_RUN_ID" not in environ:
        return None
    rank, world = environ.get("RANK", "").strip(), environ.get("WORLD_SIZE", "").strip()
    if not (rank.isdigit() and world.isdigit()) or int(rank) >= int(world):
        return None
    return int(rank), int(world)


def _held(directory: str, rank: int) -> bool:
    """Whether another live process writes this rank's ring (the rank that started this one)."""
    from colltrace.tracefile import ringfile
    from colltrace.tracefile.layout import rank_file

    try:
        with open(rank_file(directory, rank, "ring"), "rb") as f:
            head = f.read(ringfile.HEADER.size)
        pid = ringfile.HEADER.unpack(head)[5]
    except (OSError, ValueError, Exception):
        return False
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True   # alive, another user's
    return True


def start(environ=os.environ) -> None:
    """The start-up hook's: this worker's recorder and its host's watchdog, where torchrun says who
    it is. Never raises (the hook reports a failure in one line)."""
    global _recorder
    me = torchrun_rank(environ)
    where = None
    if me is not None:
        from colltrace.rank import identity

        where = identity.env_store_id(environ)
    if me is None or where is None or _recorder is not None:
        return
    from colltrace import config

    settings = config.load(environ)
    rank, world = me
    if _held(settings.dir, rank):
        return
    from colltrace.rank import identity, launcher, setup
    from colltrace.rank.recorder import Recorder
    from colltrace.tracefile import storage

    try:
        rec = Recorder(settings, rank, world, "", job=identity.job_id(environ=environ, where=where))
    except storage.StorageError:   # a full trace folder: said once, at init_process_group, as ever
        return
    rec.store_id = where
    rec.lasting = setup.lasting   # the store waits that last are recorded
    setup.job_group(rec)   # every member of the job's group creations named, before any is made
    _recorder = rec
    os.register_at_fork(after_in_child=_forked)
    launcher.ensure_watchdog(settings, rec, None)


def _forked() -> None:
    """A child forked before torch was imported writes nothing into its parent's trace."""
    global _recorder
    if _recorder is not None:
        _recorder.disabled = True
        _recorder = None


def recorder():
    """The recorder started here, for the shim to adopt (None if none, or it stepped aside)."""
    return _recorder if _recorder is not None and not _recorder.disabled else None
