"""The patches: wrap every torch.distributed entry point that issues a collective.

Each wrapper reads the arguments it needs by position (resolved once from the original's
signature, so no inspect.bind on the hot path), writes an ENTER slot, calls the original,
then writes RETURN. Calls made while another traced call is running on the same thread
(all_gather_object's two all_gathers, send's isend, batch_isend_irecv's ops) are parts of
the outer logical op: they take no record of their own, and the backend's counter tells
how many steps the outer op used.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
import threading
from typing import Any, cast

from colltrace import config
from colltrace.rank import calls, cudamarks, early, exits, fastpath, hooks, patches, setup
from colltrace.rank.calls import (
    BACKEND_OVERRIDES,
    cuda_device,
    describe_tensors,
    device_type,
    given_root,
    input_digest,
    param_getter,
    redop_name,
    to_global,
)
from colltrace.rank.cudamarks import CAPTURED
from colltrace.tracefile.ringfile import F_ASYNC, F_DIGEST, F_P2P, F_START

# name: (backend op, tensor parameter compared across ranks, reducing?, kind)
# kind: c = collective, p = point-to-point, o = object collective (logical op of several), b = batch p2p
C10D_OPS = {
    "broadcast": ("broadcast", "tensor", False, "c"),
    "all_reduce": ("allreduce", "tensor", True, "c"),
    "all_reduce_coalesced": ("allreduce_coalesced", "tensors", True, "c"),
    "reduce": ("reduce", "tensor", True, "c"),
    "all_gather": ("allgather", "tensor", False, "c"),
    "all_gather_single": ("allgather_base", "input_tensor", False, "c"),
    "all_gather_into_tensor": ("allgather_base", "input_tensor", False, "c"),
    "_all_gather_base": ("allgather_base", "input_tensor", False, "c"),
    "all_gather_coalesced": ("allgather_coalesced", "input_tensor_list", False, "c"),
    "gather": ("gather", "tensor", False, "c"),
    "scatter": ("scatter", "tensor", False, "c"),
    "reduce_scatter": ("reduce_scatter", "output", True, "c"),
    "reduce_scatter_single": ("reduce_scatter_base", "input", True, "c"),
    "reduce_scatter_tensor": ("reduce_scatter_base", "input", True, "c"),
    "_reduce_scatter_base": ("reduce_scatter_base", "input", True, "c"),
    "all_to_all_single": ("alltoall_base", "input", False, "c"),
    "all_to_all": ("alltoall", "input_tensor_list", False, "c"),
    "barrier": ("barrier", None, False, "c"),
    "monitored_barrier": ("monitored_barrier", None, False, "c"),
    "isend": ("send", "tensor", False, "p"),
    "irecv": ("recv", "tensor", False, "p"),
    "send": ("send", "tensor", False, "p"),
    "recv": ("recv", "tensor", False, "p"),
    "batch_isend_irecv": ("batch_p2p", None, False, "b"),
    "all_gather_object": ("allgather", None, False, "o"),
    "gather_object": ("gather", None, False, "o"),
    "broadcast_object_list": ("broadcast", None, False, "o"),
    "scatter_object_list": ("scatter", None, False, "o"),
    "send_object_list": ("send", None, False, "o"),
    "recv_object_list": ("recv", None, False, "o"),
}
# Ops whose input is each rank's own data (a batch to gather): with COLLTRACE_DIGEST their bytes
# get a CRC-32, so that ranks sending identical data (no DistributedSampler) can be told.
DIGEST_OPS = frozenset(("gather", "all_gather", "all_gather_single", "all_gather_into_tensor", "_all_gather_base",
                        "all_to_all_single"))

# torch.distributed._functional_collectives (DTensor, torch.compile'd code falls back to these
# in eager mode). They return tensors that complete lazily: recorded as async.
FUNCOL_OPS = {
    "all_reduce": ("allreduce", "self", "reduceOp"),
    "all_reduce_coalesced": ("allreduce_coalesced", "self", "reduceOp"),
    "all_gather_tensor": ("allgather_base", "self", None),
    "all_gather_tensor_autograd": ("allgather_base", "self", None),
    "all_gather_into_tensor_coalesced": ("allgather_coalesced", "self", None),
    "reduce_scatter_tensor": ("reduce_scatter_base", "self", "reduceOp"),
    "reduce_scatter_tensor_autograd": ("reduce_scatter_base", "self", "reduceOp"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_coalesced", "inputs", "reduceOp"),
    "all_to_all_single": ("alltoall_base", "self", None),
    "all_to_all_single_autograd": ("alltoall_base", "self", None),
    "broadcast": ("broadcast", "self", None),
}

_lock = threading.RLock()


@dataclasses.dataclass
class _Shim:
    """What install() did and where this process's tracing stands (the recorder itself is the
    module's `recorder`, which every wrapper reads)."""
    installed: bool = False
    settings: Any = None                 # config.Settings, once installed
    replacements: dict = dataclasses.field(default_factory=dict)   # id(original) -> (original, replacement): swept
    funcol: bool = False                 # the functional collectives are wrapped
    joined: bool = False                 # the recorder knows the default group
    failed: bool = False                 # no recorder in this process: starting one failed, or a fork's child


