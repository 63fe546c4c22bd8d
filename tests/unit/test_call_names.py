"""What a report calls a call and a group: wrappers that pass a call on (decorators, profiling
and nvtx wrappers, torch._dynamo's eval frame) never stand for it, a method is named with its
class, and a group made without a description is named by what it is, never "undefined"."""
from __future__ import annotations

import functools
import sys
import types

import pytest

from colltrace import origins
from colltrace.model.build import FRAMES_NEAR_USER, compact_frames
from colltrace.rank.calls import kept_as
from colltrace.reporters import locations
from colltrace.words import group_desc, group_label

SITE = "/venv/lib/python3.11/site-packages"
ROOTS = {"stdlib": ["/usr/lib/python3.11"], "site": [SITE], "torch": [f"{SITE}/torch"],
         "colltrace": [f"{SITE}/colltrace"], "user_packages": []}
TORCH = {"file": f"{SITE}/torch/distributed/distributed_c10d.py", "line": 4000, "func": "barrier",
         "qualname": "barrier"}


def timed(fn):   # a user's functools.wraps-style decorator
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


def instrument_w_nvtx(func):   # DeepSpeed's, without the range
    def wrapped_fn(*args, **kwargs):
        ret_val = func(*args, **kwargs)
        return ret_val
    return wrapped_fn


def counter():   # a closure taking *args that passes nothing on
    seen = []

    def count(*args):
        seen.append(len(args))
        return len(seen)
    return count


class Engine:
    @instrument_w_nvtx
    def save_checkpoint(self, path):
        return path


def test_code_traits_tell_a_wrapper_from_what_it_wraps_and_name_methods_with_their_class():
    qualname = "timed.<locals>.wrapper" if sys.version_info >= (3, 11) else "wrapper"   # co_qualname: 3.11 on
    assert origins.code_traits(timed(len).__code__) == {"qualname": qualname, "wraps": True}
    assert origins.code_traits(instrument_w_nvtx(len).__code__)["wraps"] is True
    assert "wraps" not in origins.code_traits(counter().__code__)
    assert "wraps" not in origins.code_traits(timed.__code__)
    inner = Engine.save_checkpoint.__closure__[0].cell_contents.__code__   # the method under the wrapper
    expected = "Engine.save_checkpoint" if sys.version_info >= (3, 11) else "save_checkpoint"
    assert origins.code_traits(inner) == {"qualname": expected}
    assert origins.callable_name({"func": "f", "qualname": "outer.<locals>.Engine.step"}) == "Engine.step"


def _f(path, line, func, qualname=None, wraps=False):
    f = {"file": path, "line": line, "func": func, "qualname": qualname or func}
    if wraps:
        f["wraps"] = True
    return f


MAIN = _f("/job/train.py", 90, "main")
USER_WRAPPER = _f("/job/utils.py", 7, "wrapper", "timed.<locals>.wrapper", wraps=True)
FW_WRAPPER = _f(f"{SITE}/deepspeed/utils/nvtx.py", 33, "wrapped_fn", "instrument_w_nvtx.<locals>.wrapped_fn",
                wraps=True)
SAVE = _f("/job/train.py", 40, "save")
ENGINE = _f(f"{SITE}/deepspeed/runtime/engine.py", 4900, "save_checkpoint", "DeepSpeedEngine.save_checkpoint")
DYNAMO = _f(f"{SITE}/torch/_dynamo/eval_frame.py", 655, "_fn", "_TorchDynamoContext.__call__.<locals>._fn", wraps=True)


def mark(frames):
    return origins.Origins(ROOTS).annotate(frames)


def test_the_framework_call_is_the_method_past_its_wrapper_with_its_class():
    frames = mark([MAIN, FW_WRAPPER, ENGINE, TORCH])
    assert (locations.user_location(frames)
            == "train.py:90 (main) calling deepspeed.DeepSpeedEngine.save_checkpoint() (engine.py:4900)")
    # without a frame of the user's: the framework's own frame, not its wrapper
    assert locations.user_location(mark([ENGINE, FW_WRAPPER, TORCH])).startswith("deepspeed's engine.py:4900")


