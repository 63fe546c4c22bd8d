"""colltrace.rank.patches: patches restored last first, never made twice; callbacks after an import."""
from __future__ import annotations

import sys
import types

import pytest

from colltrace.rank import patches


def wrap(orig):
    def new(*args):
        return ("new", orig(*args))

    new.__colltrace_original__ = orig
    return new


class Logged(types.ModuleType):
    """A module whose attribute writes are logged."""

    def __init__(self, name):
        super().__init__(name)
        object.__setattr__(self, "log", [])

    def __setattr__(self, name, value):
        self.log.append(name)
        super().__setattr__(name, value)


def test_patch_then_restore_puts_every_original_back_last_first():
    mod = Logged("fake")

    def a():
        return "a"

    def b():
        return "b"

    mod.a, mod.b = a, b

    class Work:
        def wait(self):
            return "w"

    orig_wait = Work.__dict__["wait"]
    p = patches.Patches()
    assert p.patch(mod, "a", wrap) is mod.a and mod.a() == ("new", "a")
    assert p.patch(mod, "b", wrap) is mod.b
    assert p.patch(Work, "wait", wrap) is Work.__dict__["wait"] and Work().wait() == ("new", "w")
    assert p.patch(mod, "absent", wrap) is None and len(p) == 3
    assert p.original(mod, "b") is b and p.original(mod, "absent") is None
    # the sweep's pairs: the module's functions, not the class's method
    assert p.replacements() == {id(a): (a, mod.a), id(b): (b, mod.b)}
    assert p.replacements(1) == {id(b): (b, mod.b)}
    mod.log.clear()
    p.restore()
    assert mod.log == ["b", "a"]   # the last patch first
    assert mod.a is a and mod.b is b and Work.__dict__["wait"] is orig_wait and len(p) == 0


def test_what_is_colltrace_s_already_is_not_patched_twice():
    mod = types.ModuleType("fake")
    mod.f = lambda: "f"
    first = patches.Patches()
    new = first.patch(mod, "f", wrap)
    calls = []
    second = patches.Patches()
    assert second.patch(mod, "f", lambda orig: calls.append(orig)) is None
    assert calls == [] and mod.f is new and len(second) == 0
    first.restore()
    assert mod.f() == "f"


def test_a_patch_made_over_colltrace_s_stays_when_colltrace_restores():
    # the user's monkeypatch (or another tool's) on top of colltrace's wrapper is theirs to undo
    mod = types.ModuleType("fake")
    mod.exit = lambda: "exit"
    p = patches.Patches()
    p.patch(mod, "exit", wrap)

    def users():
        return "theirs"

    mod.exit = users
    p.restore()
    assert mod.exit is users and len(p) == 0


def test_an_inherited_method_patched_on_the_subclass_shows_through_again_after_restore():
    class Base:
        def capture_begin(self):
            return "base"

    class Graph(Base):
        pass

    p = patches.Patches()
    assert p.patch(Graph, "capture_begin", wrap) is None   # not its own: left unless asked
    new = p.patch(Graph, "capture_begin", wrap, inherited=True)
    assert Graph.__dict__["capture_begin"] is new and Graph().capture_begin() == ("new", "base")
    assert "capture_begin" not in Base.__dict__ or Base.__dict__["capture_begin"] is not new
    p.restore()
    assert "capture_begin" not in Graph.__dict__ and Graph().capture_begin() == "base"


def test_a_class_that_refuses_the_attribute_stays_as_it_is():
    class Meta(type):
        def __setattr__(cls, name, value):
            raise TypeError("can't set attributes of built-in/extension type")

    class Store(metaclass=Meta):
        def get(self):
            return 1

    p = patches.Patches()
    assert p.patch(Store, "get", wrap, may_refuse=True) is None and len(p) == 0
    with pytest.raises(TypeError):
        p.patch(Store, "get", wrap)   # not said to refuse: the caller says the failure


@pytest.fixture
def fresh_module(tmp_path, monkeypatch):
    """The name of a module not imported yet, whose source is `code` (written by the test)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def make(name, code="X = 1\n"):
        (tmp_path / f"{name}.py").write_text(code)
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)


def test_a_callback_runs_once_right_after_its_module_executes(fresh_module):
    name = fresh_module("ct_patches_target", "X = 1\n")
    seen = []
    watch = patches.after_import(name, lambda m: seen.append((m.__name__, m.X)))
    assert seen == [] and patches._finder in sys.meta_path
    __import__(name)
    assert seen == [(name, 1)]
    del sys.modules[name]
    __import__(name)   # imported again: the watch has run, it does not again
    assert seen == [(name, 1)] and watch.cancel() is False
    assert patches._finder not in sys.meta_path


def test_a_callback_runs_at_once_when_its_module_is_imported():
    seen = []
    patches.after_import("os", seen.append)
    assert seen == [sys.modules["os"]]


def test_a_cancelled_watch_never_runs(fresh_module):
    name = fresh_module("ct_patches_cancelled")
    seen = []
    p = patches.Patches()
    p.after_import(name, seen.append)
    p.restore()
    __import__(name)
    assert seen == [] and patches._finder not in sys.meta_path


def test_a_module_still_executing_is_caught_up_with_once_it_has_run(fresh_module):
    seen = []
    sys.modules["ct_patches_seen"] = seen   # type: ignore[assignment]  # the module's way back to the test
    try:
        name = fresh_module("ct_patches_busy", "import sys\nfrom colltrace.rank import patches\n"
                            "patches.after_import(__name__, sys.modules['ct_patches_seen'].append)\n"
                            "assert sys.modules['ct_patches_seen'] == []\n")
        mod = __import__(name)
        assert seen == []   # it was executing: not yet
        patches.catch_up()
        assert seen == [mod]
        patches.catch_up()
        assert seen == [mod]
    finally:
        del sys.modules["ct_patches_seen"]
        patches._prune()