_state = _Shim()
_patches = patches.Patches()   # what install() and _install_funcol() patched (setup.py keeps its own)
recorder = None  # the live Recorder; read by every wrapper
_c10d: Any = None   # torch.distributed.distributed_c10d, once installed
_NON_MEMBER = object()
_is_compiling = lambda: False  # noqa: E731 - replaced by torch.compiler.is_compiling at install
# The compiled path's cheaper test (one plain function Dynamo folds to True); the C code reads
# torch.compiler's export flag, the rest of is_compiling, itself.
_is_dynamo_compiling = lambda: False  # noqa: E731 - likewise, torch._dynamo's


def settings():
    """The settings the patches were installed with (None before install): hooks.py reads them."""
    return _state.settings


def first_sight(pg):
    """A group the recorder sees for the first time (Recorder.group_state's callback): its c10d
    hooks attached where torch has them, then its description."""
    hooks.load_compiled(sys.modules[__name__])   # build-hooks' module (its readers) where built
    hooks.attach(pg, sys.modules[__name__])   # torch >= 2.14: the native route for what no wrapper sees
    return calls.describe_group(pg)


# The compiled path's Python face: a function of the original's own parameters (no *args tuple or
# **kwargs dict to build) that hands them on to the Plan as they stand. A Python function, not the
# Plan itself, so that Dynamo traces it (and folds the test to True) rather than breaking the graph
# on a C callable. Compiled under this file's name, its lines these: a traceback through it reads
# them, and hooks._user_frame knows its frames for colltrace's.
_FORWARDER_LINE = sys._getframe().f_lineno + 1
_FORWARDER = """def _factory(_ct_orig, _ct_plan, {defaults}):
    def {name}({params}):
        if _is_dynamo_compiling():   # Dynamo traces this function: the compiled path stays out of its way
            return _ct_orig({call})
        return _ct_plan({call})
    return {name}
"""


def _forwarder(name, orig, sig, plan):
    """The function above for `orig`'s signature, or None where one cannot be written for it
    (*args, **kwargs, a name the template uses): the *args form then."""
    params = list(sig.parameters.values())
    if not name.isidentifier() or any(
            p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name.startswith("_ct_") or p.name == "_is_dynamo_compiling"
            or (p.default is not p.empty and p.name.startswith("_d")) for p in params):
        return None
    heads, call, defaults = [], [], {}
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and "*" not in heads:
            heads.append("*")
        heads.append(p.name if p.default is p.empty else f"{p.name}=_d{i}")
        if p.default is not p.empty:
            defaults[f"_d{i}"] = p.default
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
            heads.append("/")
        call.append(f"{p.name}={p.name}" if p.kind is p.KEYWORD_ONLY else p.name)
    src = _FORWARDER.format(name=name, params=", ".join(heads), call=", ".join(call),
                            defaults=", ".join(defaults) or "_d=None")
    ns: dict = {}
    exec(compile("\n" * (_FORWARDER_LINE - 1) + src, __file__, "exec"), globals(), ns)
    fwd = ns["_factory"](orig, plan, **defaults)
    fwd.__qualname__ = getattr(orig, "__qualname__", name)   # a bad call's TypeError names it as the original's does
    return fwd


def _object_device(group, device):
    """The device an object collective's tensors go to (its `device`, else c10d's choice for the
    group): a torch.device."""
    import torch

    try:
        if device is None:
            choose = getattr(_c10d, "_get_object_coll_device", None)
            device = choose(group) if choose is not None else "cpu"
        return torch.device(device)
    except Exception:   # a group c10d cannot say this of (a Python-defined backend): its CPU side
        return torch.device("cpu")


def _cuda_index(device, rec) -> int | None:
    """A torch.device's CUDA index (the current device where it names none), or None off CUDA."""
    if device is None or device.type != "cuda":
        return None
    return device.index if device.index is not None else rec.cuda.rt.current_device()


