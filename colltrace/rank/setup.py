"""The calls that synchronize ranks without being collectives, recorded as collectives are.

Group creation: `init_process_group` (its rendezvous), `new_group`, `split_group` and what calls
them (`new_subgroups`, a `DeviceMesh`, `init_device_mesh`), a direct `_store_based_barrier`. torch
requires every rank of the job to make them, members or not, in the same order (a group's name is a
count of the groups made before it); `new_group(..., use_local_synchronization=True)` only its
members (from torch 2.14 on, counted among the job's all the same: _counted_by_the_job), and
`split_group` every member of its parent. Each call is a record in a group no process
group stands for (Recorder.virtual_group): "setup" for the job's, numbered per rank by the calls it
makes (init_process_group is #1), "setup:RANKS" for the members of a local one. Its signature
carries the ranks it asks for, so that two ranks making different groups at one number are a
mismatch, a rank that never makes one is missing from it, and the analyzer judges them as it judges
collectives. A call made inside another (new_subgroups' new_groups, a mesh's) is recorded where
torch synchronizes: each new_group, named by the API the program called.

Store waits: `Store.get` and `Store.wait` on the job's store, where a rank waits for a key another
rank must set. They are frequent inside torch and frameworks and almost always short: the wrapper
only notes the call (its thread, frame and start) in `Recorder.watched`; the recorder's poller
records the ones that last (`Recorder.lasting_s`) as waits in "store:KEY", a group whose wait any
member may end (any_of). Calls from C++ (gloo's and NCCL's rendezvous) are not seen, and cost nothing.
"""
from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
import zlib
from typing import Any

from colltrace.model.schema import LOCAL_SYNC, SETUP_LOCAL
from colltrace.model.schema import SETUP_GROUP as JOB
from colltrace.model.schema import STORE_WAIT as STORE_PREFIX
from colltrace.rank import patches
from colltrace.rank.calls import param_getter
from colltrace.words import format_ranks

JOB_DESC = "group creation: every rank of the job"
DETAIL_MAX = 120              # longer texts (a split of many ranks, a long key) end in their CRC

_c10d: Any = None             # torch.distributed.distributed_c10d, once installed
_shim: Any = None             # colltrace.rank.shim: its recorder is the one in use
_patches = patches.Patches()   # what install, install_mesh and watch_store_waits patched
_getframe = sys._getframe
_time = time.time
_get_ident = threading.get_ident


class _Local(threading.local):
    depth = 0       # >0 inside a recorded setup call: calls inside it are its parts
    api: str | None = None   # the API the program called that makes groups through new_group (new_subgroups, a mesh)


_local = _Local()


def _recorder():
    rec = _shim.recorder if _shim is not None else None
    return None if rec is None or rec.disabled else rec


def compact(text: str, limit: int = DETAIL_MAX) -> str:
    """A text as a record keeps it: whole, or cut with the whole one's CRC (still told apart)."""
    return text if len(text) <= limit else f"{text[:limit - 12]}… {zlib.crc32(text.encode()):08x}"


def local_name(members) -> str:
    """The group of the creations a group's members make alone, the same name on each of them."""
    return compact(f"{SETUP_LOCAL}{format_ranks(members)}", 64)


def store_name(keys: str) -> str:
    return compact(STORE_PREFIX + keys, 80)


def job_group(rec):
    return rec.virtual_group(JOB, JOB_DESC, range(rec.world_size))


def _number(rec, gs, init: bool = False) -> int:
    """The next number of a setup call in gs: init_process_group is the job's #1 (any other call
    needs the default group: it comes after)."""
    with rec._intern:
        gs.last_after = 1 if init and gs.last_after == 0 else gs.last_after + 1
        return gs.last_after


def _listed(ranks) -> list[int] | None:
    """The ranks as given, sorted; None where they cannot be read without consuming them (an
    iterator: torch reads it itself) or are none (every rank)."""
    if not isinstance(ranks, (list, tuple, range)):
        return None
    return sorted({int(r) for r in ranks})


