"""What each rank feeds its data-parallel model, sampled: the evidence for duplicate_data.

A DDP or FSDP job whose ranks all read the same batches (a DataLoader without a
DistributedSampler, or one built before init_process_group) runs, its loss falls, and N-1 of N
ranks are wasted; none of its collectives differ. What differs is the batch each rank feeds its
model. So, on by default:

- DistributedDataParallel's forward is wrapped, and FSDP2's outermost fully_shard'ed module gets
  a forward pre-hook, registered when the user wraps the model; both hand the inputs on
  untouched: the model computes what it did. They count training forwards (grad on, module in train
  mode: an evaluation pass may feed every rank the same batch), and on the first FIRST_STEPS and
  then every EVERY-th takes a CRC-32 of a few strided pieces of the input's CPU tensors, read in
  place (no torch op, no copy). A CUDA input is not read (that would sync): the batch its
  DataLoader gave, still on the CPU, is digested instead (else one note says why not).
- DataLoader records where it was built, before or after init_process_group, and its sampler,
  so the finding can name the user's line; its iterators say which loader gave the last batch.

Each sampled step is one line in the rank's defs file (k "batch"); the analyzer compares the
ranks of the model's data-parallel group (colltrace/analysis/batches.py). The rank never talks to
anyone. COLLTRACE_DIGEST (the exhaustive mode) samples every step and digests every byte up to
its size. A failure here is said once and this sampling stops; the rest of tracing goes on.
"""
from __future__ import annotations

import ctypes
import functools
import sys
import threading
import time
import weakref
import zlib
from typing import Any, cast

from colltrace.rank import patches

FIRST_STEPS = 8      # every training step at first: a short job is judged too
EVERY = 64           # then one step in EVERY
PIECES = 8           # strided pieces read from each tensor
PIECE = 32           # bytes per piece
MIN_BYTES = 64       # smaller inputs (a flag, a step count) may well be equal on purpose
MAX_TENSORS = 8      # tensors of one batch digested (the first ones found)
FRAMES = 24          # frames kept of a DataLoader's construction site

_string_at = getattr(ctypes, "_string_at", ctypes.string_at)   # the C function string_at wraps: a frame less
_crc32 = zlib.crc32

_state: dict[str, Any] = {"installed": False, "settings": None, "recorder": lambda: None, "off": False, "said": False}
_models: dict = {}   # id(module) -> _Model, dropped when the module is freed (before its id can be reused)
_loaders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # DataLoader -> its info
_last_loader = [0]   # id of the loader whose iterator gave the last batch (0: none seen)
# A model fed GPU tensors is compared by the batch its loader gave, still on the CPU: once a
# sampled step found its inputs unreadable (_need), the loader digests the next batch when the
# next training step will be sampled (_want).
_need = [False]
_want = [False]
_given = [None]      # (digest, bytes read) of that batch, until the step that uses it
_lock = threading.Lock()
_ids = {"model": 0, "loader": 0}
_is_compiling = lambda: False  # noqa: E731 - torch.compiler.is_compiling once torch is imported
_grad_enabled = lambda: True  # noqa: E731 - torch.is_grad_enabled


class _Model:
    __slots__ = ("id", "kind", "group", "step", "every", "first", "written", "handle", "noted", "ref")

    def __init__(self, kind: str, group: dict | None):
        with _lock:
            _ids["model"] += 1
            self.id = _ids["model"]
        self.kind, self.group = kind, group
        self.step = 0
        self.written = False   # its "dp" definition line
        self.handle = None     # the pre-hook's handle (FSDP)
        self.ref: weakref.ref[Any] | None = None   # the module, weakly
        self.noted: set[str] = set()   # notes written once (a CUDA input)
        exhaustive = bool(_state["settings"] and _state["settings"].digest_bytes)
        self.first, self.every = (1 << 62, 1) if exhaustive else (FIRST_STEPS, EVERY)


# ---- the hot path: once per forward ------------------------------------------------------------