def _barrier_device_type(group, device_ids) -> str:
    """Where c10d's barrier sends a group of several backends (distributed_c10d.barrier's choice)."""
    bound = getattr(group, "bound_device_id", None)
    if isinstance(device_ids, list) and device_ids:
        return "cuda"
    if bound is not None:
        return bound.type
    return _object_device(group, None).type


def _coalesced_device(group) -> int | None:
    """The CUDA device of the ops a _coalescing_manager block queued (c10d runs them as it exits)."""
    ops = _c10d._world.pg_coalesce_state.get(group) or ()
    for op in ops:
        d = cuda_device(getattr(op, "tensor", None))
        if d is not None:
            return d
    return None


def _make_c10d_wrapper(name, orig):
    backend_op, tensor_param, reducing, kind = C10D_OPS[name]
    sig = inspect.signature(orig)
    get_group = param_getter(sig, "group")
    get_tensor = param_getter(sig, tensor_param)
    get_redop = param_getter(sig, "op") if reducing else (lambda a, k: None)
    get_async = param_getter(sig, "async_op")
    root_name = "src" if "src" in sig.parameters else "dst" if "dst" in sig.parameters else None
    get_root = param_getter(sig, root_name)
    get_group_root = param_getter(sig, "group_" + root_name) if root_name else (lambda a, k: None)
    get_p2p_list = param_getter(sig, "p2p_op_list")
    get_device = param_getter(sig, "device")          # an object collective's
    get_device_ids = param_getter(sig, "device_ids")  # a barrier's
    is_batch = kind == "b"
    is_object = kind == "o"
    # A batch is p2p too: on gloo it moves only its members' counters, like send/recv.
    is_p2p = kind == "p" or is_batch
    op_name = name
    digestible = name in DIGEST_OPS

    def build(skip):
        # skip: frames between this function and the user's call (2 when the compiled path
        # hands a call over: its Python wrapper stands between)
        @functools.wraps(orig)
        def wrapper(*args, **kwargs):
            rec = recorder
            if rec is None or rec.disabled or _is_compiling():
                return orig(*args, **kwargs)
            local = rec.local
            if local.depth:
                return orig(*args, **kwargs)
            try:
                if is_batch:
                    ops = get_p2p_list(args, kwargs)
                    group = ops[0].group if ops else None
                    tensor = [o.tensor for o in ops]
                else:
                    group = get_group(args, kwargs)
                    tensor = get_tensor(args, kwargs)
                if group is None:
                    group = _c10d._world.default_pg
                    if group is None:
                        return orig(*args, **kwargs)
                elif group is _NON_MEMBER:
                    return orig(*args, **kwargs)
                gs = rec.group_state(group, first_sight)
                if gs is None:   # a group colltrace cannot describe: its calls pass through untraced
                    return orig(*args, **kwargs)
                objects_on: Any = _object_device(group, get_device(args, kwargs)) if is_object else None
                if gs.lanes is not None:   # a group of several backends: the one this op goes to
                    gs = gs.lane(objects_on.type if is_object else device_type(tensor) if tensor_param or is_batch
                                 else _barrier_device_type(group, get_device_ids(args, kwargs)))
                is_async = bool(get_async(args, kwargs)) or kind == "p" and op_name in ("isend", "irecv") or is_batch
                flags = (F_ASYNC if is_async else 0) | (F_P2P if is_p2p else 0)
                root = peer = -1
                pair: tuple | None = None
                if root_name is not None:
                    r = given_root(gs, get_root(args, kwargs), get_group_root(args, kwargs))
                    if is_p2p:
                        peer = r
                        me = rec.rank
                        pair = (me, peer) if backend_op == "send" else (peer, me)
                    else:
                        root = r
                if is_batch:
                    shapes, dtypes, cuda = describe_tensors(tensor)
                    redop = None
                    peer = ops[0].peer if ops else -1
                    pair = (rec.rank, "batch", peer)
                else:
                    shapes, dtypes, cuda = describe_tensors(tensor)
                    redop = redop_name(get_redop(args, kwargs))
                digest = 0
                if digestible and rec.digest_bytes and not cuda:
                    d = input_digest(tensor, rec.digest_bytes)
                    if d is not None:
                        digest, flags = d, flags | F_DIGEST
                # CUDA work (an object collective's too: its tensors are on the GPU on NCCL): a
                # start event now, on the stream the call will use; none for a captured call
                mark = None
                dev = _cuda_index(objects_on, rec) if is_object else cuda_device(tensor) if cuda else None
                if dev is not None:
                    mark = rec.cuda.begin(dev)
                    if mark is not CAPTURED:
                        flags |= F_START
                bop = BACKEND_OVERRIDES.get((gs.backend, backend_op), backend_op)
                sig_id = rec.sig_id((op_name, bop, gs.id, shapes, dtypes, redop, root, peer, is_async))
                ctx = rec.enter(gs, sig_id, sys._getframe(skip), flags, pair, peer, digest)
            except Exception as exc:   # reported once; tracing steps aside: the collective runs untraced
                rec.internal_error(exc)
                return orig(*args, **kwargs)
            local.depth = 1
            try:
                result = orig(*args, **kwargs)
            except BaseException as exc:   # re-raised below, after the depth is reset
                local.depth = 0
                try:
                    rec.fail(ctx, exc)
                except Exception as inner:   # reported once; the collective's own exception is re-raised below
                    rec.internal_error(inner)
                raise
            local.depth = 0
            try:
                if mark is CAPTURED:   # runs at the graph's replays, unseen
                    rec.exit(ctx, done=True, captured=True)
                elif is_async:
                    if result is None:
                        rec.exit(ctx, done=True)
                    elif mark is not None:   # the poller turns its Works into an end event
                        rec.exit(ctx, done=False, waitable=rec.cuda.after_async(mark, result, (gs.id, peer)))
                    else:
                        rec.exit(ctx, done=False, waitable=result)
                elif mark is not None:   # the Work made the stream wait for the collective: an event there
                    rec.exit(ctx, done=False, waitable=rec.cuda.end(mark))
                else:
                    rec.exit(ctx, done=True)
            except Exception as exc:   # reported once; tracing steps aside: the result is the user's
                rec.internal_error(exc)
            return result

        return wrapper

    wrapper = build(1)

    patches.mark(wrapper, orig)
    if kind != "c" or _state.settings is None or _state.settings.pure:
        return wrapper
    return _compiled(name, orig, sig, build, root_name) or wrapper