def _members(ranks, world: int):
    """The ranks a call asks for as its record keeps them: None for every rank of the job."""
    rs = _listed(ranks)
    return None if rs is None or rs == list(range(world)) else tuple(rs)


def _enter(rec, gs, op: str, backend_op: str, members, detail, frame, init: bool = False):
    sig = rec.setup_sig(op, backend_op, gs, members, detail)
    return rec.setup_enter(gs, _number(rec, gs, init), sig, frame)


def _run(rec, ctx, orig, args, kwargs):
    """The call itself, its end recorded; the calls it makes are its parts."""
    _local.depth += 1
    try:
        result = orig(*args, **kwargs)
    except BaseException as exc:   # re-raised below, after the depth is reset
        _local.depth -= 1
        try:
            rec.setup_fail(ctx, exc)
        except Exception as inner:   # reported once; the user's own exception is re-raised below
            rec.internal_error(inner)
        raise
    _local.depth -= 1
    try:
        rec.setup_return(ctx)
    except Exception as exc:   # reported once; tracing steps aside: the result is the user's
        rec.internal_error(exc)
    return result


# ---- group creation ------------------------------------------------------------------------

def wrap_init(orig, before, after):
    """init_process_group: #1 of the job's group creations, recorded where the recorder exists
    before it (before(args, kwargs) -> the recorder, or None: made after it); after() joins the
    recorder to the default group. Inside another setup call (init_device_mesh makes it) too: it
    is the job's #1 whoever calls it."""

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        rec = ctx = None
        try:
            rec = before(args, kwargs)
            if rec is not None and not rec.disabled:
                ctx = _enter(rec, job_group(rec), "init_process_group", "init_process_group", None, None,
                             _getframe(1), init=True)
        except Exception as exc:   # reported once; tracing steps aside: init_process_group runs untraced
            if rec is not None:
                rec.internal_error(exc)
        if ctx is None:
            result = orig(*args, **kwargs)
        else:
            depth, _local.depth = _local.depth, 0   # what it makes is its own: a nested call's parts end here
            try:
                result = _run(rec, ctx, orig, args, kwargs)
            finally:
                _local.depth = depth
        after()
        return result

    patches.mark(wrapper, orig)
    return wrapper


def _make_new_group(orig):
    sig = inspect.signature(orig)
    get_ranks = param_getter(sig, "ranks")
    get_local = param_getter(sig, "use_local_synchronization")

    @functools.wraps(orig)
    def new_group(*args, **kwargs):
        rec = _recorder()
        if rec is None or _local.depth or not _c10d.is_initialized():   # torch's own error follows
            return orig(*args, **kwargs)
        try:
            ranks = get_ranks(args, kwargs)
            world = _c10d.get_world_size()
            detail = (None if ranks is None or isinstance(ranks, (list, tuple, range))
                      else f"ranks: {type(ranks).__name__}")
            local = bool(get_local(args, kwargs))
            if local:
                members = list(range(world)) if ranks is None else _listed(ranks)
                if members is None or _c10d.get_rank() not in members:
                    return orig(*args, **kwargs)   # torch returns at once: only members make it
                gs = rec.virtual_group(local_name(members), "group creation: its members alone", members)
            else:
                gs = job_group(rec)
            op = _local.api or "new_group"
            frame = _getframe(1)
            ctx = _enter(rec, gs, op, "new_group", _members(ranks, world), detail, frame)
            count = _group_count() if local else None
        except Exception as exc:   # reported once; tracing steps aside: the user's new_group runs untraced
            rec.internal_error(exc)
            return orig(*args, **kwargs)
        result = _run(rec, ctx, orig, args, kwargs)
        if count is not None:
            try:
                if _group_count() not in (None, count):
                    _counted_by_the_job(rec, op, frame)
            except Exception as exc:   # reported once; tracing steps aside: the group is made
                rec.internal_error(exc)
        return result

    patches.mark(new_group, orig)
    return new_group


def _group_count():
    """torch's count of the groups this rank has made, which names the next one (None: unknown)."""
    count = getattr(getattr(_c10d, "_world", None), "group_count", None)
    return count if isinstance(count, int) else None


