"""The user's own decorator (decorated.py's): functools.wraps-style, it passes the call on."""
import functools
import time


def timed(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            wrapper.seconds = time.perf_counter() - t
    return wrapper
