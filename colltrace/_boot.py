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
        if C10D in sys.modules:
            from colltrace import install

            install()
        else:
            watch()
    except Exception as exc:  # never break the user's interpreter start
        sys.stderr.write(f"colltrace: disabled, start-up hook failed: {exc!r}\n")


C10D = "torch.distributed.distributed_c10d"


def watch():
    """Patch torch.distributed right after torch.distributed.distributed_c10d executes: before
    torch.distributed's `from .distributed_c10d import *`, so that every later by-name import, the
    package namespace included, gets the wrappers. Returns the watch (the pytest guard cancels it).
    colltrace.rank.patches imports nothing the interpreter does not have at start."""
    from colltrace.rank import patches

    return patches.after_import(C10D, _install)


def _install(module) -> None:
    try:
        from colltrace import install

        install()
    except Exception as exc:   # never break the user's import of torch.distributed: colltrace off, torch as is
        sys.stderr.write(f"colltrace: disabled, could not patch torch.distributed: {exc!r}\n")


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
