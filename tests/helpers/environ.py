"""The environment a test gives a process it starts as a user would start it."""
from __future__ import annotations

import os


def clean(*more: str) -> dict[str, str]:
    """This process's environment without colltrace's settings (COLLTRACE*) and the variables
    starting with `more` (a launcher's, a framework's): what a fresh shell would hand the job."""
    prefixes = ("COLLTRACE",) + more
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
