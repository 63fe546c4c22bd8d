"""Where the tests' files are: the repository's root, the job scripts the tests run, the example,
the recorded fixtures (absolute paths, normalized)."""
from __future__ import annotations

import os

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
JOBS = os.path.join(ROOT, "tests", "integration", "jobs")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
EXAMPLE = os.path.join(ROOT, "examples", "distill")
