"""How a job under `colltrace run` ended, in words: which ranks colltrace ended and how (or that it
ended none), the launcher's failure report folded to one line where colltrace knows why each rank
listed there failed, and the ranks' tracebacks it folded. commands/joboutput.py reads the facts."""
from __future__ import annotations

from collections.abc import Sequence

from colltrace.reporters.phrases import clock
from colltrace.words import counted, rank_word

# why a rank in the launcher's report ended, as colltrace knows it
ENDED, DEAD, LAUNCHER, RAISED = "ended", "dead", "launcher", "raised"


def ending_line(ending: dict | None, ended: Sequence[int], on_hang: str, hang: bool,
                already: Sequence[int] = ()) -> str:
    """What colltrace did to the job's ranks: "" when there was no hang and it did nothing.
    ended: the ranks its SIGKILL ended; already: ranks it signalled that the launcher reports
    ended otherwise (its SIGTERM came first)."""
    tail = f"; {rank_word(already)} had been ended by the launcher already" if already else ""
    if ending is not None:
        why = f"COLLTRACE_ON_HANG=abort: {ending.get('why')}"
        if not ended:
            return f"colltrace: ended no rank ({why}): none was left running{tail}\n"
        return f"colltrace: ended {rank_word(ended)} with SIGKILL at {clock(ending.get('at'))} ({why}){tail}\n"
    if hang:
        return f"colltrace: ended no rank (COLLTRACE_ON_HANG={on_hang})\n"
    return ""


def _reason(why: str, ranks: list[int], causes: list[int]) -> str:
    them = "it" if len(ranks) == 1 else "them"
    if why == ENDED:
        return f"colltrace ended {them}"
    if why == DEAD:
        return "the dead rank found above"
    after = f" after {rank_word(causes)} failed" if causes else ""
    if why == LAUNCHER:
        return f"the launcher ended {them}{after}"
    return f"{'its' if len(ranks) == 1 else 'their'} collectives failed{after}"


def folded_report_line(groups: list[tuple[list[int], int, str | None, str]], causes: list[int], lines: int,
                       path: str) -> str:
    """The launcher's failure report in one line. groups: (ranks, exit code, signal, why) with why
    ENDED, DEAD, LAUNCHER or RAISED; causes: the ranks that failed first (dead ranks)."""
    parts = []
    first = (DEAD, ENDED, RAISED, LAUNCHER)   # the cause first, then what followed
    for ranks, code, sig, why in sorted(groups, key=lambda g: (first.index(g[3]), g[0])):
        status = f"exitcode {code}" + (f" ({sig})" if sig else "")
        parts.append(f"{rank_word(ranks)} {status}: {_reason(why, ranks, causes)}")
    return (f"colltrace: the launcher's failure report ({lines} lines, in {path}): " + "; ".join(parts) + "\n")


def folded_tracebacks_line(ranks: list[int], exception: str, n: int, path: str) -> str:
    """The ranks' tracebacks of collectives that failed after a finding explained why."""
    first = exception if len(exception) <= 120 else exception[:119].rsplit(" ", 1)[0] + " …"
    return (f"colltrace: {rank_word(ranks)} raised in a collective after the failure above "
            f"({first}): {counted(n, 'traceback')}, in {path}\n")
