"""Distributed tests in inner pytest sessions, on real gloo ranks with the default (30-minute)
process-group timeouts: passing, failing on one rank, and hanging in each way colltrace names.
Each hang must fail its test within seconds with the verdict, the session must go on, and no
process may be left behind (the `inner` fixture checks that after every session)."""
import json
import os
import re
import textwrap

import pytest

pytest_plugins = ["pytester"]

FAST_S = 90   # a hung test must end the inner session this fast; gloo alone would wait 30 minutes

SCENARIOS = textwrap.dedent("""
    import time

    import pytest
    import torch
    import torch.distributed as dist


    @pytest.mark.distributed(world_size=4)
    def test_mismatch(rank):
        x = torch.ones(4)
        if rank == 3:
            time.sleep(1)  # arrives last, so the verdict sees ranks 0-2 already waiting
            dist.all_gather([torch.empty(4) for _ in range(4)], x)  # odd_op
        else:
            dist.all_reduce(x)  # common_op


    @pytest.mark.distributed(world_size=4)
    def test_cycle(rank, groups):
        train = groups.new([0, 1, 2])
        ipc = groups.new([0, 1, 2, 3])  # the teacher's group: all ranks, gathers to rank 3
        dist.all_reduce(torch.ones(1), group=train)
        if rank == 3:
            dist.gather(torch.ones(2), [torch.empty(2) for _ in range(4)], dst=3, group=ipc)  # teacher_gather
        else:
            dist.barrier()  # ckpt_barrier


    @pytest.mark.colltrace(stall_s=2)
    @pytest.mark.distributed(world_size=4)
    def test_missing(rank):
        dist.barrier()
        if rank == 3:
            time.sleep(3600)  # sleeping
        dist.barrier()  # stall_barrier


    def test_after_the_hangs():
        assert True
""")


def line_of(path, tag: str) -> int:
    """The line number of the inner test file's line that carries `# <tag>`."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.rstrip().endswith(f"# {tag}"):
            return i
    raise AssertionError(f"no line tagged {tag!r}")


def at(pytester, filename: str, tag: str) -> str:
    """"file.py:LINE" of the inner file's line tagged `# <tag>`, as colltrace names places."""
    return f"{filename}:{line_of(pytester.path / filename, tag)}"


def squash(text: str) -> str:
    """Whitespace runs to one space, so assertions do not depend on line wrapping."""
    return re.sub(r"\s+", " ", text)


def _verdict(inner, name: str) -> str:
    case = inner.case(name)
    assert case["outcome"] == "failed", case
    return squash(case["text"])


def _trace_dir(inner, name: str) -> str:
    """The folder the failure report points to ("trace: DIR  (colltrace analyze DIR)")."""
    return re.search(r"^trace: (\S+)", inner.case(name)["text"], re.M).group(1)


@pytest.mark.slow
def test_a_passing_distributed_test(inner, pytester):
    pytester.makepyfile(test_ok="""
        import pytest
        import torch
        import torch.distributed as dist


        @pytest.mark.parametrize("scale", [3.0])
        @pytest.mark.distributed(world_size=3)
        def test_sum(rank, world_size, groups, tmp_path, scale):
            x = torch.ones(2) * rank * scale
            dist.all_reduce(x)
            assert x.tolist() == [9.0, 9.0]
            pair = groups.new([0, 1])
            if rank < 2:
                y = torch.ones(1)
                dist.all_reduce(y, group=pair)
                assert y.item() == 2.0
            (tmp_path / f"rank{rank}-of-{world_size}").write_text("ok")
    """)
    r = inner()
    r.result.assert_outcomes(passed=1)
    written = sorted(p.name for p in pytester.path.rglob("rank*-of-3"))
    assert written == ["rank0-of-3", "rank1-of-3", "rank2-of-3"]  # every rank ran, with pytest's tmp_path
    assert not list(pytester.path.rglob("colltrace-test_sum*"))  # a passing test's trace is not kept


@pytest.mark.slow
def test_an_assertion_failing_on_one_rank_names_the_rank_and_shows_its_traceback(inner, pytester):
    src = textwrap.dedent("""
        import pytest
        import torch
        import torch.distributed as dist


        @pytest.mark.distributed(world_size=4)
        def test_sum(rank):
            x = torch.ones(1) * rank
            dist.all_reduce(x)
            expected = 7.0 if rank == 2 else 6.0
            assert x.item() == expected  # check
            dist.barrier()
    """)
    pytester.makepyfile(test_one_rank=src)
    r = inner()
    r.result.assert_outcomes(failed=1)
    text = r.case("test_sum")["text"]
    assert text.lstrip().startswith("rank 2 failed: AssertionError: assert 6.0 == 7.0")
    assert ">       assert x.item() == expected  # check" in text  # pytest's own rendering, from the rank
    assert f"{at(pytester, 'test_one_rank.py', 'check')}: AssertionError" in text
    # the other ranks are accounted for (they pass, fail when rank 2 leaves, or are ended by colltrace)
    assert "ranks 0-1,3:" in text or ("rank 0:" in text and "rank 3:" in text)
    assert r.seconds < FAST_S


