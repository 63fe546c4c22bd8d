"""Polling for a condition in tests, bounded in time."""
from __future__ import annotations

import time


def wait_until(pred, timeout: float = 5.0) -> bool:
    """True as soon as pred() is, False once `timeout` seconds passed without it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False
