"""The shipped distillation trainer (examples/distill) as a newcomer meets it: the commands of its
README, run in the README's order (the correct trainer first) from the root of a fresh copy of the
repository, each one's exit code and paragraph checked against the README's table; then what each
finding holds (group, collective number, ranks, ops, the offending file:line), from the same runs.

One run per command, shared by the module's tests: the README's 8 commands are the whole cost."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from colltrace.words import format_ranks
from helpers import environ
from helpers.cli import run_cli
from helpers.jobs import findings
from helpers.paths import EXAMPLE, ROOT
from helpers.procs import kill_tree

pytestmark = pytest.mark.slow
README = os.path.join(EXAMPLE, "README.md")
TIMEOUT_S = 240   # one command, on 2 loaded cores (a quiet run takes about 15 s)


def mark(name: str) -> str:
    """"file.py:LINE" of the `# bug: NAME` or `# line: NAME` comment in the example."""
    for fname in sorted(os.listdir(EXAMPLE)):
        if fname.endswith(".py"):
            with open(os.path.join(EXAMPLE, fname)) as f:
                for i, line in enumerate(f, 1):
                    if re.search(rf"# (bug|line): {re.escape(name)}\b", line):
                        return f"{fname}:{i}"
    raise LookupError(name)


def lines(entry) -> set[str]:
    return {f"{os.path.basename(f['file'])}:{f['line']}" for f in entry.get("frames") or []}


# -- the README ---------------------------------------------------------------------------------------
def readme_commands() -> list[str]:
    """The commands of the README's first bash block, in order, without their comments."""
    with open(README) as f:
        block = f.read().split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def readme_rows() -> dict[str, tuple[str, str, int]]:
    """{switch: (finding kind, paragraph, exit code)} of the README's table of what colltrace printed."""
    with open(README) as f:
        text = f.read()
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (.+) \| (\d+) \|$", text, re.M)
    return {bug: (kind, paragraph, int(code)) for bug, kind, paragraph, code in rows}


def same(text: str) -> str:
    """A paragraph with what differs from run to run made alike: seconds, the host's name, how
    many sampled steps had been compared."""
    text = re.sub(r"\b\d+(\.\d+)? s\b", "N s", text)
    text = re.sub(r"\(on [^)\s]+\)", "(on HOST)", text)
    return re.sub(r"in \d+ of \d+ sampled steps", "in N of N sampled steps", text)


def sentences(text: str) -> list[str]:
    return re.split(r"(?<=\.) (?=[A-Z])", text)


# -- the runs -----------------------------------------------------------------------------------------
class Run:
    def __init__(self, command: str, rc: int, out: str, err: str, root: str):
        self.command, self.rc, self.out, self.err, self.root = command, rc, out, err, root
        self.checkpoints: list[str] = []
        m = re.search(r"^colltrace: tracing into (\S+)$", err, re.M)
        self.dir = os.path.join(root, m.group(1)) if m else None

    def findings(self) -> list[dict]:
        return findings(self.dir)

    def only(self, kind: str) -> dict:
        got = self.findings()
        assert [f["kind"] for f in got] == [kind], [f["summary"] for f in got]
        return got[0]