def _compiled(name, orig, sig, build, root_name):
    """The function torch.distributed calls where the compiled path takes a collective (fastpath.plan):
    its Plan, with build(2) (the Python wrapper, one frame further from the user's call) for every
    call the Plan hands over; None where the compiled path does not apply."""
    backend_op, tensor_param, reducing, _ = C10D_OPS[name]
    digestible = name in DIGEST_OPS

    def learn(rec, pg, tensor, op, is_async, r=None, gr=None):
        """What the compiled path needs for calls like this one, as the Python wrapper would
        intern it (fastpath.learned); None for a group colltrace cannot describe, or a root given
        as anything but an int (the Python wrapper records it as it is). r, gr: a rooted op's
        src/dst and group_src/group_dst as passed."""
        gs = rec.group_state(pg, first_sight)
        if gs is None or gs.seq_fn is None:
            return None
        root = -1
        if root_name is not None:
            given = r if r is not None else gr
            if given is not None and not isinstance(given, int):
                return None
            root = given_root(gs, r, gr)
        shapes, dtypes, cuda = describe_tensors(tensor)
        bop = BACKEND_OVERRIDES.get((gs.backend, backend_op), backend_op)
        sig = rec.sig_id((name, bop, gs.id, shapes, dtypes, redop_name(op), root, -1, is_async))
        return fastpath.learned(sig, gs, wrapper_only=bool(cuda or (digestible and rec.digest_bytes)),
                                one_step=name in fastpath.ONE_STEP)

    plan = fastpath.plan(orig, build(2), learn, globals(), _c10d._world, _NON_MEMBER, list(sig.parameters),
                         tensor_param, reducing, one_step=name in fastpath.ONE_STEP, root_param=root_name)
    if plan is None:
        return None

    fast = _forwarder(name, orig, sig, plan)
    if fast is None:
        def fast(*args, **kwargs):
            if _is_dynamo_compiling():   # Dynamo traces this function: the compiled path stays out of its way
                return orig(*args, **kwargs)
            return plan(*args, **kwargs)
    fast = functools.wraps(orig)(fast)
    patches.mark(fast, orig)
    cast(Any, fast).__colltrace_plan__ = plan   # its `hits`: calls the compiled path recorded itself
    return fast