@pytest.mark.slow
def test_a_mismatch_fails_at_once_with_the_verdict(inner, pytester):
    pytester.makepyfile(test_scenarios=SCENARIOS)
    r = inner("-k", "mismatch or after")
    r.result.assert_outcomes(failed=1, passed=1)  # and the session went on
    v = _verdict(r, "test_mismatch")
    assert v.startswith("colltrace: Mismatch: collective #1 on group 0 (default_pg, ranks 0-3)")
    assert f"ranks 0-2 called all_reduce at {at(pytester, 'test_scenarios.py', 'common_op')}" in v
    assert f"rank 3 called all_gather at {at(pytester, 'test_scenarios.py', 'odd_op')}" in v
    assert "colltrace ended ranks 0-3 (SIGKILL)" in v
    trace = _trace_dir(r, "test_mismatch")  # kept for the failed test, and what it says is in its files
    with open(os.path.join(trace, "findings.jsonl")) as f:
        assert [json.loads(line)["kind"] for line in f] == ["mismatch"]
    assert r.seconds < FAST_S


@pytest.mark.slow
def test_a_cross_group_cycle_fails_at_once_and_the_session_goes_on(inner, pytester):
    pytester.makepyfile(test_scenarios=SCENARIOS)
    r = inner("-k", "cycle or after")
    r.result.assert_outcomes(failed=1, passed=1)
    v = _verdict(r, "test_cycle")
    assert v.startswith("colltrace: Deadlock across groups 0 and 2:")
    assert (f"ranks 0-2 wait in barrier #1 on group 0 (default_pg, ranks 0-3) at "
            f"{at(pytester, 'test_scenarios.py', 'ckpt_barrier')}") in v
    assert ("rank 3 waits in gather #1 on group 2 (ranks 0-3) at "
            f"{at(pytester, 'test_scenarios.py', 'teacher_gather')}") in v
    assert "stacks (ranks with the same stack):" in v
    assert r.case("test_after_the_hangs")["outcome"] == "passed"
    assert r.seconds < FAST_S


@pytest.mark.slow
def test_a_missing_rank_fails_after_stall_s_showing_where_it_is(inner, pytester):
    pytester.makepyfile(test_scenarios=SCENARIOS)
    r = inner("-k", "missing")
    r.result.assert_outcomes(failed=1)
    v = _verdict(r, "test_missing")
    assert v.startswith("colltrace: Stall: ranks 0-2 have waited")
    assert (f"in barrier #2 on group 0 (default_pg, ranks 0-3) at {at(pytester, 'test_scenarios.py', 'stall_barrier')} "
            "(test_missing) for rank 3, which has not entered it") in v
    # rank 3's live stack: the line it sleeps on
    assert f"its live stack is at {at(pytester, 'test_scenarios.py', 'sleeping')} (test_missing)" in v
    assert 2 <= r.case("test_missing")["time"] < FAST_S  # waited stall_s=2 (the marker's), not 30 minutes


PLAIN_SPAWN = textwrap.dedent("""
    import socket

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def _worker(rank, world, port):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        ipc = dist.new_group(list(range(world)))
        if rank == 3:
            dist.gather(torch.ones(2), [torch.empty(2) for _ in range(world)], dst=3, group=ipc)  # teacher_gather
        else:
            dist.barrier()  # ckpt_barrier
        dist.destroy_process_group()


    def _free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


    def test_teacher_and_students():
        START


    def test_after():
        assert True
""")


@pytest.mark.slow
@pytest.mark.parametrize("start", [
    "mp.spawn(_worker, args=(4, _free_port()), nprocs=4)",
    # forked from the pytest process, where colltrace is installed (the test module imports torch)
    "mp.start_processes(_worker, args=(4, _free_port()), nprocs=4, start_method='fork')",
], ids=["spawn", "fork"])
def test_a_plain_multiprocessing_test_that_hangs_fails_fast_with_colltrace_on(inner, pytester, start):
    # written with no knowledge of the plugin, as existing suites are; only --colltrace added
    pytester.makepyfile(test_spawned=PLAIN_SPAWN.replace("START", start))
    r = inner("--colltrace", entry_point=True)
    r.result.assert_outcomes(failed=1, passed=1)
    v = _verdict(r, "test_teacher_and_students")
    assert v.startswith("colltrace: Deadlock across groups 0 and 1:")
    assert ("ranks 0-2 wait in barrier #1 on group 0 (default_pg, ranks 0-3) at "
            f"{at(pytester, 'test_spawned.py', 'ckpt_barrier')}") in v
    assert f"{at(pytester, 'test_spawned.py', 'teacher_gather')} (_worker)" in v
    # the verdict first, then the test's own error: mp.spawn saw its ranks ended
    own = v.index("the test's own error")
    assert own > v.index("Deadlock") and "ProcessExitedException" in v[own:]
    assert r.seconds < FAST_S


