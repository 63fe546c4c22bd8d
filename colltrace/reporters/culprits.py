"""The culprits paragraph: analysis/culprits.py's Explanation in words.

    Culprits: look at ranks 12,14 first. Rank 12 never entered all_reduce #3 on group dp, where
    ranks 0-11 waited; rank 14 did not complete .... The other 14 ranks involved (0-11,13,15)
    only wait, directly or through others, on them."""
from __future__ import annotations

from colltrace.analysis.culprits import Explanation, Reason, Where
from colltrace.reporters.phrases import call_at, capitalized
from colltrace.words import and_list, rank_word, short_ranks


def _at(w: Where | None) -> str:
    """"all_reduce #3 on group dp" ("#3 on group dp" where no rank said the op)."""
    if w is None:
        return "a collective"
    return call_at(w.op, w.seq, w.group)


def reason_text(r: Reason) -> str:
    """The reason as the rest of a sentence whose subject is the culprit: "never entered ..."."""
    if r.what == "odd_op":
        seq, group = (r.at.seq, r.at.group) if r.at else (None, None)
        return f"called {r.op} where {rank_word(list(r.ranks))} called {r.other_op}, as {call_at(None, seq, group)}"
    if r.what == "odd_args":
        differs = [d.replace("_", " ") for d in r.differs]
        return f"called {_at(r.at)} with different {and_list(differs) or 'arguments'} than the other members"
    if r.what == "died":
        return "died (or exited) while the others still needed it"
    if r.what == "exited" and r.code is None:
        return f"was interrupted by {r.how} while the others still needed it"
    if r.what == "exited":
        how = {"return": "its program returned", "exception": "an exception", "native": "exit() in native code",
               "SystemExit": "SystemExit"}.get(str(r.how), r.how)
        return f"exited with code {r.code}" + (f" ({how})" if how else "") + " while the others still needed it"
    if r.what == "cycle":
        a = r.at or Where(None, None, None)
        text = f"waited in {call_at(a.op, a.seq, a.group)}"
        if r.ranks:
            text += f", which {rank_word(list(r.ranks))} never called"
            if r.instead:
                text += f" (waiting in {call_at(r.instead.op, r.instead.seq, r.instead.group)} instead)"
        return text + ": a wait cycle"
    if r.what == "never_posted":
        return f"never posted the op matching rank {r.rank}'s {r.op}"
    if r.what == "no_match":
        return f"showed no op matching rank {r.rank}'s {r.op}"
    if r.what == "no_transfer":
        return "posted a transfer that never completes"
    if r.what == "not_completed":
        return f"did not complete {_at(r.at)}, which {rank_word(list(r.ranks))} completed"
    if r.what == "never_completes":
        return f"entered {_at(r.at)} with everyone, and it never completes"
    if r.what == "never_entered":
        return f"never entered {_at(r.at)}" + (f", where {rank_word(list(r.ranks))} waited" if r.ranks else "")
    return "is where the waits end"


def culprit_paragraph(e: Explanation) -> str:
    """"Culprits: look at ranks 12,14 first. Rank 12 never entered ...; rank 14 did not complete
    .... The other 14 ranks involved (0-11,13,15) only wait, directly or through others, on them."
    Culprits with the same reason share one sentence; "" when there are none."""
    if not e.culprits:
        return ""
    alike: dict[str, list[int]] = {}
    more: dict[str, int] = {}
    for r in e.culprits:
        why = [reason_text(x) for x in e.reasons.get(r) or ()] or ["is where the waits end"]
        alike.setdefault(why[0], []).append(r)
        more[why[0]] = max(more.get(why[0], 0), len(why) - 1)
    parts = [f"{rank_word(rs)} {why}" + (f" (and {more[why]} more like it)" if more[why] else "")
             for why, rs in alike.items()]
    text = f"Culprits: look at {rank_word(e.culprits)} first. {capitalized('; '.join(parts))}."
    if e.others:
        others = e.others
        who = (f"The other rank involved ({others[0]}) only waits" if len(others) == 1 else
               f"The other {len(others)} ranks involved ({short_ranks(others)}) only wait")
        text += f" {who}, directly or through others, on {'it' if len(e.culprits) == 1 else 'them'}."
    return text