def _make_coalescing_wrapper(orig):
    """_coalescing_manager: the ops in its block become one backend op, recorded as one."""
    import contextlib

    sig = inspect.signature(orig)
    get_group = param_getter(sig, "group")
    get_device = param_getter(sig, "device")
    get_async = param_getter(sig, "async_ops")

    @functools.wraps(orig)
    @contextlib.contextmanager
    def wrapper(*args, **kwargs):
        rec = recorder
        if rec is None or rec.disabled or rec.local.depth or _is_compiling():
            with orig(*args, **kwargs) as cm:
                yield cm
            return
        ctx = mark = None
        is_async = False
        try:
            group = get_group(args, kwargs) or _c10d._world.default_pg
            gs = rec.group_state(group, first_sight)
            if gs is not None:
                device = get_device(args, kwargs)
                device = None if device is None else _object_device(group, device)
                if gs.lanes is not None and device is not None:
                    gs = gs.lane(device.type)
                is_async = bool(get_async(args, kwargs))
                flags = F_ASYNC if is_async else 0
                dev = _cuda_index(device, rec)
                if dev is not None:   # a device given: the block's ops go to its backend as they are made
                    mark = rec.cuda.begin(dev)
                    if mark is not CAPTURED:
                        flags |= F_START
                sig_id = rec.sig_id(("_coalescing_manager", "coalesced", gs.id, (), (), None, -1, -1, is_async))
                ctx = rec.enter(gs, sig_id, sys._getframe(2), flags)
        except Exception as exc:   # reported once; tracing steps aside: the block runs untraced
            rec.internal_error(exc)
        rec.local.depth = 1 if ctx is not None else 0
        try:
            with orig(*args, **kwargs) as cm:
                yield cm
                if ctx is not None and mark is None:
                    # the block's ops, queued for c10d to issue as one as the manager exits: their device
                    try:
                        dev = _coalesced_device(group)
                        mark = rec.cuda.begin(dev, start=False) if dev is not None else None
                    except Exception as exc:   # reported once; tracing steps aside: the block's ops go out regardless
                        rec.internal_error(exc)
        except BaseException as exc:   # re-raised below, after the depth is reset
            rec.local.depth = 0
            if ctx is not None:
                rec.fail(ctx, exc)
            raise
        rec.local.depth = 0
        if ctx is not None:
            try:
                works = list(getattr(cm, "works", ()) or ())
                if mark is CAPTURED:
                    rec.exit(ctx, done=True, captured=True)
                elif mark is not None and (works or not is_async):
                    # CUDA work: the async block's Works become an end event; a blocking block's
                    # Work made the stream wait (c10d's work.wait()), or the backend synced itself
                    waitable = rec.cuda.after_async(mark, works, (gs.id, None)) if works else rec.cuda.end(mark)
                    rec.exit(ctx, done=False, waitable=waitable)
                else:
                    rec.exit(ctx, done=not works, waitable=works or None)
            except Exception as exc:   # reported once; tracing steps aside
                rec.internal_error(exc)

    patches.mark(wrapper, orig)
    return wrapper


def _make_funcol_wrapper(name, orig, resolve_group):
    backend_op, tensor_param, redop_param = FUNCOL_OPS[name]
    sig = inspect.signature(orig)
    get_group = param_getter(sig, "group")
    get_tag = param_getter(sig, "tag")
    get_tensor = param_getter(sig, tensor_param)
    get_redop = param_getter(sig, redop_param)
    get_src = param_getter(sig, "src")
    op_name = "funcol." + name

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        rec = recorder
        if rec is None or rec.disabled or rec.local.depth or _is_compiling():
            return orig(*args, **kwargs)
        try:
            pg = resolve_group(get_group(args, kwargs), get_tag(args, kwargs) or "")
            gs = rec.group_state(pg, first_sight)
            if gs is None:
                return orig(*args, **kwargs)
            tensor = get_tensor(args, kwargs)
            if gs.lanes is not None:
                gs = gs.lane(device_type(tensor))
            shapes, dtypes, _ = describe_tensors(tensor)
            redop = get_redop(args, kwargs)
            src = get_src(args, kwargs)
            root = to_global(gs, src) if src is not None else -1
            bop = BACKEND_OVERRIDES.get((gs.backend, backend_op), backend_op)
            sig_id = rec.sig_id((op_name, bop, gs.id, shapes, dtypes, None if redop is None else str(redop),
                                 root, -1, True))
            ctx = rec.enter(gs, sig_id, sys._getframe(1), F_ASYNC)
        except Exception as exc:   # reported once; tracing steps aside: the functional collective runs untraced
            rec.internal_error(exc)
            return orig(*args, **kwargs)
        rec.local.depth = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException as exc:   # re-raised below, after the depth is reset
            rec.local.depth = 0
            rec.fail(ctx, exc)
            raise
        rec.local.depth = 0
        try:
            # The result completes lazily (AsyncCollectiveTensor) and no Work is handed back: its
            # wait_tensor() (_make_wait_wrapper) says when, else a later op on the group completing.
            rec.unobserved(ctx, [getattr(t, "elem", t)
                                 for t in (result if isinstance(result, (list, tuple)) else (result,))])
        except Exception as exc:   # reported once; tracing steps aside: the lazy result is the user's
            rec.internal_error(exc)
        return result

    patches.mark(wrapper, orig)
    return wrapper


