"""What a collective call is, as its record says it: its tensors' shapes and dtypes, its reduce
op, the backend op it becomes, its group's name, description, members and counter, a root in
global ranks, and its input's digest. Read by the wrappers (shim.py) and c10d's hooks (hooks.py)
alike; nothing here patches anything or has a side effect.
"""
from __future__ import annotations

import ctypes
import inspect
import sys
import types
import weakref
import zlib
from typing import Any, cast

from colltrace.origins import TORCH_PACKAGES
from colltrace.words import group_desc as described

# What the recorder interns of a call, once per distinct value (the trace's "sig" definition): (op,
# backend op, group id, shapes, dtypes, reduce op, root, peer, async). A plain tuple: the wrappers
# and hooks build one per collective, and a NamedTuple's constructor is a Python call; mypy holds
# every place that builds one to this shape (Recorder.sig_id's parameter).
CallSig = tuple[str, str, str, tuple, tuple, str | None, int, int, bool]

MAX_NAMES_SCANNED = 20000   # module globals looked through for a framework's name of a group (bounded)
# Backends that run an op as something else; recorded so ranks compare like with like.
BACKEND_OVERRIDES = {("gloo", "reduce_scatter_base"): "allreduce"}


_dtype_names: dict = {}   # dtype -> its name: dtype_name's memo
_redop_names: dict = {}   # reduce op -> its name: redop_name's memo


def dtype_name(dt, _cache=_dtype_names):
    s = _cache.get(dt)
    if s is None:
        s = _cache[dt] = str(dt).replace("torch.", "")
    return s


def redop_name(op, _cache=_redop_names):
    if op is None:
        return None
    try:
        name = _cache.get(op)
    except TypeError:  # an unhashable custom op (premul sum): named each time
        return str(op).rsplit(".", 1)[-1]
    if name is None:
        name = _cache[op] = str(op).rsplit(".", 1)[-1]
    return name


def describe_tensors(t):
    """(shapes, dtypes, on_cuda) of a tensor or a list of tensors; never raises."""
    if t is None:
        return (), (), False
    if isinstance(t, (list, tuple)):
        shapes, dtypes, cuda = [], [], False
        for x in t[:64]:
            s, d, c = describe_tensors(x)
            shapes.extend(s)
            dtypes.extend(d)
            cuda = cuda or c
        return tuple(shapes), tuple(dtypes), cuda
    shape = getattr(t, "shape", None)
    if shape is None:
        return (), (), False
    return (tuple(shape),), (dtype_name(t.dtype),), t.is_cuda


def cuda_device(t) -> int | None:
    """The device index of a tensor on a CUDA GPU (the first such of a list), or None."""
    if isinstance(t, (list, tuple)):
        for x in t[:64]:
            d = cuda_device(x)
            if d is not None:
                return d
        return None
    if not getattr(t, "is_cuda", False):
        return None
    return t.get_device()


def device_type(t, default: str = "cpu") -> str:
    """The device type of a tensor (the first of a list): the backend an op on it goes to, in a
    group of several backends."""
    if isinstance(t, (list, tuple)):
        t = next((x for x in t[:64] if hasattr(x, "device")), None)
    dev = getattr(t, "device", None)
    return default if dev is None else dev.type


def input_digest(t, limit: int) -> int | None:
    """CRC-32 of a CPU tensor's bytes, or None (on a GPU: reading it would sync; sparse; too big)."""
    if getattr(t, "is_cuda", True) or t.device.type != "cpu" or t.is_sparse:
        return None
    n = t.numel() * t.element_size()
    if n == 0 or n > limit:
        return None
    if not t.is_contiguous():
        t = t.detach().contiguous()   # a private copy (a sliced batch, say); the user's tensor is untouched
    return zlib.crc32(ctypes.string_at(t.data_ptr(), n))


def param_getter(sig: inspect.Signature, name: str | None):
    """A fast getter for one argument of a call, by position or keyword, with its default."""
    if name is None or name not in sig.parameters:
        return lambda args, kwargs: None
    params = list(sig.parameters)
    idx = params.index(name)
    default = sig.parameters[name].default
    default = None if default is inspect.Parameter.empty else default

    def get(args, kwargs):
        if len(args) > idx:
            return args[idx]
        return kwargs.get(name, default)

    return get


def group_attr(pg, attr: str) -> str:
    """group_name / group_desc, or "" where the group has none: a group defined in Python
    (dist.ProcessGroup subclassed, as custom backends are) raises RuntimeError here."""
    try:
        return str(getattr(pg, attr, ""))
    except Exception:   # a Python-defined group's RuntimeError, or a pybind one: a name is a nicety
        return ""


