"""The native route: c10d's per-group collective hooks (torch >= 2.14) record what no wrapper sees.

torch 2.14 fires `ProcessGroup.register_pre_hook`/`register_post_hook` callbacks on the calling
thread for every collective a group issues, whatever issued it: `pg.allreduce(...)` called on
the group object, DDP's C++ reducer, compiled code, DTensor, FSDP2. While a Python wrapper is
active on the thread (recorder.local.depth) the op is a part of the wrapper's logical op (the
two all_gathers of all_gather_object) and the hook stays silent; otherwise the hook records the
op itself, under the hook's op name, with the same ENTER/RETURN slots and numbering.

Hooks run inside the user's collective: an exception raised in a pre-hook aborts it, so every
hook body catches everything, reports once and steps aside. The feature is detected on the
group (`register_pre_hook`), never by version: on torch 2.13 this module attaches nothing.

Where `colltrace build-hooks` compiled _hooks.cpp for this torch (hookbuild), the same gates are
registered through it from C++: c10d then calls a C++ function that tests the depth without the
GIL, instead of taking the GIL and making a Python argument object for a Python hook that returns.
"""
from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any, Protocol

from colltrace.rank import fastpath
from colltrace.rank.calls import BACKEND_OVERRIDES, describe_tensors, device_type, to_global
from colltrace.tracefile.ringfile import F_ASYNC, F_P2P

HOOK_ID = 0x636F6C6C   # "coll": one id per group, ours; a program's own hooks use their own ids

# HookOpName -> backend op name as the wrappers record it (C10D_OPS). torch 2.14 names a family
# (ALLGATHER for both all_gather and all_gather_into_tensor); 2.15 adds the _BASE and _COALESCED
# names. Keys are the enum name lower-cased without "_", so ALL_REDUCE and ALLREDUCE agree.
_NAMES = {
    "allreduce": "allreduce", "allreducecoalesced": "allreduce_coalesced",
    "allgather": "allgather", "allgatherbase": "allgather_base", "allgathercoalesced": "allgather_coalesced",
    "allgatherintotensorcoalesced": "allgather_into_tensor_coalesced",
    "reducescatter": "reduce_scatter", "reducescatterbase": "reduce_scatter_base",
    "reducescattertensorcoalesced": "reduce_scatter_tensor_coalesced",
    "alltoall": "alltoall", "alltoallbase": "alltoall_base",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier", "send": "send", "recv": "recv", "recvanysource": "recv",
}
# A family name whose single-tensor form is the _base op (told apart by how many tensors it has).
_BASE_FORM = {"allgather": "allgather_base", "reduce_scatter": "reduce_scatter_base", "alltoall": "alltoall_base"}
# A coalesced op over one tensor is the plain op (2.15 names a functional all_gather
# ALLGATHER_INTO_TENSOR_COALESCED where 2.14 said ALLGATHER): ranks compare like with like.
_SINGLE_FORM = {"allreduce_coalesced": "allreduce", "allgather_into_tensor_coalesced": "allgather_base",
                "reduce_scatter_tensor_coalesced": "reduce_scatter_base"}


class Tracer(Protocol):
    """What the hooks use of the module that installs them (colltrace.rank.shim, handed in: it
    imports this module). Read each time, never kept: the recorder changes (init_process_group, a
    fork). The compiled Gate reads `recorder` from the module's namespace itself (vars(shim))."""

    recorder: Any          # the recorder in use (None: nothing is recorded)
    __file__: str | None   # its frames are colltrace's, stepped over to the user's

    def settings(self) -> Any: ...           # what the patches were installed with (None before install)

    def first_sight(self, pg) -> Any: ...    # Recorder.group_state's callback for a group seen first


class _Local(threading.local):
    open = None   # the ctx of the op this thread's pre-hook recorded, until its post-hook


_local = fastpath.hook_local() or _Local()   # shared with the compiled hook case where it is built
_names: dict = {}   # (HookOpName, number of inputs) -> op, for ops whose name needs no outputs
_NEEDS_OUTS = frozenset(("allgather", "allgather_base", "reduce_scatter", "reduce_scatter_base", "alltoall",
                         "alltoall_base", "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced"))