def _counted_by_the_job(rec, op: str, frame) -> None:
    """A local group creation that torch counted among the job's (torch 2.14 on: every group a
    rank makes advances the count that names the next one, its members' alone or not). Every
    rank of the job must then make one at this point too, or the next group's name differs
    between ranks and its creation waits forever: it is a job-wide creation as well, recorded at
    the job's next number. Its signature leaves the members out: ranks making different local
    groups here stay in step; a rank making a group of the whole job here does not."""
    ctx = _enter(rec, job_group(rec), op, "new_group", None, LOCAL_SYNC, frame)
    rec.setup_return(ctx)


def _make_split_group(orig):
    sig = inspect.signature(orig)
    get_parent = param_getter(sig, "parent_pg")
    get_split = param_getter(sig, "split_ranks")

    @functools.wraps(orig)
    def split_group(*args, **kwargs):
        rec = _recorder()
        if rec is None or _local.depth or not _c10d.is_initialized():
            return orig(*args, **kwargs)
        try:
            parent = get_parent(args, kwargs)
            split = get_split(args, kwargs)
            if parent is None or parent is _c10d._world.default_pg:
                gs = job_group(rec)
            else:
                members = sorted(_c10d.get_process_group_ranks(parent))
                gs = rec.virtual_group(local_name(members), "group creation: its members alone", members)
            detail = (compact(repr([list(map(int, s)) for s in split]))
                      if isinstance(split, (list, tuple)) and all(isinstance(x, (list, tuple, range)) for x in split)
                      else None)
            ctx = _enter(rec, gs, _local.api or "split_group", "split_group", None, detail, _getframe(1))
        except Exception as exc:   # reported once; tracing steps aside: the user's split_group runs untraced
            rec.internal_error(exc)
            return orig(*args, **kwargs)
        return _run(rec, ctx, orig, args, kwargs)

    patches.mark(split_group, orig)
    return split_group


def _make_store_barrier(orig):
    """A direct _store_based_barrier of every rank of the job (torch's own, inside init_process_group
    and new_group, are parts of them)."""
    sig = inspect.signature(orig)
    get_count = param_getter(sig, "rendezvous_count")
    get_name = param_getter(sig, "group_name")

    @functools.wraps(orig)
    def barrier(*args, **kwargs):
        rec = _recorder()
        if rec is None or _local.depth or not _c10d.is_initialized():
            return orig(*args, **kwargs)
        try:
            if get_count(args, kwargs) != rec.world_size:
                return orig(*args, **kwargs)   # among some ranks: its waits are store waits
            ctx = _enter(rec, job_group(rec), "_store_based_barrier", "_store_based_barrier", None,
                         compact(str(get_name(args, kwargs))), _getframe(1))
        except Exception as exc:   # reported once; tracing steps aside: the barrier runs untraced
            rec.internal_error(exc)
            return orig(*args, **kwargs)
        return _run(rec, ctx, orig, args, kwargs)

    patches.mark(barrier, orig)
    return barrier


def _make_api(orig, name: str):
    """An API that makes groups through new_group or split_group (new_subgroups, a DeviceMesh):
    those calls are recorded under its name. Nothing else is done here."""

    @functools.wraps(orig)
    def api(*args, **kwargs):
        if _local.api is not None:
            return orig(*args, **kwargs)
        _local.api = name
        try:
            return orig(*args, **kwargs)
        finally:
            _local.api = None

    patches.mark(api, orig)
    return api


# ---- store waits -----------------------------------------------------------------------------

