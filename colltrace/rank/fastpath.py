"""The compiled hot path (colltrace/rank/_fastpath.c), where it was built: which wrappers it
takes, and COLLTRACE_PURE=1 to keep to the Python wrappers.

It takes the collectives of one tensor (all_reduce, all_gather, reduce_scatter, all_to_all,
barrier and their tensor forms, and the rooted broadcast, reduce, gather and scatter; no p2p)
and, for each call, only the common case: one CPU tensor, blocking, its group, signature,
thread and stack interned. Every other call, and any call where something is not as expected,
goes to the Python wrapper, which writes the same slots; tests/integration/test_fastpath.py
checks both routes record the same events.
"""
from __future__ import annotations

import sys
from typing import Any

_fastpath: Any   # the C extension (no types mypy can read), or None
if not getattr(sys, "_is_gil_enabled", lambda: True)():
    # A free-threaded interpreter running without the GIL: the extension relies on the GIL, and
    # importing it would turn the GIL back on for the whole program. The Python wrappers then.
    _fastpath = None
else:
    try:
        # the C extension has no types mypy can read; the name is declared above
        from colltrace.rank import _fastpath  # type: ignore[attr-defined,no-redef]  # C: no types
    except ImportError:   # not built (no compiler at install time): the Python wrappers
        _fastpath = None
# A build older than this source (a checkout updated without reinstalling) lacks what the code
# below calls: the Python wrappers then, not an AttributeError inside a rank.
if _fastpath is not None and not all(hasattr(_fastpath, n)
                                     for n in ("Plan", "Local", "Gate", "HookLocal", "drain", "Counter")):
    _fastpath = None


# Collectives that are one backend op (one step of the group's counter) whatever they are given:
# the counter is read before the call only. monitored_barrier (2 steps on gloo) and the rest
# read it after the call too.
ONE_STEP = frozenset(("all_reduce", "all_gather", "all_gather_single", "all_gather_into_tensor", "_all_gather_base",
                      "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base",
                      "all_to_all_single", "all_to_all", "barrier"))


# What learn() says of a kind of call, for the compiled path (a Plan's and a Gate's alike): one
# tuple, in this order (_fastpath.c's L_* and LEARNED_FIELDS; tests/unit/test_fastpath_reads.py).
LEARNED = ("sig", "wrapper_only", "gs", "seq_fn", "pg", "gid", "one_step")


def learned(sig: int, gs, *, wrapper_only: bool = False, one_step: bool = False) -> tuple:
    """The tuple learn() returns: the signature's id and the group's state (its counter getter, the
    group held weakly and its id are read from it); wrapper_only: such calls are the Python
    wrapper's alone; one_step: one backend step whatever it is given."""
    return (sig, bool(wrapper_only), gs, gs.seq_fn, gs.pg, gs.id, bool(one_step))


def available() -> bool:
    return _fastpath is not None


def thread_local(settings):
    """The recorder's per-thread depth where the compiled path runs (a C thread-local it reads
    without a lookup), else None: the recorder keeps a threading.local."""
    if _fastpath is None or getattr(settings, "pure", False):
        return None
    return _fastpath.Local()


def method_gate(orig, slow, settings):
    """A method standing for `orig` that calls it directly inside a traced call (the thread's depth,
    read in C) and `slow` outside: where the compiled path runs; else `slow` itself, which tests
    the depth in Python."""
    if _fastpath is None or getattr(settings, "pure", False) or not hasattr(_fastpath, "MethodGate"):
        return slow
    return _fastpath.MethodGate(orig, slow)


def counter(start: int, settings):
    """A counter for the ring's serial or the record ids: the compiled one where the compiled path
    is in use (it takes a number without making an object), else itertools.count. next() works on
    both: the Python writers and the compiled path draw from the same one."""
    if _fastpath is None or getattr(settings, "pure", False):
        import itertools

        return itertools.count(start)
    return _fastpath.Counter(start)


def drainer(settings):
    """The recorder's poller's loop compiled (_fastpath.drain), where the compiled path is in use;
    else None: the Python loop. Both write the same COMPLETE slots."""
    if _fastpath is None or getattr(settings, "pure", False):
        return None
    return _fastpath.drain


def use_readers(module) -> None:
    """Group counters and plain tensors read through `colltrace build-hooks`' C++ readers (a virtual
    call, where pybind's dispatch costs ~1,300 instructions per traced collective; the sizes, where
    torch's getters make a torch.Size, ~700), where both are built. None: through Python again."""
    use = getattr(_fastpath, "use_readers", None)
    if use is not None:
        use(getattr(module, "seq_reader", None), getattr(module, "tensor_reader", None))


def hook_local():
    """hooks.py's per-thread open op where the compiled path is built: a C thread-local the compiled
    hook case (hook_gates) and the Python hooks share; else None (a threading.local)."""
    return None if _fastpath is None else _fastpath.HookLocal()


def hook_gates(pre, post, ref, shim_globals, learn, kinds):
    """c10d's pre/post hooks for one group (held weakly by `ref`) behind the compiled depth test and,
    where `kinds` is given (the compiled path in use), with the hook route's common case taken in C:
    an op named by its HookOpName and tensors alone (no root, no peer), its signature as learn(rec,
    args, input_tensors, is_async) said; `pre`/`post` (the Python hooks) take every other call."""
    if _fastpath is None:
        return pre, post
    if kinds is None:
        return _fastpath.Gate(pre), _fastpath.Gate(post)
    return (_fastpath.Gate(pre, 1, ref, shim_globals, learn, kinds),
            _fastpath.Gate(post, 2, ref, shim_globals, None, kinds))


def plan(orig, slow, learn, shim_globals: dict, world, non_member, params, tensor_param, reducing: bool,
         one_step: bool = False, root_param: str | None = None):
    """The compiled hot path for one collective, or None where it does not apply.
    params: the original's parameter names, in order; world: c10d's _world (its default group);
    root_param: a rooted op's "src" or "dst" (its group_src/group_dst is read beside it)."""
    if _fastpath is None:
        return None

    def pos(name):
        return params.index(name) if name in params else -1

    if tensor_param is not None and tensor_param not in params:
        return None
    op_default = None
    if reducing:
        import inspect

        p = inspect.signature(orig).parameters.get("op")
        op_default = None if p is None or p.default is inspect.Parameter.empty else p.default
    group_root = f"group_{root_param}" if root_param and f"group_{root_param}" in params else None
    # by name: _fastpath.c's Plan_init takes its fields as keywords (read once, at install)
    return _fastpath.Plan(orig=orig, slow=slow, learn=learn, shim=shim_globals, world=world, non_member=non_member,
                          tensor_pos=pos(tensor_param or ""), tensor_name=tensor_param,
                          group_pos=pos("group"), op_pos=pos("op") if reducing else -1, op_default=op_default,
                          async_pos=pos("async_op"), has_tensor=tensor_param is not None, reducing=reducing,
                          one_step=one_step, root_pos=pos(root_param) if root_param else -1, root_name=root_param,
                          groot_pos=pos(group_root) if group_root else -1, groot_name=group_root)