def _pre_hook(module, args, kwargs):
    """FSDP's forward pre-hook (with_kwargs): counts training steps, samples a few. Returns None."""
    if _is_compiling() or _state["off"]:
        return None   # Dynamo traces hooks: it folds this test and sees nothing of the rest
    m = _models.get(id(module))
    if m is None or not module.training or not _grad_enabled():
        return None   # evaluation: every rank may legitimately see the same batch
    m.step = step = m.step + 1
    if _need[0]:
        _want[0] = step + 1 <= m.first or not (step + 1) % m.every
    if step > m.first and step % m.every:
        return None
    try:
        _sample(m, step, args, kwargs, sys._getframe(1))
    except Exception as exc:   # said once, sampling stops: never an exception into the user's forward
        _fail(exc)
    return None


def _ddp_forward(orig):
    """DistributedDataParallel.forward, counted as _pre_hook counts. Not a hook: a module with a
    forward hook leaves Module.__call__'s fast path, ~17,000 instructions a step (DDP has none)."""
    @functools.wraps(orig)
    def forward(self, *inputs, **kwargs):
        if not _is_compiling() and not _state["off"]:
            m = _models.get(id(self))
            if m is not None and self.training and _grad_enabled():
                m.step = step = m.step + 1
                if _need[0]:
                    _want[0] = step + 1 <= m.first or not (step + 1) % m.every
                if step <= m.first or not step % m.every:
                    try:
                        _sample(m, step, inputs, kwargs, sys._getframe(1))
                    except Exception as exc:   # said once, sampling stops: DDP's forward runs regardless
                        _fail(exc)
        return orig(self, *inputs, **kwargs)

    patches.mark(forward, orig)
    return forward


def _sample(m: _Model, step: int, args, kwargs, frame) -> None:
    rec = _state["recorder"]()
    if rec is None or rec.disabled:
        return
    defs = rec.defs
    if not m.written:
        m.written = True
        defs.write({"k": "dp", "id": m.id, "kind": m.kind, "group": m.group, "exhaustive": m.every == 1})
    limit = _state["settings"].digest_bytes
    digest, nbytes, skipped = _digest(_tensors(args, kwargs), limit)
    given, _given[0] = _given[0], None
    via = None
    if digest is None and skipped and not _need[0]:
        _need[0] = _want[0] = True   # from the next sampled step on
    if digest is None and skipped and given is not None and given[0] is not None:
        (digest, nbytes), via = given, "loader"   # the batch as its loader gave it, on the CPU
    elif skipped and skipped not in m.noted:
        m.noted.add(skipped)
        defs.write({"k": "note", "t": time.time(), "text": f"{m.kind} inputs not read ({skipped}): compared by the "
                    "batches a DataLoader gives, on the CPU, from the next sampled step on (none if no DataLoader)"})
    line = {"k": "batch", "m": m.id, "step": step, "t": time.time(), "d": digest, "n": nbytes,
            "stack": rec.stack_id(frame)}
    if via:
        line["via"] = via
    lid = _last_loader[0]
    if lid:
        line["loader"] = lid
    defs.write(line)


