"""colltrace: find which rank is missing from which collective, and where it is instead.

Importing this package is cheap: torch is imported only by install().

PYTEST_DONT_REWRITE: the start-up hook imports this package before pytest can rewrite it
(pytest would warn, and `-W error` would end the session).
"""
__version__ = "0.1.0"

__all__ = ["install", "uninstall", "__version__"]


def install() -> bool:
    """Trace this process's torch.distributed collectives. Idempotent; returns True if active."""
    from colltrace.rank import shim

    return shim.install()


def uninstall() -> None:
    """Restore torch.distributed's original functions and close this rank's trace."""
    from colltrace.rank import shim

    shim.uninstall()
