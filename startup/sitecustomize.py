"""colltrace's start-up hook for a checkout that is not installed (a machine without network).

An installed colltrace starts through colltrace.pth in site-packages. A checkout has no such file,
and Python reads .pth files only in its site directories; what it does read from PYTHONPATH at
every interpreter start is `sitecustomize`. With this folder and the checkout on PYTHONPATH,

    PYTHONPATH=/path/to/colltrace:/path/to/colltrace/startup COLLTRACE=1 torchrun ...

every process of the job (torchrun's workers, spawned children) runs the same line as
colltrace.pth, then the `sitecustomize` this one shadows, if the environment has one.
`colltrace run` adds this folder itself when the hook is not installed (CONTRIBUTING.md).
"""
import os
import sys

if os.environ.get("COLLTRACE", "").strip() not in ("", "0"):
    try:
        import colltrace._boot as _b

        _b.activate()
    except Exception as e:
        sys.stderr.write("colltrace: start-up hook failed: %r\n" % (e,))


def _next_sitecustomize():
    """Run the environment's own sitecustomize (Debian's, a cluster's), which this file hides."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _next_sitecustomize()
except Exception as e:
    sys.stderr.write("colltrace: the environment's sitecustomize failed under colltrace's: %r\n" % (e,))