def _tensors(args, kwargs) -> list:
    """The batch's tensors: positional and keyword arguments, one level into lists, tuples and
    dicts (a dict of input_ids and labels), the first MAX_TENSORS."""
    import torch

    Tensor = torch.Tensor
    out = []
    todo = list(args) + list(kwargs.values()) if kwargs else list(args)
    for x in todo:
        if isinstance(x, Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out.extend(y for y in x if isinstance(y, Tensor))
        elif isinstance(x, dict):
            out.extend(y for y in x.values() if isinstance(y, Tensor))
        if len(out) >= MAX_TENSORS:
            break
    return out[:MAX_TENSORS]


def _digest(tensors, limit: int):
    """(CRC-32 as 8 hex digits or None, bytes read, why some tensor was skipped or None).

    Read in place through data_ptr: no torch op runs, nothing is copied or synced. Only plain,
    dense, contiguous CPU tensors of MIN_BYTES or more are read; a batch whose pieces are all one
    byte value (padding, a mask of zeros) says nothing about where it came from: None."""
    import torch

    crc, nbytes, skipped, varied = 0, 0, None, False
    for t in tensors:
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            skipped = skipped or f"{type(t).__name__} tensors are not read"
            continue
        if not t.is_cpu:
            if t.is_cuda:
                skipped = skipped or "they are on the GPU (reading them would sync the device)"
            else:
                skipped = skipped or f"they are on {t.device.type}"
            continue
        if t.layout is not torch.strided:
            continue
        n = t.nbytes
        if n < MIN_BYTES:
            continue
        crc = _crc32(n.to_bytes(8, "little"), crc)
        contiguous = t.is_contiguous()
        if limit and n <= limit:
            if not contiguous:
                t = t.detach().contiguous()   # a private copy (a sliced batch); the user's tensor is untouched
            data = _string_at(t.data_ptr(), n)
            crc = _crc32(data, crc)
            varied = varied or data.count(data[:1]) != n
            nbytes += n
            continue
        data = b"".join(_pieces(t.data_ptr(), n) if contiguous else _strided_pieces(t))
        crc = _crc32(data, crc)
        varied = varied or data.count(data[:1]) != len(data)
        nbytes += len(data)
    if not nbytes or not varied:
        return None, nbytes, skipped
    return f"{crc:08x}", nbytes, skipped


def _pieces(ptr: int, n: int):
    """PIECES pieces of PIECE bytes, evenly spread over n contiguous bytes at ptr."""
    span = n - PIECE
    return [_string_at(ptr + span * i // (PIECES - 1), PIECE) for i in range(PIECES)]


def _strided_pieces(t):
    """The same for a strided view (batch[:, :-1]): PIECES elements spread over it by flat index,
    each read with what follows it in the last dim when that dim is dense, up to PIECE bytes."""
    sizes, strides, esize = t.shape, t.stride(), t.element_size()
    numel, ptr, out = t.numel(), t.data_ptr(), []
    last = sizes[-1] if sizes else 1
    dense_last = not strides or strides[-1] == 1
    for i in range(PIECES):
        flat = (numel - 1) * i // (PIECES - 1)
        off, rest = 0, flat
        for size, stride in zip(reversed(sizes), reversed(strides), strict=False):
            rest, idx = divmod(rest, size)
            off += idx * stride
        run = min(last - flat % last, PIECE // esize) if dense_last else 1
        out.append(_string_at(ptr + off * esize, max(run, 1) * esize))
    return out


def _fail(exc: BaseException) -> None:
    """Said once, then this sampling stops for good; tracing and the job go on."""
    _state["off"] = True
    if _state["said"]:
        return
    _state["said"] = True
    try:
        rec = _state["recorder"]()
        rank = rec.rank if rec is not None else "?"
        sys.stderr.write(f"colltrace: internal error in batch sampling, it stops on rank {rank} "
                         f"(the job is unaffected): {exc!r}\n")
        if rec is not None:
            rec.defs.write({"k": "note", "t": time.time(), "text": f"batch sampling stopped: {exc!r}"})
    except Exception:   # stderr or the defs file gone: the sampling is off all the same
        pass


# ---- where models and loaders are made ----------------------------------------------------

def _group_of(pg, kind: str) -> dict | None:
    """{"name", "desc", "ranks"} of a process group, the same on every rank; None if unknown."""
    import torch.distributed.distributed_c10d as c10d

    if pg is None:
        pg = c10d._get_default_group()
    ranks = [int(r) for r in c10d.get_process_group_ranks(pg)]
    from colltrace.rank.calls import group_desc

    name = str(getattr(pg, "group_name", "") or c10d._world.pg_names.get(pg, "") or "")
    return {"name": name or f"{kind}:" + ",".join(map(str, ranks)), "desc": group_desc(pg), "ranks": ranks}


def _mesh_group(mesh) -> dict | None:
    """FSDP2's data-parallel ranks: its mesh's (every dim: HSDP replicates and shards over data)."""
    if mesh is None:
        return _group_of(None, "fsdp")   # fully_shard's default mesh: the world
    if mesh.ndim == 1:
        return _group_of(mesh.get_group(), "fsdp")
    ranks = sorted(int(r) for r in mesh.mesh.flatten().tolist())
    return {"name": "fsdp:" + ",".join(map(str, ranks)), "desc": "FSDP mesh " + "x".join(map(str, mesh.mesh.shape)),
            "ranks": ranks}


def _watch(module, kind: str, group: dict | None, hook: bool) -> None:
    resolve()
    m = _Model(kind, group)
    key = id(module)
    # cast: mypy cannot type a lambda whose parameters take their values from defaults
    m.ref = weakref.ref(module, cast(Any, lambda _, key=key, models=_models: models.pop(key, None)))
    if hook:
        # before FSDP's own pre-hook (prepended), which moves the inputs to the GPU: what the user passed
        m.handle = module.register_forward_pre_hook(_pre_hook, with_kwargs=True, prepend=True)
    _models[key] = m


def _ddp_init(orig):
    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        if _state["off"] or id(self) in _models:
            return
        try:
            _watch(self, "DistributedDataParallel", _group_of(getattr(self, "process_group", None), "ddp"), False)
        except Exception as exc:   # said once, sampling stops: the user's DDP is made regardless
            _fail(exc)

    patches.mark(__init__, orig)
    return __init__


def _fully_shard(orig):
    @functools.wraps(orig)
    def fully_shard(module, *args, **kwargs):
        out = orig(module, *args, **kwargs)
        if _state["off"] or kwargs.get("dp_mesh_dims") is not None:
            return out   # an SPMD mesh: its data-parallel dims are not told apart here
        try:
            mods = list(module) if isinstance(module, (list, tuple)) else [module]
            inner = {id(x) for m in mods for x in m.modules()}
            for key, m in list(_models.items()):
                if m.kind == "FSDP" and key in inner and m.handle is not None:
                    m.handle.remove()   # fully_shard is applied inside out: the batch goes to the outermost
                    _models.pop(key, None)
            if len(mods) == 1:
                _watch(mods[0], "FSDP", _mesh_group(kwargs.get("mesh")), True)
        except Exception as exc:   # said once, sampling stops: fully_shard's result is the user's regardless
            _fail(exc)
        return out

    patches.mark(fully_shard, orig)
    return fully_shard


def _loader_init(orig):
    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        if _state["off"]:
            return
        try:
            info = _loader_info(self, sys._getframe(1))
        except Exception as exc:   # said once, sampling stops: the loader is made regardless
            _fail(exc)
            return
        try:
            _loaders[self] = info
        except TypeError:
            pass   # a subclass made unhashable (__eq__ without __hash__): its batches are not tied to it

    patches.mark(__init__, orig)
    return __init__


def _loader_info(loader, frame) -> dict:
    import torch.distributed.distributed_c10d as c10d

    frames: list[dict[str, Any]] = []
    while frame is not None and len(frames) < FRAMES:
        frames.append({"file": frame.f_code.co_filename, "line": frame.f_lineno, "func": frame.f_code.co_name})
        frame = frame.f_back
    frames.reverse()   # innermost last
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is not None and type(batch_sampler).__name__ != "BatchSampler":
        sampler = batch_sampler   # a custom batch sampler decides the split itself
    names = [c.__name__ for c in type(sampler).__mro__]
    info = {"frames": frames, "before_init": not c10d.is_initialized(), "sampler": type(sampler).__name__,
            "distributed": "DistributedSampler" in names}
    if "DistributedSampler" in names:
        info["num_replicas"] = getattr(sampler, "num_replicas", None)
    with _lock:
        _ids["loader"] += 1
        info["id"] = _ids["loader"]
    return info


def _loader_iter(orig):
    @functools.wraps(orig)
    def __iter__(self):
        it = orig(self)
        try:
            info = _loaders.get(self)   # TypeError for an unhashable one: caught below
            if info is not None:
                it.__dict__["_colltrace_loader"] = info
        except Exception:   # never in the way of the user's iterator
            pass   # an iterator without a __dict__: its batches are not tied to the loader
        return it

    patches.mark(__iter__, orig)
    return __iter__


def _loader_next(orig):
    @functools.wraps(orig)
    def __next__(self):
        batch = orig(self)
        info = self.__dict__.get("_colltrace_loader")
        if info is not None:
            _last_loader[0] = info["id"]
            if not info.get("written"):
                _write_loader(info)
            if _want[0] and not _state["off"]:
                try:
                    _given[0] = _digest(_tensors((batch,), None), _state["settings"].digest_bytes)[:2]
                except Exception as exc:   # an odd batch (any type of the user's): said once, the batch returned as is
                    _fail(exc)
        return batch

    patches.mark(__next__, orig)
    return __next__


def _write_loader(info: dict) -> None:
    """The loader's definition line, once, when its first batch is read by a traced rank."""
    rec = _state["recorder"]()
    if rec is None or rec.disabled:
        return
    info["written"] = True
    try:
        rec.defs.write({"k": "loader", **{k: v for k, v in info.items() if k != "written"}})
    except Exception as exc:   # the defs file full or gone: said once, sampling stops
        _fail(exc)


# ---- install ----------------------------------------------------------------------------------

_patches = patches.Patches()


def _patch_loader(mod) -> None:
    _patches.patch(mod.DataLoader, "__init__", _loader_init)
    _patches.patch(mod.DataLoader, "__iter__", _loader_iter)
    _patches.patch(mod._BaseDataLoaderIter, "__next__", _loader_next)


def _patch_ddp(mod) -> None:
    _patches.patch(mod.DistributedDataParallel, "__init__", _ddp_init)
    _patches.patch(mod.DistributedDataParallel, "forward", _ddp_forward)


def _patch_fsdp(mod) -> None:
    # The package's names only: FSDP's own module keeps its function (it reads fully_shard.state
    # through it), and every user import goes through the package.
    for name in ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard", "torch.distributed._composable.fsdp"):
        pkg = sys.modules.get(name)
        if pkg is not None:
            _patches.patch(pkg, "fully_shard", _fully_shard)


# module -> what patches it once it has run (torch imports c10d, where colltrace installs, before
# the DataLoader and DDP modules); the FSDP package is patched after its __init__
TARGETS = {
    "torch.utils.data.dataloader": _patch_loader,
    "torch.nn.parallel.distributed": _patch_ddp,
    "torch.distributed.fsdp": _patch_fsdp,
    "torch.distributed._composable.fsdp": _patch_fsdp,
}


def _run(name, module) -> None:
    try:
        TARGETS[name](module)
    except Exception as exc:   # a module not as expected: said once, sampling stops, its import goes on
        _fail(exc)


def install(settings, recorder) -> None:
    """Patch what is imported, and the rest as it is imported. `recorder()`: the live Recorder."""
    if _state["installed"]:
        return
    _state.update(installed=True, settings=settings, recorder=recorder, off=False)
    global _is_compiling, _grad_enabled
    try:
        import torch

        _grad_enabled = torch.is_grad_enabled
        _is_compiling = torch.compiler.is_compiling
    except Exception:   # a torch mid-import raises anything: never the user's import
        pass   # torch is still importing: resolved at the first sampled model (below)
    for name in TARGETS:   # one still executing (the DataLoader's module imports c10d): once it has run
        _patches.after_import(name, functools.partial(_run, name))


def resolve() -> None:
    """torch's functions, once torch has finished importing (init_process_group)."""
    global _is_compiling, _grad_enabled
    patches.catch_up()
    try:
        import torch

        _grad_enabled = torch.is_grad_enabled
        _is_compiling = torch.compiler.is_compiling
    except Exception:   # a torch without torch.compiler's function (an old release): the defaults stay
        pass


def uninstall() -> None:
    if not _state["installed"]:
        return
    _patches.restore()
    _need[0] = _want[0] = False
    _given[0] = None
    _last_loader[0] = 0
    for m in list(_models.values()):
        if m.handle is not None:
            m.handle.remove()
    _models.clear()
    _state.update(installed=False, off=False)
