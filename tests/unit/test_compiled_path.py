"""When colltrace uses its compiled hot path and when it keeps to the Python wrappers: decided at
import, in a fresh interpreter each (what a rank does)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = """
import sys
{setup}
from colltrace.rank import fastpath
print(fastpath.available(), "colltrace.rank._fastpath" in sys.modules)
"""


def probe(setup: str = "") -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE.format(setup=setup))], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_compiled_path_is_used_where_it_was_built():
    from colltrace.rank import fastpath

    assert probe() == f"{fastpath.available()} {fastpath.available()}"


def test_an_interpreter_running_without_the_gil_never_loads_the_extension():
    # Importing an extension that relies on the GIL would turn the GIL back on for the whole program.
    assert probe("sys._is_gil_enabled = lambda: False") == "False False"


def test_a_build_older_than_the_source_is_left_alone_for_the_python_wrappers():
    # As after a checkout updated without reinstalling: the module lacks what the code calls.
    setup = """
    import types
    sys.modules["colltrace.rank._fastpath"] = types.ModuleType("colltrace.rank._fastpath")
    """
    assert probe(textwrap.dedent(setup)).startswith("False")