def describe_group(pg):
    """(name, desc, global ranks, backend, its sequence counter's reader, lanes): no side effects.
    lanes: backend_lanes(pg)."""
    from torch.distributed import distributed_c10d as c10d

    ranks = list(c10d.get_process_group_ranks(pg))
    try:
        backend = str(c10d.get_backend(pg))
    except Exception:   # a group c10d knows no backend of (a stand-in, a destroyed one): no name
        backend = ""
    get_seq = None
    fn: Any = getattr(type(pg), "_get_sequence_number_for_group", None)
    try:
        fn(pg)
        ref = weakref.ref(pg)   # a bound method would keep the group alive past its destruction

        def get_seq():
            p = ref()
            return fn(p) if p is not None else -1
        cast(Any, get_seq).seq_fn = fn   # Any: mypy knows no such attribute on a function
    except Exception:   # fn None, or a backend without a counter: numbered by the calls seen
        pass
    # c10d's own registry names every group it made, whatever its class (the same on every rank)
    name = group_attr(pg, "group_name") or str(c10d._world.pg_names.get(pg, "") or "")
    return name, group_desc(pg), ranks, backend, get_seq, backend_lanes(pg, backend)


def group_desc(pg) -> str:
    """What a group is: torch's description ("default_pg", a DeviceMesh's "mesh_dp"); for one
    made without (torch's placeholder "undefined": DeepSpeed's data-parallel group, say) the name
    the code calling it keeps it under, where one is found; else "" (its ranks say what it is)."""
    desc = described(group_attr(pg, "group_desc"))
    if desc:
        return desc
    try:
        return kept_as(pg, _callers_packages(sys._getframe(1))) or ""
    except Exception:   # a name is a nicety: never a failure
        return ""


def _callers_packages(frame) -> set:
    """The top-level packages of the code on the stack (the user's script as "__main__"), not
    torch's, colltrace's or the standard library's: where a name for a group is looked for."""
    out = set()
    while frame is not None:
        top = str(frame.f_globals.get("__name__") or "").split(".", 1)[0]
        if top and top not in TORCH_PACKAGES and top not in sys.stdlib_module_names:
            out.add(top)
        frame = frame.f_back
    return out


def kept_as(pg, packages) -> str | None:
    """The module global (or an entry of a module-level dict) of these packages that holds
    the group: "deepspeed.utils.groups._WORLD_GROUP", "_EXPERT_PARALLEL_GROUP['ep_size_2']" in
    its module; a bare name in the user's script. Without side effects: module dicts are only read."""
    seen = 0
    for mod_name, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType) or mod_name.split(".", 1)[0] not in packages:
            continue
        prefix = "" if mod_name == "__main__" else mod_name + "."
        for key, value in list(getattr(mod, "__dict__", {}).items()):
            seen += 1
            if seen > MAX_NAMES_SCANNED:
                return None
            if value is pg:
                return f"{prefix}{key}"
            if type(value) is dict and 0 < len(value) <= 64:
                for k, v in value.items():
                    if v is pg:
                        return f"{prefix}{key}[{k!r}]"
    return None


def group_timeout(pg) -> float | None:
    """The group's collective timeout in seconds, as its backend holds it (gloo and NCCL keep it
    in their options); None where it cannot be read. Read once, as the group is first seen: it
    tells a post-mortem that a rank's abort was the backend's timeout ending a wait."""
    try:
        import torch
    except ImportError:   # a stand-in group where torch is not installed (the torch-free unit tests)
        return None
    for dev in ("cpu", "cuda"):
        try:
            t = pg._get_backend(torch.device(dev)).options._timeout
            return float(t.total_seconds())
        except Exception:   # a backend without this device or options (a Python-defined one): the next, else None
            continue
    return None



def _counter(ref, device, fn):
    """A reader of one backend's counter in a group of several, through the group held weakly."""
    def get_seq():
        p = ref()
        return fn(p._get_backend(device)) if p is not None else -1
    return get_seq


def backend_lanes(pg, backend: str = ""):
    """{device type: (backend name, its counter's reader or None)} for a group whose device types
    go to different backends ("cpu:gloo,cuda:nccl": an op goes to the backend of its tensors'
    device, and each backend counts only its own ops); None for a group of one backend."""
    try:
        import torch

        types = [d.type for d in pg._device_types]
        if len(types) < 2:
            return None
        backends = {t: pg._get_backend(torch.device(t)) for t in types}
    except Exception:   # a torch without _device_types, a pybind error: one backend
        return None
    if len({id(b) for b in backends.values()}) < 2:
        return None
    names = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)   # "cpu:gloo,cuda:nccl"
    ref = weakref.ref(pg)
    lanes = {}
    for t, b in backends.items():
        fn: Any = getattr(type(b), "_get_sequence_number_for_group", None)   # None: fn(b) raises, caught below
        try:
            fn(b)
            get_seq = _counter(ref, torch.device(t), fn)
        except Exception:   # a backend without a counter (nccl2): numbered by the calls seen
            get_seq = None
        lanes[t] = (names.get(t) or type(b).__name__, get_seq)
    return lanes


def to_global(gs, group_rank):
    try:
        return gs.ranks[group_rank]
    except (IndexError, TypeError):
        return -1


def given_root(gs, r, gr):
    """A rooted op's root as the record has it: src/dst as passed, else group_src/group_dst as a
    global rank, else -1."""
    return r if r is not None else to_global(gs, gr) if gr is not None else -1