def _make_store_wait(orig, op: str):
    """Store.get / Store.wait: noted while it runs; recorded by the poller if it lasts (lasting)."""

    def wait(self, *args, **kwargs):
        rec = _shim.recorder
        if rec is None or rec.disabled or _local.depth:
            return orig(self, *args, **kwargs)
        ident = _get_ident()
        item = [self, args[0] if args else kwargs.get("key", kwargs.get("keys")), op, _getframe(1), _time(), None]
        watched = rec.watched
        watched[ident] = item
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as exc:   # re-raised below, once the wait is no longer watched
            with rec.watch_lock:
                watched.pop(ident, None)
            if item[5]:
                try:
                    rec.setup_fail(item[5], exc)
                except Exception as inner:   # reported once; the store's own exception is re-raised below
                    rec.internal_error(inner)
            raise
        with rec.watch_lock:
            watched.pop(ident, None)
        if item[5]:
            try:
                rec.setup_return(item[5])
            except Exception as exc:   # reported once; tracing steps aside: the store's answer is the user's
                rec.internal_error(exc)
        return result

    functools.update_wrapper(wait, orig)
    patches.mark(wait, orig)
    return wait


_store_ids: dict = {}   # id(store) -> (store, whether it is the job's): a store asked about once


def _is_job_store(rec, store) -> bool:
    hit = _store_ids.get(id(store))
    if hit is None or hit[0] is not store:
        from colltrace.rank import identity

        if len(_store_ids) > 64:
            _store_ids.clear()
        hit = _store_ids[id(store)] = (store, rec.store_id is not None and identity.store_id(store) == rec.store_id)
    return hit[1]


def lasting(rec, ident: int, item):
    """A store wait that lasted (the poller's call, under rec.watch_lock): its record, begun when
    the wait began; None where the store is not the job's."""
    store, keys, op, frame, t0, _ = item
    if not _is_job_store(rec, store):
        return None
    if isinstance(keys, (list, tuple)):
        text = ", ".join(str(k) for k in keys[:8]) + (", …" if len(keys) > 8 else "")
    else:
        text = keys.decode(errors="replace") if isinstance(keys, bytes) else str(keys)
    gs = rec.virtual_group(store_name(text), "waits for a key of the job's store: any rank may set it",
                           range(rec.world_size), any_of=True)
    with rec._intern:
        gs.last_after += 1
        seq = gs.last_after
    sig = rec.setup_sig(op, "store_wait", gs, None, compact(text))
    return rec.setup_enter(gs, seq, sig, frame, t=t0, ident=ident)


# ---- install -----------------------------------------------------------------------------------

def install(c10d, shim) -> dict:
    """Patch c10d's group creation; returns {id(original): (original, new)} for the shim's sweep
    of by-name imports. A DeviceMesh is patched once its module is imported (install_mesh), the
    stores' waits once there is a recorder (watch_store_waits)."""
    global _c10d, _shim
    _c10d, _shim = c10d, shim
    start = len(_patches)
    for name, factory in (("new_group", _make_new_group), ("split_group", _make_split_group),
                          ("_store_based_barrier", _make_store_barrier),
                          ("new_subgroups", lambda f: _make_api(f, "new_subgroups")),
                          ("new_subgroups_by_enumeration", lambda f: _make_api(f, "new_subgroups_by_enumeration"))):
        _patches.patch(c10d, name, factory)
    return _patches.replacements(start)


def watch_store_waits() -> None:
    """Store.get / Store.wait patched once this process has a recorder (install first). A process
    that is no rank keeps torch's own methods and no colltrace frame in its tracebacks: torchrun's
    agent logs one when its exit barrier loses the race with the store's shutdown (pytorch#69520)."""
    store = getattr(_c10d, "Store", None)
    if store is None:
        return
    for name, op in (("get", "store.get"), ("wait", "store.wait")):
        # a pybind class: its method is replaced on the class itself
        _patches.patch(store, name, functools.partial(_make_store_wait, op=op), may_refuse=True)


def install_mesh(module) -> dict:
    """torch.distributed.device_mesh: init_device_mesh and DeviceMesh's constructor name the group
    creations they make."""
    start = len(_patches)
    _patches.patch(module, "init_device_mesh", lambda f: _make_api(f, "init_device_mesh"))
    cls: Any = getattr(module, "DeviceMesh", None)
    if cls is not None:
        _patches.patch(cls, "__init__", lambda f: _make_api(f, "DeviceMesh"), may_refuse=True)
    return _patches.replacements(start)


def uninstall() -> None:
    _patches.restore()
