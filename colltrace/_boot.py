"""Start-up hook: runs in every interpreter through colltrace.pth / colltrace.start.

It must cost almost nothing when colltrace is off, so it imports nothing beyond what the
interpreter already has and returns after one environment lookup.

PYTEST_DONT_REWRITE: imported before pytest starts (see colltrace/__init__.py).
"""
import os
import sys

_ACTIVE = False


def enabled(environ=os.environ) -> bool:
    return environ.get("COLLTRACE", "").strip() not in ("", "0")


def activate() -> None:
    """Arrange for torch.distributed to be patched when it is imported (or now, if it is)."""
    global _ACTIVE
    if _ACTIVE or not enabled():
        return
    _ACTIVE = True
    if "TORCHELASTIC_RUN_ID" in os.environ:
        try:   # a torchrun worker: seen from now on, before it joins (colltrace/rank/early.py)
            from colltrace.rank import early

            early.start()
        except Exception as exc:   # never break the user's interpreter start: this rank is then seen from init on
            sys.stderr.write(f"colltrace: warning: this rank is seen from init_process_group on only: {exc!r}\n")
    try:
        if "torch.distributed.distributed_c10d" in sys.modules:
            from colltrace import install

            install()
        else:
            sys.meta_path.insert(0, _TorchDistributedFinder())
    except Exception as exc:  # never break the user's interpreter start
        sys.stderr.write(f"colltrace: disabled, start-up hook failed: {exc!r}\n")


class _TorchDistributedFinder:
    """Waits for torch.distributed.distributed_c10d, patches it right after it executes.

    Patching at that point (before torch.distributed's `from .distributed_c10d import *`)
    means every later by-name import, the package namespace included, gets the wrappers.
    """

    _TARGET = "torch.distributed.distributed_c10d"

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self._TARGET:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            try:
                from colltrace import install

                install()
            except Exception as exc:   # never break the user's import of torch.distributed: colltrace off, torch as is
                sys.stderr.write(f"colltrace: disabled, could not patch torch.distributed: {exc!r}\n")

        spec.loader.exec_module = exec_module
        return spec


def checkout_path() -> list[str]:
    """What a job's PYTHONPATH needs for this hook when colltrace runs from a checkout that is not
    installed (no network to install it): the checkout and its startup/ folder, whose
    sitecustomize.py runs the hook. [] where colltrace.pth (or .start) is in a site directory."""
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    if any(os.path.exists(os.path.join(d, name)) for d in dirs for name in ("colltrace.pth", "colltrace.start")):
        return []
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    startup = os.path.join(checkout, "startup")
    return [checkout, startup] if os.path.isfile(os.path.join(startup, "sitecustomize.py")) else []