def argv(command: str) -> list[str]:
    """The command as typed, its programs (colltrace, torchrun) this interpreter's."""
    words = shlex.split(command)
    out = []
    for i, w in enumerate(words):
        if (i == 0 or words[i - 1] == "--") and w == "torchrun":
            out += [sys.executable, "-m", "torch.distributed.run"]
        elif i == 0 and w == "colltrace":
            out += [sys.executable, "-m", "colltrace"]
        else:
            out.append(w)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    """{switch or "correct": its run}: the README's commands in order, in a fresh copy's root."""
    root = str(tmp_path_factory.mktemp("clone"))
    shutil.copytree(EXAMPLE, os.path.join(root, "examples", "distill"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = environ.clean("TORCH_DISTRIBUTED_DEBUG", "DISTILL_")
    out = {}
    for command in readme_commands():
        p = subprocess.Popen(argv(command), cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
        try:
            stdout, stderr = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_tree(p.pid, walk=False, group=True)
            stdout, stderr = p.communicate()
            pytest.fail(f"{command!r} still running after {TIMEOUT_S} s:\n{stderr[-3000:]}")
        m = re.search(r"--bug (\w+)", command)
        run = out[m.group(1) if m else "correct"] = Run(command, p.returncode, stdout, stderr, root)
        ckpt = os.path.join(root, "distill-out", "checkpoints")
        run.checkpoints = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []   # the next run replaces them
    return out


# -- what the README says -----------------------------------------------------------------------------
def test_the_readme_runs_the_correct_trainer_first_then_every_switch():
    import importlib.util

    spec = importlib.util.spec_from_file_location("distill_bugs", os.path.join(EXAMPLE, "bugs.py"))
    bugs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bugs)   # the example's own list of switches
    commands = readme_commands()
    assert commands[0] == "torchrun --standalone --nproc-per-node 4 examples/distill/train.py"
    assert [re.search(r"--bug (\w+)$", c).group(1) for c in commands[1:]] == list(readme_rows())
    assert sorted(readme_rows()) == sorted(bugs.SWITCHES)


def test_the_correct_trainer_learns_and_starts_from_scratch(runs):
    run = runs["correct"]
    assert run.rc == 0, run.err[-3000:]
    losses = [float(m) for m in re.findall(r"^step +\d+ +loss ([\d.]+)", run.out, re.M)]
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0], run.out
    assert "teacher served 30 steps" in run.err and "resumed from" not in run.err
    assert run.checkpoints == ["step_000020", "step_000030"]


@pytest.mark.parametrize("bug", list(readme_rows()))
def test_each_switch_prints_what_the_readme_says_and_the_verdict_last(runs, bug):
    """After the correct trainer's checkpoints (and those of the switches before it), each switch
    still starts at step 0 and prints its README paragraph; the launcher's report is one line and
    the verdict is the last thing said, but the exit line and the next command."""
    kind, paragraph, code = readme_rows()[bug]
    run = runs[bug]
    assert run.rc == code, run.err[-4000:]
    assert "resumed from" not in run.err
    assert [f["kind"] for f in run.findings()] == [kind]
    printed = [line for line in run.err.splitlines() if same(line).startswith(same(sentences(paragraph)[0]))]
    assert printed, run.err[-4000:]
    if bug == "segfault":   # what it found of the others depends on torchrun's SIGTERM (README)
        got, want = sentences(same(printed[0])), sentences(same(paragraph))
        assert got[:2] == want[:2] and got[-1] == want[-1], printed[0]
    else:
        assert same(printed[0]) == same(paragraph)
    tail = run.err.rstrip("\n").splitlines()[-3:]
    assert tail[0].startswith("colltrace: verdict: "), tail
    verdict, first = tail[0][len("colltrace: verdict: "):], sentences(printed[0])[0]
    assert verdict == first or (verdict.endswith(" …") and first.startswith(verdict[:-2])), (verdict, first)
    assert tail[1].startswith(f"colltrace: job exited with code {code}; 1 finding; trace in colltrace-out/run-")
    assert tail[2].startswith("next: colltrace analyze colltrace-out/run-")
    assert "Root Cause (first observed failure)" not in run.err and "ChildFailedError" not in run.err


def test_the_readme_quick_start_shows_what_the_first_command_prints(runs):
    """The README's Quick start block is a real run of its first command (checkpoint_barrier):
    colltrace's own lines, in order, are what this run printed (but for times, the run's folder,
    how long torchrun's report was and which ranks it listed: torch 2.4-2.9's torchrun leaves out
    those it ended itself; and the line an older torch gets about what it lacks)."""
    def ours(text: str) -> list[str]:
        keep = ("colltrace: ", "next: ", "Deadlock across", "  stacks", "    rank")
        out = []
        for line in text.splitlines():
            if re.match(r"colltrace: torch \S+ has no ", line):
                continue
            if line.startswith(keep):
                line = re.sub(r"^(colltrace: the launcher's failure report \([^)]*\)): .*", r"\1", line)
                line = re.sub(r"colltrace-out/run-\d{8}-\d{6}(-\d+)?", "RUN", same(line))
                out.append(re.sub(r"\d\d:\d\d:\d\d", "T", re.sub(r"\(\d+ lines, ", "(N lines, ", line)))
        return out

    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    block = readme.split("## Quick start", 1)[1].split("```\n", 2)[1]
    assert ours(block) == ours(runs["checkpoint_barrier"].err)


def _launcher_codes(run) -> dict[int, int]:
    with open(os.path.join(run.dir, "launcher.txt")) as f:
        text = f.read()
    assert "ChildFailedError" in text and "Root Cause (first observed failure)" in text   # kept whole
    return {int(r): int(c) for r, c in re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", text)}


@pytest.mark.parametrize("bug", ["checkpoint_barrier", "probe_barrier", "metrics_default_group", "teacher_early",
                                 "preempt_one_rank"])
def test_an_aborted_hang_says_colltrace_ended_every_rank(runs, bug):
    """Every rank the launcher lists died of colltrace's SIGKILL, and colltrace says so of exactly
    those (torchrun lists every rank from torch 2.10 on; 2.4-2.9 leave out the ranks it sent its
    own SIGTERM to after the first death)."""
    run = runs[bug]
    codes = _launcher_codes(run)
    assert codes and set(codes.values()) == {-9}, codes
    folded = [line for line in run.err.splitlines() if line.startswith("colltrace: the launcher's failure report (")]
    listed = f"rank{'s' if len(codes) > 1 else ''} {format_ranks(sorted(codes))}"
    them = "them" if len(codes) > 1 else "it"
    assert len(folded) == 1 and folded[0].endswith(f": {listed} exitcode -9 (SIGKILL): colltrace ended {them}"), folded
    assert re.search(r"^colltrace: ended ranks 0-3 with SIGKILL at \d\d:\d\d:\d\d \(COLLTRACE_ON_HANG=abort: "
                     r"(deadlock|mismatch)\)$", run.err, re.M), run.err[-3000:]


def test_a_segfault_ending_is_told_as_it_was(runs):
    """torchrun ends the other ranks (SIGTERM) as colltrace looks: colltrace says it ended only
    the ranks whose SIGKILL the launcher saw, none if it came too late, never "ending ranks "."""
    run = runs["segfault"]
    codes = _launcher_codes(run)
    assert codes[1] == -11 and set(codes) <= {0, 1, 2, 3}   # torch 2.4-2.9: not the ranks it ended itself
    killed = sorted(r for r, c in codes.items() if c == -9)
    ended = re.findall(r"^colltrace: ended (.*)$", run.err, re.M)
    assert len(ended) == 1
    if killed:
        assert ended[0].startswith(f"rank{'s' if len(killed) > 1 else ''} {','.join(map(str, killed))}"), ended
    else:
        assert ended[0].startswith("no rank (COLLTRACE_ON_HANG=abort: dead_rank)"), ended
    assert "ending ranks \n" not in run.err and "were ended by colltrace" not in run.err
    (folded,) = [line for line in run.err.splitlines() if line.startswith("colltrace: the launcher's failure report (")]
    assert ": rank 1 exitcode -11 (SIGSEGV): the dead rank found above" in folded


# -- what each finding holds --------------------------------------------------------------------------
@pytest.mark.parametrize("bug,barrier_at,teacher_op,teacher_at,same_kind", [
    # the team's story: ranks 0-2 sync a new checkpoint folder on the default group while the
    # teacher waits in its model-ready broadcast on the ipc group; the same kind elsewhere: the
    # two other collectives whose group may be the default one, the next to run first
    ("checkpoint_barrier", "checkpoint_barrier", "broadcast", "teacher_ready",
     ["probe_barrier", "metrics_default_group"]),
    ("probe_barrier", "probe_barrier", "gather", "teacher_gather",
     ["checkpoint_barrier", "metrics_default_group"]),
    ("metrics_default_group", "metrics_default_group", "gather", "teacher_gather",
     ["probe_barrier", "checkpoint_barrier"]),
])
def test_default_group_collective_is_a_deadlock_with_the_teacher(runs, bug, barrier_at, teacher_op, teacher_at,
                                                                 same_kind):
    run = runs[bug]
    f = run.only("deadlock")
    assert f["group"]["desc"] == "default_pg" and f["missing_ranks"] == [3]
    ops = {r: (e["op"], e["group"]) for r, e in f["ranks"].items()}
    expected = "barrier" if "barrier" in bug else "all_reduce"
    assert ops["0"] == ops["1"] == ops["2"] == (expected, f["group"]["name"])
    assert f["ranks"]["3"]["op"] == teacher_op and f["groups"][f["ranks"]["3"]["group"]]["desc"] == "ipc"
    for r in "012":
        assert mark(barrier_at) in lines(f["ranks"][r])
    assert mark(teacher_at) in lines(f["ranks"]["3"])
    assert mark(barrier_at) in f["advice"] and mark(barrier_at) in f["summary"]
    assert f"#{f['seq']} on group {f['group']['name']} (default_pg" in f["summary"]
    assert [f"{os.path.basename(x['file'])}:{x['line']}" for x in f["same_kind"]] == [mark(b) for b in same_kind]
    assert all(x["may_be_default"] for x in f["same_kind"])
    with open(os.path.join(run.dir, "report.txt")) as r:
        report = r.read()
    tail = report.split("The same kind elsewhere", 1)[1]
    at = [tail.find(mark(b) + " (") for b in same_kind]   # listed in the report, in the same order
    assert -1 not in at and at == sorted(at), tail
    assert "The same kind elsewhere" not in f["summary"]
    # report.txt, written live, says what `colltrace analyze` says of the folder afterwards: the
    # culprits first, in the same words, and the same waits (the folder is judged as of the
    # finding colltrace ended the job for)
    analyzed = run_cli("analyze", run.dir)
    assert analyzed.returncode == 1
    assert report.startswith("Culprits: ") and report.split("\n", 1)[0] == analyzed.stdout.split("\n", 1)[0]
    waited = re.search(r"\(the longest has waited [\d.]+ s\)", f["summary"]).group(0)
    assert waited in analyzed.stdout


def test_teacher_loop_before_setup_is_a_mismatch_on_the_ipc_group(runs):
    f = runs["teacher_early"].only("mismatch")
    assert f["group"]["desc"] == "ipc" and f["seq"] == 1 and "op" in f["differs"]
    assert [(c["ranks"], c["op"]) for c in f["classes"]] == [([0, 1, 2], "broadcast"), ([3], "gather")]
    assert mark("wait_for_teacher") in lines(f["ranks"]["0"]) and mark("teacher_gather") in lines(f["ranks"]["3"])
    assert mark("teacher_gather") in f["summary"]


def test_preemption_save_on_one_rank_is_a_deadlock_that_points_at_it(runs):
    f = runs["preempt_one_rank"].only("deadlock")
    first = f["cycle"][0]
    assert (first["op"], first["waiting"], first["missing"]) == ("barrier", [0], [1, 2])
    assert (f["group"]["desc"] == "train"
            and {c["group"] for c in f["cycle"]} == {f["group"]["name"], f["ranks"]["3"]["group"]})
    assert mark("preempt_save") in lines(f["ranks"]["0"]) and mark("checkpoint_barrier") in lines(f["ranks"]["0"])
    assert mark("preempt_save") in f["advice"]
    assert {f["ranks"][r]["op"] for r in "12"} <= {"gather", "scatter"} and f["ranks"]["3"]["op"] == "gather"


def test_segfault_mid_step_is_a_dead_rank_with_its_line(runs):
    f = runs["segfault"].only("dead_rank")
    assert f["rank"] == 1 and f["exit"]["signal"] == "SIGSEGV" and f["ranks"]["1"]["state"] == "dead"
    assert {mark("segfault"), mark("forward")} <= lines(f["ranks"]["1"])
    assert mark("segfault") in f["summary"] and "SIGSEGV" in f["summary"]
    # where in native code, as the dying rank saw it (innermost first), said with its Python line
    native = f["ranks"]["1"]["native_frames"]
    assert (native[0]["object"], native[0]["symbol"]) == ("libc.so.6", "memset"), native[:4]
    assert f"died of SIGSEGV in libc.so.6 (memset), called from {mark('segfault')} (fused_mlp)" in f["summary"]
    # the teacher waits (or failed, once gloo saw the peer go) in its gather for the dead rank
    assert f["ranks"]["3"]["op"] == "gather" and mark("teacher_gather") in lines(f["ranks"]["3"])
    assert f["last_collective"]["op"] == "scatter"


def test_duplicated_data_is_named_and_the_job_runs_on(runs):
    """No hang and no wrong collective: the collectives are those of a correct run, so only the
    data can tell. By default colltrace names the identical batches the training ranks feed their
    DDP model, and the loader behind them; the job finishes and colltrace run exits with its 0."""
    run = runs["loader_before_pg"]
    assert run.rc == 0 and "done: 30 steps" in run.out
    f = run.only("duplicate_data")
    assert sorted(f["ranks"]) == ["0", "1", "2"] and f["groups"][f["group"]["name"]]["desc"] == "train"
    assert f["identical_calls"] >= 3 and f["identical_calls"] == f["calls"]
    assert mark("forward") in lines(f["ranks"]["0"])
    assert f["loader"]["file"].endswith("data.py") and f["loader"]["before_init"] is True
    assert "was built before init_process_group (no DistributedSampler)" in f["summary"]
    assert "colltrace: ended" not in run.err   # no hang: nothing ended, nothing said of it