def test_a_decorated_function_of_the_users_is_the_call_and_its_caller_the_one_past_the_wrappers():
    # main -> the framework's rank-zero wrapper -> the user's timing wrapper -> save -> torch
    frames = mark([MAIN, FW_WRAPPER, USER_WRAPPER, SAVE, TORCH])
    assert locations.user_location(frames) == "train.py:40 (save)"
    assert locations.call_site(frames) == "train.py:40 (save), called from train.py:90 (main)"
    # torch._dynamo's eval frame between them is no caller either
    assert (locations.call_site(mark([MAIN, DYNAMO, SAVE, TORCH]))
            == "train.py:40 (save), called from train.py:90 (main)")
    # a wrapper of the user's around a torch function: the user's call is the line that called it
    assert locations.user_location(mark([MAIN, USER_WRAPPER, TORCH])) == "train.py:90 (main)"


def test_frames_known_only_by_name_are_wrappers_by_their_usual_names():
    """py-spy's and a traceback's frames carry no code object: "wrapped_fn" and the like are
    taken for wrappers there, and nowhere else (a frame with a qualname says for itself)."""
    spy = [{k: v for k, v in f.items() if k in ("file", "line", "func")} for f in (MAIN, FW_WRAPPER, ENGINE, TORCH)]
    assert (locations.user_location(mark(spy))
            == "train.py:90 (main) calling deepspeed.save_checkpoint() (engine.py:4900)")
    named_so = _f(f"{SITE}/lib/api.py", 3, "wrapper", "Client.wrapper")   # recorded, not a wrapper: it stands
    assert (locations.user_location(mark([MAIN, named_so, TORCH]))
            == "train.py:90 (main) calling lib.Client.wrapper() (api.py:3)")


def test_a_compacted_stack_keeps_the_call_past_the_wrappers():
    deep = [_f("/job/train.py", i, f"level{i}") for i in range(20)]
    frames = deep + [FW_WRAPPER, USER_WRAPPER, FW_WRAPPER, ENGINE] + [TORCH] * 10
    kept = compact_frames(frames, ROOTS)
    assert len(kept) < len(frames) and ENGINE in kept and deep[-1] in kept
    assert len([f for f in kept if f in deep]) == FRAMES_NEAR_USER


@pytest.mark.parametrize("g, label", [
    ({"name": "3", "desc": "undefined", "ranks": [0, 1]}, "group 3 (ranks 0-1)"),
    ({"name": "1", "desc": "mesh_dp", "ranks": [0, 2]}, "group 1 (mesh_dp, ranks 0,2)"),
    ({"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]}, "group 0 (default_pg, ranks 0-3)"),
    ({"name": "7", "desc": "", "ranks": []}, "group 7"),
])
def test_a_group_without_a_description_is_named_by_its_ranks(g, label):
    assert group_label(g) == label
    assert group_desc("undefined") == "" and group_desc(None) == "" and group_desc("mesh_tp") == "mesh_tp"


def test_a_group_is_named_as_the_framework_keeps_it():
    pg, other = object(), object()
    mod = types.ModuleType("fakefw.utils.groups")
    mod._WORLD_GROUP = pg
    mod._EXPERT_GROUPS = {"ep_size_2": other}
    sys.modules[mod.__name__] = mod
    try:
        assert kept_as(pg, {"fakefw"}) == "fakefw.utils.groups._WORLD_GROUP"
        assert kept_as(other, {"fakefw"}) == "fakefw.utils.groups._EXPERT_GROUPS['ep_size_2']"
        assert kept_as(pg, {"otherfw"}) is None   # only the packages of the code calling
        assert kept_as(object(), {"fakefw"}) is None
    finally:
        del sys.modules[mod.__name__]
