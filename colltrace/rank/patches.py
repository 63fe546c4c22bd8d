"""How colltrace patches torch: one record of what it replaced, and one import hook.

`Patches` puts `factory(original)` in place of an attribute of a module or a class and records
(owner, name, original, new); `restore()` puts every original back, the last patch first. An
attribute already colltrace's (it carries `__colltrace_original__`, which every factory sets on
what it returns) is not patched again. Only installing and restoring run here: what a factory
returns is what torch calls, with nothing of this module in between.

`after_import(name, callback)` runs callback(module) right after the module named executes, or
now if it is already imported; a module still executing (it imported what installs colltrace)
is caught up with at the next import anywhere, or at `catch_up()`. The start-up hook
(colltrace._boot) uses it for torch.distributed.distributed_c10d, so it imports only what the
interpreter has at start.

It imports only what every interpreter has at start (no typing, no __future__, no threading).

PYTEST_DONT_REWRITE: the start-up hook imports it before pytest starts (see colltrace/__init__.py).
"""
import sys
from _thread import _local

ORIGINAL = "__colltrace_original__"   # set by every factory on what it returns: the function it wraps


def is_patched(obj) -> bool:
    return hasattr(obj, ORIGINAL)


def mark(new, orig) -> None:
    """new is colltrace's, in place of orig (a factory's last step; typed Any: a function
    object takes the attribute, which mypy does not know)."""
    setattr(new, ORIGINAL, orig)


def _held(owner, name: str):
    """What owner holds under name: a class's own attribute (not one it inherits), a module's."""
    return owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)


class Patches:
    """The patches and import watches one part of colltrace made, undone together."""

    def __init__(self) -> None:
        # (owner, name, original, new, whether the original was the owner's own), in the order made
        self.made: list[tuple[object, str, object, object, bool]] = []
        self.watches: list[Watch] = []

    def __len__(self) -> int:
        return len(self.made)

    def patch(self, owner, name: str, factory, may_refuse: bool = False, inherited: bool = False):
        """owner.name = factory(original); the new attribute, or None where there is none to patch
        (absent, or colltrace's already). A class's own attribute only, unless `inherited`: then
        one it inherits too, deleted again by restore() (the base's shows through as before).
        may_refuse: a pybind class, which may refuse the new attribute (TypeError, AttributeError),
        or a factory that cannot wrap its original: then it stays as it is (None)."""
        own = not isinstance(owner, type) or name in owner.__dict__
        orig = getattr(owner, name, None) if inherited else _held(owner, name)
        if orig is None or hasattr(orig, ORIGINAL):
            return None
        if may_refuse:
            try:
                new = factory(orig)
                setattr(owner, name, new)
            except (TypeError, AttributeError):
                return None
        else:
            new = factory(orig)
            setattr(owner, name, new)
        self.made.append((owner, name, orig, new, own))
        return new

    def original(self, owner, name: str):
        """What owner.name was before it was patched here (None: not patched here)."""
        for o, n, orig, _, _ in self.made:
            if o is owner and n == name:
                return orig
        return None

    def replacements(self, start: int = 0) -> dict:
        """{id(original): (original, new)} of the module attributes patched here, from the start-th
        patch on: what a by-name import made before (`from torch.distributed import all_reduce`)
        may still hold (shim._sweep). A class's attributes are reached through the class."""
        return {id(orig): (orig, new) for owner, _, orig, new, _ in self.made[start:] if not isinstance(owner, type)}

    def after_import(self, name: str, callback) -> "Watch":
        """after_import(), cancelled by restore()."""
        watch = after_import(name, callback)
        self.watches.append(watch)
        return watch

    def restore(self) -> None:
        """Every original back, the last patch first; the watches not yet run cancelled. An
        attribute replaced since (the user's own patch, pytest's monkeypatch, another tool's) is
        left as it is: putting the original back would undo theirs."""
        for watch in self.watches:
            watch.cancel()
        self.watches.clear()
        for owner, name, orig, new, own in reversed(self.made):
            try:
                if _held(owner, name) is not new:
                    continue
                if own:
                    setattr(owner, name, orig)
                else:
                    delattr(owner, name)
            except Exception:   # torch's modules half torn down at exit: what stays patched goes with them
                pass
        self.made.clear()


# ---- the import hook ------------------------------------------------------------------------

class Watch:
    """One callback waiting for its module."""

    __slots__ = ("name", "callback")

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def cancel(self) -> bool:
        """True: it had not run and now never will; False: it has run (or is running)."""
        found = False
        if self in _waiting.get(self.name, ()):
            _waiting[self.name].remove(self)
            if not _waiting[self.name]:
                del _waiting[self.name]
            found = True
        if self in _pending:
            _pending.remove(self)
            found = True
        _prune()
        return found


_waiting: dict[str, list[Watch]] = {}   # module not imported yet -> its watches
_pending: list[Watch] = []   # their module still executing when they were made (imported what installs colltrace)


def after_import(name: str, callback) -> Watch:
    """callback(module) right after the module named executes, or now if it is already imported.
    Runs once. The callback says its own failures: what it raises goes to the importer."""
    watch = Watch(name, callback)
    mod = sys.modules.get(name)
    if mod is not None and not _initializing(mod):
        callback(mod)
        return watch
    if mod is not None:
        _pending.append(watch)
    else:
        _waiting.setdefault(name, []).append(watch)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return watch


def catch_up() -> None:
    """Run the watches whose module has finished executing since (asked at every later import)."""
    for watch in list(_pending):
        mod = sys.modules.get(watch.name)
        if mod is None:
            _pending.remove(watch)   # its import failed
        elif not _initializing(mod):
            _pending.remove(watch)
            watch.callback(mod)


def _initializing(mod) -> bool:
    return bool(getattr(getattr(mod, "__spec__", None), "_initializing", False))


def _prune() -> None:
    """The finder leaves sys.meta_path once nothing waits (never from inside its own find_spec,
    whose caller iterates sys.meta_path: the finder after it would be skipped)."""
    if not _waiting and not _pending and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


class _Finder:
    """Wraps a watched module's exec_module: its watches run right after it."""

    def __init__(self):
        self.busy = _local()   # this thread is asking the other finders itself

    def find_spec(self, fullname, path=None, target=None):
        if _pending:
            catch_up()
        if fullname not in _waiting or fullname in sys.modules or getattr(self.busy, "on", False):
            return None
        import importlib.util

        self.busy.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        watches = _waiting.pop(fullname)
        if not _waiting and not _pending:
            sys.meta_path.remove(self)   # safe here: a spec returned ends the caller's iteration
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            for watch in watches:
                watch.callback(module)

        setattr(spec.loader, "exec_module", exec_module)   # noqa: B010 - this spec's loader, for this import only
        return spec


_finder = _Finder()