def _make_wait_wrapper(orig, done_on_return):
    """Work.wait and funcol's wait_tensor: where the program parks for a traced call it made
    without waiting (async_op=True, a functional collective). A WAIT slot names the call and the
    line it waits at; a wait that raises is that call's failure, with its reason. done_on_return(x):
    whether the wait returning means the work is done (a CPU tensor's wait_tensor; never a Work,
    whose wait() on NCCL only orders streams: the poller decides)."""

    @functools.wraps(orig)
    def wait(self, *args, **kwargs):
        rec = recorder
        if rec is None or rec.disabled or rec.local.depth:
            return orig(self, *args, **kwargs)
        try:
            pending = rec.pending_for(self)
            if pending is not None:
                rec.wait_begins(pending, sys._getframe(1))
        except Exception as exc:   # reported once; tracing steps aside: the wait runs untraced
            rec.internal_error(exc)
            pending = None
        if pending is None:
            return orig(self, *args, **kwargs)
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as exc:   # re-raised below, the wait's failure recorded first
            try:
                rec.wait_ends(pending, self, exc, False)
            except Exception as inner:   # reported once; the wait's own exception is re-raised below
                rec.internal_error(inner)
            raise
        try:
            rec.wait_ends(pending, self, None, done_on_return(self))
        except Exception as exc:   # reported once; tracing steps aside: the wait's result is the user's
            rec.internal_error(exc)
        return result

    patches.mark(wait, orig)
    return wait


def _is_cpu_tensor(t) -> bool:
    return getattr(getattr(t, "device", None), "type", None) == "cpu"


# ---- process groups and the recorder's life ------------------------------------------------

def _ensure_recorder():
    """Join this rank's recorder to the default group once it exists: the one made before it (the
    start-up hook's, or init_process_group's own: _before_init), else a new one."""
    global recorder
    if _state.joined or _state.failed:
        return recorder
    with _lock:
        if _state.joined or _state.failed:
            return recorder
        try:
            c10d = _c10d
            if not c10d.is_initialized():
                return None
            settings = _state.settings
            pg = c10d._get_default_group()
            try:   # the job's own store tells this job from the others (colltrace.rank.identity)
                store = c10d._world.pg_map[pg][1]
            except Exception:   # a torch whose pg_map holds no store there (another layout): no store id
                store = None
            rec = recorder
            if rec is not None and (rec.rank, rec.world_size) != (c10d.get_rank(), c10d.get_world_size()):
                # the environment said another rank than init_process_group: what was traced is wrong
                rec.disable(f"init_process_group made this rank {c10d.get_rank()} of {c10d.get_world_size()}, "
                            f"not {rec.rank} of {rec.world_size}")
                raise RuntimeError(f"RANK/WORLD_SIZE said rank {rec.rank} of {rec.world_size}, init_process_group "
                                   f"{c10d.get_rank()} of {c10d.get_world_size()}")
            if rec is None:
                rec = _new_recorder(c10d.get_rank(), c10d.get_world_size(), store, str(c10d.get_backend(pg)))
            else:
                rec.rearm()   # what the program set up since the recorder started (exit(), its own handlers)
            if store is not None:
                from colltrace.rank import identity

                rec.store_id = identity.store_id(store)
            rec.group_state(pg, first_sight)
            for other in list(c10d._world.pg_names):
                if other is not pg and other is not None:
                    rec.group_state(other, first_sight)
            global _is_compiling, _is_dynamo_compiling
            try:  # resolved here, not at install: install may run while torch is still importing
                import torch.compiler

                _is_compiling = torch.compiler.is_compiling
                _is_dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", _is_compiling)
            except Exception:   # a torch without torch.compiler's functions: the defaults stay
                pass
            recorder = rec
            cudamarks.watch_captures()   # again: a torch that imports torch.cuda after torch.distributed
            _state.joined = True
            if settings.batches:
                from colltrace.rank import batches

                batches.resolve()
            if rec.rank == 0:   # once per job, not per rank; tracing goes on whatever it says
                from colltrace import torchcompat

                torchcompat.say_if_newer()
                torchcompat.say_if_unseen()   # what an older torch cannot name, found by feature
            _install_funcol()
            from colltrace.rank import launcher

            launcher.ensure_watchdog(settings, rec, store)
        except Exception as exc:   # one line, this process untraced: never an exception into the user's init
            _state.failed = True
            recorder = None
            from colltrace.tracefile import storage

            if isinstance(exc, storage.StorageError):   # a full trace folder: one warning, the job goes on
                sys.stderr.write(f"colltrace: warning: {exc}\n")
            else:
                sys.stderr.write(f"colltrace: tracing disabled on this process, could not start: {exc!r}\n")
        return recorder