# The ops the compiled hook case takes (fastpath.hook_gates): named by the HookOpName and the tensors'
# counts alone, no root, no peer. Of those, the ones that are one backend op (one step of the
# group's counter, as fastpath.ONE_STEP says of the wrappers): the counter is read before only.
_FAST_OPS = frozenset(("allreduce", "allreduce_coalesced", "allgather", "allgather_base", "allgather_coalesced",
                       "allgather_into_tensor_coalesced", "reduce_scatter", "reduce_scatter_base",
                       "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "barrier"))
_ONE_STEP = frozenset(("allreduce", "allgather", "allgather_base", "reduce_scatter", "reduce_scatter_base", "alltoall",
                       "alltoall_base", "barrier"))
_kinds_table: list = []
_attached: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()


def supported(pg) -> bool:
    return callable(getattr(pg, "register_pre_hook", None)) and callable(getattr(pg, "register_post_hook", None))


def op_name(name, n_in: int, n_out: int) -> str:
    """HookOpName (2.14 or 2.15 spelling) -> the backend op name the wrappers record."""
    text = getattr(name, "name", None) or str(name).rsplit(".", 1)[-1]
    op = _NAMES.get(text.lower().replace("_", ""), text.lower())
    if op == "allreduce" and n_in > 1:
        return "allreduce_coalesced"   # a coalesced block: one backend op over several tensors
    if n_in == 1 and op in _SINGLE_FORM and n_out <= 1:
        return _SINGLE_FORM[op]
    base = _BASE_FORM.get(op)
    if base is not None and n_in == 1 and n_out == 1:
        return base
    return op


def attach(pg, shim: Tracer) -> bool:
    """Register our pre/post hooks on `pg` once. The hooks hold the group weakly (a group holds
    its hooks: a strong reference would keep every destroyed group alive). Never raises."""
    try:
        settings = shim.settings() if hasattr(shim, "settings") else None
        if not supported(pg) or (settings is not None and not settings.hooks):   # COLLTRACE_HOOKS=0
            return False
        with _lock:
            if pg in _attached:
                return True
            if not _attached and not _exit_registered:
                _register_exit()
            _attached.add(pg)
        ref = weakref.ref(pg)
        # gated: inside a wrapped call the hooks return before any Python runs; where the compiled
        # path is in use, the common case is recorded in C (fastpath.hook_gates)
        kinds = _kinds(shim)
        pre, post = fastpath.hook_gates(_make_pre(ref, shim), _make_post(shim), ref,
                                        vars(shim) if kinds is not None else None, _make_learn(ref, shim), kinds)
        compiled = _compiled_hooks(shim, settings) if kinds is not None else None
        if compiled is not None:   # c10d tests the depth in C++: no GIL, no argument object inside a wrapper
            try:
                compiled.attach(pg, HOOK_ID, pre, post, lambda exc: _report(shim, exc))
                return True
            except TypeError:   # not a c10d group (a stand-in): its own register methods take Python hooks
                pass
            except Exception as exc:   # a c10d error on attach (any type): said once, Python hooks instead
                _report_once(shim, exc)
        pg.register_pre_hook(HOOK_ID, pre)
        pg.register_post_hook(HOOK_ID, post)
        return True
    except Exception as exc:   # an odd group: the wrappers still trace it
        _report(shim, exc)
        return False


_compiled: list = []   # [the built C++ module or None], decided once per process


def _compiled_hooks(shim: Tracer, settings):
    """`colltrace build-hooks`' module where one was built for this torch and Python and the
    settings allow it (not COLLTRACE_HOOKS=python); else None: the gates are registered as Python
    hooks and counters and tensors read through Python. Loading it points _fastpath at its readers. A
    build that exists but does not load is said once."""
    if settings is None or not getattr(settings, "hooks_compiled", True):
        return None
    if not _compiled:
        module = None
        try:
            from colltrace.rank import hookbuild

            module = hookbuild.load()
            if module is not None:
                fastpath.use_readers(module)
        # a build that does not load (ImportError, OSError, a missing symbol): said once, Python hooks
        except Exception as exc:
            module = None
            _report_once(shim, exc)
        _compiled.append(module)
    return _compiled[0]


def load_compiled(shim: Tracer) -> None:
    """On any torch, where the compiled path is in use: load build-hooks' module once (its counter
    and tensor readers serve the compiled path from then on). Called as a group is first seen (shim.first_sight).
    Never raises."""
    try:
        settings = _compiled_path_settings(shim)
        if settings is not None:
            _compiled_hooks(shim, settings)
    except Exception as exc:   # reported once; tracing steps aside
        _report(shim, exc)


def compiled_in_use() -> bool:
    """Whether this process loaded `colltrace build-hooks`' module (its hooks where torch has them,
    its counter and tensor readers)."""
    return bool(_compiled and _compiled[0] is not None)


def _report_once(shim: Tracer, exc) -> None:
    """Said once per process on stderr; tracing goes on (the Python hooks record the same)."""
    if _said:
        return
    _said.append(exc)
    rank = getattr(shim.recorder, "rank", "?")
    sys.stderr.write(f"colltrace: rank {rank}: the module `colltrace build-hooks` built cannot be used ({exc!r}); "
                     "using the Python route (the same records; run `colltrace build-hooks` again)\n")


_said: list = []


def _compiled_path_settings(shim: Tracer):
    """The shim's settings where the compiled path is in use; None where it is not: no compiled
    path, COLLTRACE_PURE=1, a shim that is no module (tests)."""
    settings = shim.settings() if hasattr(shim, "settings") else None
    if not fastpath.available() or settings is None or getattr(settings, "pure", False) or type(shim) is not type(sys):
        return None
    return settings


def _kinds(shim: Tracer):
    """Per HookOpName value, what the compiled hook case does with it: 1 takes it (its op follows
    from the name and the inputs' count), 2 takes it with the outputs' count too, 0 leaves it to the
    Python hook (a root, a peer, a name it does not know). None where the compiled case is not used:
    no compiled path, COLLTRACE_PURE=1, a shim that is no module (tests)."""
    if _compiled_path_settings(shim) is None:
        return None
    if not _kinds_table:
        table = None
        try:
            members = sys.modules["torch._C._distributed_c10d"].HookOpName.__members__
            values = {}
            for text, member in members.items():
                family = _NAMES.get(text.lower().replace("_", ""))
                values[int(member)] = (1 if family in ("allreduce", "barrier") else 2 if family in _FAST_OPS else 0)
            if values and min(values) >= 0 and max(values) < 256:
                table = bytes(values.get(i, 0) for i in range(max(values) + 1))
        except Exception:   # a torch without HookOpName, or odd members: no table, Python gates
            table = None
        _kinds_table.append(table)
    return _kinds_table[0]


_exit_registered = False


def _register_exit() -> None:
    """Take the hooks off every group before the interpreter shuts down: a group that outlives
    Python's finalization (one never destroyed, as Lightning and accelerate leave them) would
    otherwise call or free Python hook objects from C++ after the interpreter is gone (SIGSEGV at
    exit, seen with torch 2.14.1)."""
    global _exit_registered
    import atexit

    _exit_registered = True
    atexit.register(detach_all)


def detach_all() -> None:
    with _lock:
        groups = list(_attached)
        _attached.clear()
    for pg in groups:
        for fn in ("unregister_pre_hook", "unregister_post_hook"):
            try:
                getattr(pg, fn)(HOOK_ID)
            except Exception:   # a group destroyed already, a pybind error at exit: nothing left to detach
                pass


def _report(shim: Tracer, exc) -> None:
    rec = shim.recorder
    if rec is not None:
        try:
            rec.internal_error(exc)
        except Exception:   # a recorder torn down: never an exception into the collective
            pass


def _user_frame(frame, shim_file, torch_dir):
    """The stack to record while torch.export traces: from `frame`, or where a colltrace wrapper
    stands on it (one that stepped aside and called torch itself), from its caller, as
    the wrapper would have recorded it; colltrace's own frames are never a user's stack. Only
    torch.distributed's own frames (the function and its logger) can stand between the hook and
    such a wrapper, so the walk stops at the first other frame: DDP's reducer checks one."""
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if name == shim_file:
            while f is not None and f.f_code.co_filename == shim_file:
                f = f.f_back
            return f
        if not name.startswith(torch_dir):
            return frame
        f = f.f_back
    return frame


def _make_pre(ref, shim: Tracer):
    getframe = sys._getframe
    dist = sys.modules.get("torch.distributed")   # imported: a group exists
    dist_file = getattr(dist, "__file__", None)
    torch_dir = os.path.dirname(dist_file) + os.sep if dist_file else "\0"
    compiler = sys.modules.get("torch.compiler")
    local = _local
    gs_cache: list = []

    def pre_hook(args):
        try:
            rec = shim.recorder
            if rec is None or rec.disabled or rec.local.depth:
                return   # untraced, or a part of the wrapper's logical op
            left = local.open
            if left is not None:
                # The previous op's post-hook never came: it raised inside the backend.
                local.open = None
                rec.fail(left[1], RuntimeError("the collective raised before returning its work"))
            if gs_cache and gs_cache[0] is rec:
                gs = gs_cache[1]
            else:
                pg = ref()
                if pg is None:
                    return
                gs = rec.group_state(pg, shim.first_sight)
                gs_cache[:] = [rec, gs]
            ins = args.input_tensors
            name = args.name
            bop = _names.get((name, len(ins)))
            if bop is None:   # output_tensors builds a list: read only for the families that need it
                outs = args.output_tensors
                bop = op_name(name, len(ins), len(outs))
                if bop not in _NEEDS_OUTS:
                    _names[(name, len(ins))] = bop
            elif bop == "recv":
                outs = args.output_tensors
            is_async = bool(args.async_op)
            flags = F_ASYNC if is_async else 0
            root = peer = -1
            pair = None
            r = args.root
            if bop in ("send", "recv"):
                flags |= F_P2P
                peer = to_global(gs, r) if r is not None and r >= 0 else -1
                me = rec.rank
                pair = (me, peer) if bop == "send" else (peer, me)
                tensors = ins if bop == "send" else outs
            else:
                if r is not None and r >= 0:
                    root = to_global(gs, r)
                tensors = ins
            if gs.lanes is not None:   # a group of several backends: the one this op went to
                gs = gs.lane(device_type(tensors))
            shapes, dtypes, _ = describe_tensors(tensors)
            backend_op = BACKEND_OVERRIDES.get((gs.backend, bop), bop)
            sig = rec.sig_id((bop, backend_op, gs.id, shapes, dtypes, None, root, peer, is_async))
            try:
                frame = getframe(1)
                if getattr(compiler, "_is_compiling_flag", False):   # only then does a wrapper step aside for torch
                    frame = _user_frame(frame, shim.__file__, torch_dir)
            except ValueError:   # a thread with no Python frames (a C++ autograd thread)
                frame = None
            local.open = (args.op_id, rec.enter(gs, sig, frame, flags, pair, peer))
        except Exception as exc:   # reported once; tracing steps aside: never an exception into the user's collective
            local.open = None
            _report(shim, exc)

    return pre_hook


def _make_learn(ref, shim: Tracer):
    def learn(rec, args, ins, is_async):
        """What the compiled pre-hook needs for ops like this one (its HookOpName, the tensors'
        counts, the one input's shape and dtype, async_op), interned as pre_hook interns them
        (fastpath.learned); False for ops that are pre_hook's alone (a root, a peer); None for a
        group not described yet."""
        pg = ref()
        if pg is None:
            return None
        gs = rec.group_state(pg, shim.first_sight)
        if gs is None or gs.seq_fn is None:
            return None
        bop = op_name(args.name, len(ins), len(args.output_tensors))
        r = args.root
        if bop not in _FAST_OPS or (r is not None and r >= 0):
            return False
        shapes, dtypes, _ = describe_tensors(ins)
        backend_op = BACKEND_OVERRIDES.get((gs.backend, bop), bop)
        sig = rec.sig_id((bop, backend_op, gs.id, shapes, dtypes, None, -1, -1, bool(is_async)))
        return fastpath.learned(sig, gs, one_step=bop in _ONE_STEP)

    return learn


def _make_post(shim: Tracer):
    local = _local

    def post_hook(args):
        try:
            held = local.open
            if held is None:
                return
            local.open = None
            op_id, ctx = held
            rec = shim.recorder
            if rec is None or rec.disabled or op_id != args.op_id:
                return
            work = args.work
            # The post-hook fires when the Work is returned, not when it completes: the poller
            # marks the record complete once the Work says so.
            rec.exit(ctx, done=work is None, waitable=work)
        except Exception as exc:   # reported once; tracing steps aside
            _report(shim, exc)

    return post_hook
