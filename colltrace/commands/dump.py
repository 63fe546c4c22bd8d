"""`colltrace dump DIR`: what every rank recorded, oldest first; `--from-store` copies a live job's state into a
folder."""
from __future__ import annotations

import json
import sys

from colltrace.commands import flags
from colltrace.tracefile import reader


def _where(frames, roots=None) -> str:
    from colltrace.reporters.locations import located

    return located(frames, roots) or ""


def _fault(tr) -> dict | None:
    """How a rank's files say it died of a fatal signal: {"signal", "code", "frames" (innermost
    last), "native_frames" (innermost first), "native_exception"}; None if it did not."""
    f = tr.fault()
    if not f or not f.get("signal"):
        return None
    return {k: f[k] for k in ("signal", "code", "frames", "native_frames", "native_exception") if f.get(k) is not None}


def _fault_lines(fault: dict, roots) -> list[str]:
    from colltrace.reporters import native

    at = _where(fault.get("frames"), roots)
    head = f"  died of {fault['signal']}" + (f" at {at}" if at else "")
    exc = native.exception_text(fault.get("native_exception"))
    if exc:
        head += f" ({exc})"
    frames = fault.get("native_frames")
    if not frames:
        return [head]
    return [head + "; native frames, innermost first:"] + native.lines(frames, indent="    ")


def timeline(ranks: dict, last: int | None, roots: dict | None = None, faults: dict | None = None) -> str:
    """`roots`: {rank: its recorded roots}, to tell the user's frames from the frameworks';
    `faults`: {rank: how it died of a fatal signal}, said after its records."""
    t0 = min((r["entered_at"] for recs in ranks.values() for r in recs), default=0.0)
    from colltrace.reporters.phrases import clock

    lines = [f"time: seconds since the first record ({clock(t0)}); took: entered to completed",
             f"  {'time':>10}  {'group':<10} {'number':<8} {'op':<24} {'state':<9}{'took':<12} shapes dtypes  where"]
    for rank, recs in ranks.items():
        shown = recs[-last:] if last else recs
        lines.append(f"rank {rank}: {len(recs)} records"
                     + (f" (last {len(shown)} shown)" if len(shown) < len(recs) else ""))
        for r in shown:
            if r["op"] == "untraced":
                lines.append(f"  {r['entered_at'] - t0:9.3f}s  group {r['group']:<4} #{r['seq']}-{r['seq_end']}  "
                             f"untraced x{r['count']} (ran in C++, not seen in Python: DDP's reducer, pg.* calls, "
                             "compiled code)")
                continue
            num = f"#{r['seq']}" + (f"-{r['seq_end']}" if r["seq_end"] != r["seq"] else "")
            if r["p2p"]:
                num = f"p2p {r['seq']} peer {r['peer']}"
            dur = ""
            if r.get("completed_at"):
                dur = f" {1000 * (r['completed_at'] - r['entered_at']):.2f} ms"
            shapes = " ".join("x".join(map(str, s)) or "scalar" for s in r["shapes"][:3])
            lines.append(f"  {r['entered_at'] - t0:9.3f}s  group {r['group']:<4} {num:<8} {r['op']:<24} "
                         f"{r['state']:<9}{dur:<12} {shapes} {','.join(sorted(set(r['dtypes'])))}  "
                         f"{_where(r['frames'], (roots or {}).get(rank))}")
        if faults and rank in faults:
            lines.extend(_fault_lines(faults[rank], (roots or {}).get(rank)))
    return "\n".join(lines)


class DumpCommand:
    name = "dump"
    help = "Print what every rank recorded (oldest first), or snapshot a live job's state into a folder."

    def prepare_parser(self, p):
        p.add_argument("dir", help="the trace folder; with --from-store, the folder to write")
        p.add_argument("--json", action="store_true", help='print {"ranks": {"0": [record, ...]}}')
        p.add_argument("--rank", type=int, action="append", help="only this rank (repeatable)")
        p.add_argument("--last", type=flags.positive_int, default=None,
                       help="only the last N records per rank (text view)")
        p.add_argument("--from-store", metavar="HOST:PORT",
                       help="snapshot a live (even hung) job from its TCPStore (MASTER_ADDR:MASTER_PORT) into DIR")

    def run(self, args, parser) -> int:
        from colltrace.errors import UsageError

        if args.from_store:
            from colltrace.host import storelink

            try:
                path = storelink.snapshot_to_folder(args.from_store, args.dir)
            except (storelink.StoreError, OSError) as exc:
                raise UsageError(str(exc)) from None
            sys.stderr.write(f"colltrace: wrote {path}\nnext: colltrace analyze {args.dir}\n")
            return 0
        from colltrace.tracefile import postmortem

        args.dir = postmortem.resolve(args.dir)
        traces = reader.load_traces(args.dir)   # TraceError: one line, exit 2
        missing = sorted(set(args.rank or ()) - {tr.rank for tr in traces})
        if missing:
            from colltrace.words import format_ranks, rank_word

            have = format_ranks(tr.rank for tr in traces)
            raise UsageError(f"{rank_word(missing)}: not in {args.dir} (its ranks: {have or 'none'})")
        traces = [tr for tr in traces if not args.rank or tr.rank in args.rank]
        ranks = {str(tr.rank): tr.all_records() for tr in traces}
        problems = [f"rank {tr.rank}: {tr.error}" for tr in traces if tr.error]
        faults = {str(tr.rank): f for tr in traces if str(tr.rank) in ranks and (f := _fault(tr)) is not None}
        if args.json:
            out: dict = {"ranks": ranks}
            if faults:
                out["faults"] = faults   # the fatal signal each rank died of, where, in Python and native code
            if problems:
                out["unreadable"] = problems
            sys.stdout.write(json.dumps(out, default=str))
            sys.stdout.write("\n")
        else:
            roots = {str(tr.rank): tr.meta.get("roots") for tr in traces}
            sys.stdout.write(timeline(ranks, args.last, roots, faults) + "\n")
        damage = [d for tr in traces for d in tr.damage()]
        for d in damage:   # each damaged file with its reason; what is readable is shown
            sys.stderr.write(f"colltrace: warning: {d.text()}\n")
        if traces and all(tr.error for tr in traces):
            raise reader.nothing_readable(args.dir, damage)
        return 0