def _new_recorder(rank: int, world: int, store, backend: str = ""):
    from colltrace.rank.recorder import Recorder, job_id

    rec = Recorder(_state.settings, rank, world, backend, job=job_id(store=store))
    rec.lasting = setup.lasting   # the store waits that last are recorded
    setup.watch_store_waits()
    if store is not None:
        from colltrace.rank import identity

        rec.store_id = identity.store_id(store)
    return rec


def _before_init(args, kwargs):
    """The recorder before init_process_group runs (its rendezvous is then seen, and a wait in it):
    the one in use, else one made now where the call names this rank, the job's size and its store
    (the job's identity); None: it is made once the default group exists."""
    global recorder
    if recorder is not None or _state.failed or _state.joined:
        return recorder
    with _lock:
        if recorder is not None:
            return recorder
        store, rank, world = _init_store(args, kwargs), _init_rank(args, kwargs), _init_world(args, kwargs)
        if store is None or not isinstance(rank, int) or not isinstance(world, int) or not 0 <= rank < world:
            return None
        try:
            rec = _new_recorder(rank, world, store)
        except Exception as exc:   # a full folder, any start failure: one line, this process untraced, the job goes on
            _state.failed = True
            from colltrace.tracefile import storage

            if isinstance(exc, storage.StorageError):
                sys.stderr.write(f"colltrace: warning: {exc}\n")
            else:
                sys.stderr.write(f"colltrace: tracing disabled on this process, could not start: {exc!r}\n")
            return None
        recorder = rec
        from colltrace.rank import launcher

        launcher.ensure_watchdog(_state.settings, rec, store)
        return rec


def _make_group_hook(orig):
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        result = orig(*args, **kwargs)
        try:
            pg = args[0] if args else kwargs.get("pg")
            if pg is not None:   # hooked now: its first collective may be issued on the group object
                hooks.attach(pg, sys.modules[__name__])
            rec = recorder if recorder is not None else _ensure_recorder()
            if rec is not None and not rec.disabled:
                pg = args[0] if args else kwargs.get("pg")
                if pg is not None:
                    rec.group_state(pg, first_sight, quiet=True)
        except Exception:   # never in the way of the user's group
            pass  # torch fills in the group's ranks after registering it: described at first use
        return result

    patches.mark(wrapper, orig)
    return wrapper


def _make_destroy_hook(orig):
    """destroy_process_group: the group's Works are let go before its communicator is freed."""
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        rec = recorder
        if rec is not None and not rec.disabled:
            try:
                group = args[0] if args else kwargs.get("group")
                world = _c10d.GroupMember.WORLD
                if group is world or group is _c10d._world.default_pg:
                    group = None   # the default group: every group goes
                rec.forget_group(group)
            except Exception as exc:   # reported once; tracing steps aside: the group is destroyed regardless
                rec.internal_error(exc)
        return orig(*args, **kwargs)

    patches.mark(wrapper, orig)
    return wrapper


def _make_init_hook(orig):
    """init_process_group: recorded as the job's first group creation (rank/setup.py) where the
    recorder exists before it; the recorder joins the default group after it."""
    global _init_store, _init_rank, _init_world
    sig = inspect.signature(orig)
    _init_store, _init_rank, _init_world = (param_getter(sig, "store"), param_getter(sig, "rank"),
                                            param_getter(sig, "world_size"))
    return setup.wrap_init(orig, _before_init, _ensure_recorder)


_init_store = _init_rank = _init_world = lambda args, kwargs: None


def _check_op_accepting_originals(orig_check):
    """P2POp validates op by identity against isend/irecv: accept the unpatched ones too, so a
    P2POp built from a reference taken before colltrace was installed keeps working (patched
    before it: install())."""
    isend, irecv = _patches.original(_c10d, "isend"), _patches.original(_c10d, "irecv")

    @functools.wraps(orig_check)
    def check(op):
        if op is isend or op is irecv:
            return None
        return orig_check(op)

    patches.mark(check, orig_check)
    return check


# ---- install / uninstall --------------------------------------------------------------------

def _sweep(replacements: dict) -> None:
    """Rebind by-name imports (from torch.distributed import all_reduce) made before install."""
    for mod_name, mod in list(sys.modules.items()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict) or mod_name.startswith("colltrace"):
            continue
        try:
            hits = [k for k, v in d.items() if type(v).__name__ == "function" and id(v) in replacements]
        except RuntimeError:
            continue
        for k in hits:
            orig, new = replacements[id(d[k])]
            if d[k] is orig:
                d[k] = new


