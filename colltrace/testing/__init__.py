"""colltrace for test suites: the machinery behind the pytest plugin (colltrace/pytest_plugin.py).

- guard.TestGuard: traces one test (its ranks, wherever they are started), judges them with a
  watchdog in a thread, ends them on a finding, and leaves no process behind.
- ranks.run_on_ranks: runs one test function on N gloo ranks in child processes
  (@pytest.mark.distributed); rank_main is the child side.

Importing this package imports neither torch nor pytest.
"""
