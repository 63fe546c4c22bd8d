"""The compiled path's Python face (shim._forwarder): a function of the original's own parameters
that hands every one of them on, as the caller gave it or as its default, to the Plan; to the
original while Dynamo traces; and that fails a bad call as the original does."""
from __future__ import annotations

import inspect
import traceback

import pytest

from colltrace.rank import shim

SUM = object()   # a default that is no literal (ReduceOp.SUM is a pybind enum)


def all_reduce(tensor, op=SUM, group=None, async_op: bool = False):
    return ("orig", tensor, op, group, async_op)


def barrier(group=None, async_op=False, *, device_ids=None, timeout=None):
    return ("orig", group, async_op, device_ids, timeout)


def forwarder(orig):
    seen = []

    def plan(*args, **kwargs):
        seen.append((args, kwargs))
        return "recorded"

    return shim._forwarder(orig.__name__, orig, inspect.signature(orig), plan), seen


def test_every_parameter_reaches_the_plan_as_given_or_as_its_default():
    fwd, seen = forwarder(all_reduce)
    assert fwd.__name__ == "all_reduce" and str(inspect.signature(fwd)) == "(tensor, op=SUM_, group=None, " \
        "async_op=False)".replace("SUM_", repr(SUM))
    assert fwd("t") == "recorded" and seen[-1] == (("t", SUM, None, False), {})
    fwd("t", group="g", async_op=True)
    assert seen[-1] == (("t", SUM, "g", True), {})
    fwd(op="max", tensor="t")
    assert seen[-1] == (("t", "max", None, False), {})


def test_keyword_only_parameters_are_handed_on_by_keyword():
    fwd, seen = forwarder(barrier)
    fwd("g", timeout=5)
    assert seen[-1] == (("g", False), {"device_ids": None, "timeout": 5})
    with pytest.raises(TypeError):
        fwd("g", False, None)   # keyword-only stays keyword-only


def test_while_dynamo_traces_the_original_is_called(monkeypatch):
    fwd, seen = forwarder(all_reduce)
    monkeypatch.setattr(shim, "_is_dynamo_compiling", lambda: True)
    assert fwd("t", group="g") == ("orig", "t", SUM, "g", False) and not seen


@pytest.mark.parametrize("call", [lambda f: f(), lambda f: f("t", bogus=1), lambda f: f("t", SUM, None, False, 5)])
def test_a_bad_call_fails_as_the_original_fails(call):
    fwd, seen = forwarder(all_reduce)
    with pytest.raises(TypeError) as want:
        call(all_reduce)
    with pytest.raises(TypeError) as got:
        call(fwd)
    assert str(got.value) == str(want.value) and not seen


def test_a_traceback_through_it_names_colltraces_own_line():
    def plan(*args):
        raise RuntimeError("the collective failed")

    fwd = shim._forwarder("all_reduce", all_reduce, inspect.signature(all_reduce), plan)
    with pytest.raises(RuntimeError) as err:
        fwd("t")
    frame = traceback.extract_tb(err.value.__traceback__)[-2]
    assert frame.filename == shim.__file__ and frame.name == "all_reduce" and "_ct_plan(" in frame.line


@pytest.mark.parametrize("sig", ["(*args, **kwargs)", "(tensor, *rest)", "(_ct_plan, group=None)", "(x, _d0=1)"])
def test_a_signature_it_cannot_write_is_left_to_the_args_form(sig):
    ns = {}
    exec(f"def f{sig}: pass", ns)
    assert shim._forwarder("f", ns["f"], inspect.signature(ns["f"]), print) is None