@pytest.mark.slow
def test_a_test_that_hides_the_hang_fails_all_the_same(inner, pytester):
    # The ranks are ended, but one test then waits on something else (the guard interrupts it)
    # and another ignores its ranks' exit codes (the guard fails it).
    src = textwrap.dedent("""
        import os, socket, subprocess, sys, textwrap, threading

        RANK = textwrap.dedent('''
            import os, sys, torch, torch.distributed as dist
            r = int(sys.argv[1])
            dist.init_process_group("gloo", rank=r, world_size=2, init_method="tcp://127.0.0.1:" + os.environ["PORT"])
            if r == 0:
                dist.all_reduce(torch.ones(2))
            else:
                dist.broadcast(torch.ones(2), src=0)
        ''')


        def _start():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env = dict(os.environ, PORT=str(port))
            return [subprocess.Popen([sys.executable, "-c", RANK, str(r)], env=env) for r in range(2)]


        def test_waits_for_a_reply_that_never_comes():
            _start()
            threading.Event().wait()  # forever


        def test_ignores_how_its_ranks_ended():
            for p in _start():
                p.wait()  # returns once colltrace ends them; the exit codes are not checked
    """)
    pytester.makepyfile(test_stuck=src)
    r = inner("--colltrace")
    r.result.assert_outcomes(failed=2)
    v = _verdict(r, "test_waits_for_a_reply_that_never_comes")
    assert v.startswith("colltrace: Mismatch: collective #1 on group 0")
    assert "rank 0 called all_reduce" in v and "rank 1 called broadcast" in v
    assert "HangInterrupt: colltrace: the test did not return 3 s after its ranks were ended" in v
    # a test that swallows the consequences still fails: its ranks hung
    v = _verdict(r, "test_ignores_how_its_ranks_ended")
    assert v.startswith("colltrace: Mismatch: collective #1 on group 0")
    assert "the test itself did not fail: it went on after colltrace ended its ranks" in v
    assert r.seconds < FAST_S


@pytest.mark.slow
def test_a_torchrun_job_started_by_a_test_is_traced_and_ended(inner, pytester):
    pytester.makepyfile(job="""
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            dist.broadcast(torch.ones(2), src=0)  # odd_op
        else:
            dist.all_reduce(torch.ones(2))  # common_op
    """)
    pytester.makepyfile(test_launch="""
        import os, subprocess, sys

        def test_job():
            job = os.path.join(os.path.dirname(__file__), "job.py")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", job]
            assert subprocess.run(cmd).returncode == 0
    """)
    r = inner("--colltrace")
    r.result.assert_outcomes(failed=1)
    v = _verdict(r, "test_job")
    assert v.startswith("colltrace: Mismatch: collective #1 on group 0 (default_pg, ranks 0-1)")
    assert f"rank 0 called all_reduce at {at(pytester, 'job.py', 'common_op')}" in v
    assert f"rank 1 called broadcast at {at(pytester, 'job.py', 'odd_op')}" in v
    assert "assert 1 == 0" in v  # the test's own error: torchrun reported its workers' deaths
    assert r.seconds < FAST_S


@pytest.mark.slow
def test_a_test_stuck_where_no_signal_reaches_ends_the_session_with_every_stack(inner, pytester):
    # The last resort, as pytest-timeout's: the verdict and every thread's stack, then exit 1.
    pytester.makepyfile(test_blind="""
        import os, signal, socket, subprocess, sys, textwrap, time

        RANK = textwrap.dedent('''
            import os, sys, torch, torch.distributed as dist
            r = int(sys.argv[1])
            dist.init_process_group("gloo", rank=r, world_size=2, init_method="tcp://127.0.0.1:" + os.environ["PORT"])
            if r == 0:
                dist.all_reduce(torch.ones(2))
            else:
                dist.broadcast(torch.ones(2), src=0)
        ''')


        def test_deaf():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env = dict(os.environ, PORT=str(port))
            procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r)], env=env) for r in range(2)]
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])  # deaf to the interrupt
            time.sleep(3600)  # deaf_sleep
    """)
    r = inner("--colltrace")
    assert r.result.ret == 1 and "passed" not in r.out
    out = r.out + r.err
    assert "colltrace: test_blind.py::test_deaf is stuck" in out
    assert "colltrace: Mismatch: collective #1 on group 0" in squash(out)
    assert "the test did not return 13 s after its ranks were ended" in out
    assert f'test_blind.py", line {line_of(pytester.path / "test_blind.py", "deaf_sleep")} in test_deaf' in out
    assert r.seconds < FAST_S