def install() -> bool:
    global _c10d
    with _lock:
        if _state.installed:
            return True
        settings = config.load()
        _state.settings = settings
        config.warn_once(settings)
        import torch.distributed.distributed_c10d as c10d

        _c10d = c10d
        global _NON_MEMBER
        _NON_MEMBER = c10d.GroupMember.NON_GROUP_MEMBER
        start = len(_patches)
        for name in C10D_OPS:
            _patches.patch(c10d, name, functools.partial(_make_c10d_wrapper, name))
        _patches.patch(c10d, "_coalescing_manager", _make_coalescing_wrapper)
        _patches.patch(c10d, "init_process_group", _make_init_hook)
        _patches.patch(c10d, "_register_pg_in_world", _make_group_hook)
        _patches.patch(c10d, "destroy_process_group", _make_destroy_hook)
        _patches.patch(c10d, "_check_op", _check_op_accepting_originals)
        replacements = _patches.replacements(start)
        replacements.update(setup.install(c10d, sys.modules[__name__]))
        global recorder
        if recorder is None and not _state.failed and early.recorder() is not None:
            recorder = early.recorder()   # the start-up hook's: this rank before it joins
        if recorder is not None:
            setup.watch_store_waits()
        work: Any = getattr(c10d, "Work", None)
        if work is not None:   # a pybind class: its method is replaced on the class itself
            # c10d's blocking collectives wait on their Work inside the wrapper: there the
            # compiled gate calls the original at once (the hot path pays no Python frame)
            _patches.patch(work, "wait", lambda wait: fastpath.method_gate(
                wait, _make_wait_wrapper(wait, lambda w: False), settings), may_refuse=True)
        _sweep(replacements)
        _state.replacements = replacements
        _state.installed = True
        cudamarks.watch_captures()   # CUDA graph captures: the poller makes no CUDA call during one
        if settings.batches:   # what each rank feeds its DDP/FSDP model (duplicate_data)
            from colltrace.rank import batches

            batches.install(settings, lambda: recorder)
        os.register_at_fork(after_in_child=_after_fork_in_child)
        # the exit calls noted from now on, before the recorder (init_process_group) is made:
        # a module imported in between may bind them (from sys import exit)
        exits.install()
        if c10d.is_initialized():
            _ensure_recorder()
        return True


def _install_funcol():
    """Functional collectives are patched once torch.distributed is fully imported."""
    if _state.funcol:
        return
    _state.funcol = True
    try:
        import torch.distributed._functional_collectives as funcol
    except Exception:   # a torch without functional collectives, or one failing to import them: not traced
        return

    def resolve(group, tag):
        return _c10d._resolve_process_group(funcol._resolve_group_name(group, tag))

    start = len(_patches)
    for name in FUNCOL_OPS:
        _patches.patch(funcol, name, functools.partial(_make_funcol_wrapper, name, resolve_group=resolve))
    replacements = _patches.replacements(start)
    mesh = sys.modules.get("torch.distributed.device_mesh")
    if mesh is not None:   # its group creations named by the API the program called (rank/setup.py)
        replacements.update(setup.install_mesh(mesh))
    # AsyncCollectiveTensor waits through this module-level function (trigger_wait, wait)
    start = len(_patches)
    _patches.patch(funcol, "wait_tensor", lambda orig: _make_wait_wrapper(orig, _is_cpu_tensor))
    replacements.update(_patches.replacements(start))
    _sweep(replacements)
    _state.replacements.update(replacements)


def _after_fork_in_child():
    # A forked child of a rank (a DataLoader worker) must not write into its parent's trace.
    # A child forked before its parent became a rank (start_processes(start_method="fork") from
    # a traced launcher) becomes a rank itself: it starts its own recorder at init_process_group.
    global recorder
    if recorder is None and not _state.failed:
        return
    if recorder is not None:
        recorder.disabled = True
    recorder = None
    _state.failed = True


def uninstall() -> None:
    global recorder
    with _lock:
        if not _state.installed:
            return
        reverse = {id(new): (new, orig) for orig, new in _state.replacements.values()}
        _patches.restore()
        _sweep(reverse)
        hooks.detach_all()
        cudamarks.unwatch_captures()
        setup.uninstall()
        from colltrace.rank import batches

        batches.uninstall()
        _state.replacements = {}
        _state.installed = False
        _state.funcol = False
        if recorder is not None:
            recorder.close()
        recorder = None
        exits.uninstall()
        _state.failed = False
        _state.joined = False


def is_installed() -> bool:
    return _state.installed
