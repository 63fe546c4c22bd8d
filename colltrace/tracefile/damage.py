"""What could not be read of a trace folder, file by file: a copy from a cluster may arrive cut
short. The folder is judged from what is readable; each damaged file is named with its reason
(`colltrace analyze` on stderr and in --json's "warnings"), never skipped without a word."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from colltrace.tracefile.layout import FINDINGS


@dataclass(frozen=True)
class Damage:
    file: str               # the file as it was read (DIR/name)
    reason: str             # what is wrong with it, in a few words
    rank: int | None = None
    cost: str = ""          # what the verdict does without it

    def text(self) -> str:
        return f"{self.file}: {self.reason}" + (f": {self.cost}" if self.cost else "")


def jsonl(path: str) -> tuple[list[dict], list[Damage]]:
    """The objects of a JSON-lines file the watchdog appends to (findings.jsonl): every complete
    line; a last line cut short and lines that are not JSON objects are named, not kept."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [Damage(path, f"cannot be read ({exc.strerror or exc})")]
    out, bad, damage = [], 0, []
    lines = data.split(b"\n")
    last = lines.pop()
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            out.append(obj)
        else:
            bad += 1
    if last.strip():
        n = len(out)
        damage.append(Damage(path, f"its last line is cut short ({len(last)} bytes, no line end)",
                             cost=(f"the {n} complete line{'s' if n != 1 else ''} before it "
                                   f"{'are' if n != 1 else 'is'} read")
                             if n else "no line before it is whole"))
    if bad:
        damage.append(Damage(path, f"{bad} line{'s are' if bad != 1 else ' is'} not a JSON object", cost="skipped"))
    return out, damage


def recorded_findings(directory: str) -> tuple[list[dict], list[Damage]]:
    """What the live watchdog recorded (findings.jsonl), and what of it could not be read."""
    return jsonl(os.path.join(directory, FINDINGS))
