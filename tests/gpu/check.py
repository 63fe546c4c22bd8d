"""The GPU check: what colltrace does on NCCL and CUDA, shown on one GPU in a few minutes, from the
repository's files alone (no install; colltrace from this checkout, activated through a
sitecustomize in a temporary folder on PYTHONPATH; nothing written outside $OUT and /tmp).

    python3 tests/gpu/check.py [--only A,B,...] [--budget 460]

Steps (docs: CONTRIBUTING.md, "GPU suite"; the reasons: ../shared/notes/nccl-audit.md section 8):
  A  facts: versions, the recorders, the compiled path, the CUDA runtime routes colltrace finds
  B  Flight Recorder read-back on NCCL (NCCL's recorder, not gloo's), torch's own dump read by
     `colltrace dump`; a group of two backends (init_process_group() with no backend) numbered per backend
  C1 run-ahead across groups: ranks 0-2 enqueue A and B on the default group then block in an object
     collective C; rank 3 blocks in a gather on another group. C2: rank 3 never comes, 0-2 block in
     a synchronize. C3: rank 3 gathers on the default group at A's number
  D  NCCL's own timeout (8 s group timeout): ranks 0 and 1 in all_reduces on two groups; analyze afterwards
  E  a CUDA-graph capture of all_reduce+matmul: untraced, traced (global mode), traced with eager work
     still queued during a raw CUDAGraph capture, traced thread_local
  F  no sync added (the stream still busy after 600 traced calls behind a long kernel) and the cost
     per CUDA collective, traced and untraced; the CPU-side cost with stand-in events
  G  functional collectives on a tp group, then only default-group work: a healthy job
  H  python3 -m pytest tests/gpu (when 120 s of the budget are left; else --only H on its own)
Each step is bounded in time and writes one JSON line to $OUT/summary.jsonl ({"step", "ok",
"expect", "seen", "seconds"}; "ok" null with "skipped" where it cannot run); $OUT/log.txt holds every
job's output; $OUT/traces.tgz the trace folders' findings, reports and definitions. OUT defaults to
a new temporary folder. Without CUDA (the dry run) the CUDA-only steps say "skipped: no CUDA" and
the others run their gloo/CPU form. Exit status 0 when no step failed.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
JOB = os.path.join(HERE, "jobs", "check_job.py")
STALL_S = 5.0
HANGS = ("mismatch", "deadlock", "stall", "dead_rank", "unmatched_p2p")


def markers() -> dict[str, int]:
    out = {}
    with open(JOB) as f:
        for i, line in enumerate(f, 1):
            m = re.search(r"# op: (\S+)", line)
            if m:
                out[m.group(1)] = i
    return out


LINES = markers()


class RankFilesJob:
    """A check's ranks, one Popen each, their output in files that the check reads while they run
    (not conftest's RanksJob: this script stands alone, without pytest, psutil or tests/helpers)."""

    def __init__(self, procs, directory, t0, files):
        self.procs, self.dir, self.t0, self.files = procs, directory, t0, files
        self._seen: dict = {}

    def alive(self) -> list[int]:
        return [r for r, p in enumerate(self.procs) if p.poll() is None]

    def wait(self, timeout: float) -> list:
        deadline = time.time() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        return [p.poll() for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        kill_watchdogs(self.dir)

    def out(self, rank: int) -> str:
        with open(self.files[rank][0], errors="replace") as f:
            return f.read()

    def err(self, rank: int) -> str:
        with open(self.files[rank][1], errors="replace") as f:
            return f.read()

    def tagged(self, rank: int, tag: str):
        lines = [line for line in self.out(rank).splitlines() if line.startswith(tag + " ")]
        return json.loads(lines[-1][len(tag) + 1:]) if lines else None

    def printed(self, tag: str) -> list[float]:
        """When each rank printed `tag` (the check reads their output as it comes)."""
        return [t for t in (self._seen.get((r, tag)) for r in range(len(self.procs))) if t is not None]

    def watch(self, until, timeout: float, tags=("READY",)) -> bool:
        """Poll until until(self) or timeout; notes when each rank first printed each tag."""
        deadline = time.time() + timeout
        while True:
            for r in range(len(self.procs)):
                text = self.out(r)
                for tag in tags:
                    if (r, tag) not in self._seen and f"\n{tag}" in "\n" + text:
                        self._seen[(r, tag)] = time.time()
            if until(self):
                return True
            if time.time() >= deadline:
                return False
            time.sleep(0.1)


def kill_watchdogs(directory: str) -> None:
    """Watchdogs run in their own session: end those still watching this folder."""
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"colltrace.host" in cmd and directory.encode() in cmd:
            try:
                os.kill(int(path.split("/")[2]), signal.SIGKILL)
            except OSError:
                pass


def findings(directory: str) -> list[dict]:
    path = os.path.join(directory, "findings.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def lines_of(finding: dict, rank: int) -> set[int]:
    info = (finding.get("ranks") or {}).get(str(rank)) or {}
    return {f.get("line") for f in info.get("frames") or [] if str(f.get("file", "")).endswith("check_job.py")}


def brief(f: dict) -> dict:
    return {"kind": f.get("kind"), "key": f.get("key"), "stage": f.get("stage"),
            "missing": f.get("missing_ranks"), "summary": (f.get("summary") or "")[:300]}


class Check:
    def __init__(self, out: str, budget: float, cuda: bool):
        self.out, self.budget, self.cuda = out, budget, cuda
        self.t0 = time.time()
        self.work = tempfile.mkdtemp(prefix="colltrace-gpu-check-")
        self.site = os.path.join(self.work, "site")
        self.log_path = os.path.join(out, "log.txt")
        self.summary_path = os.path.join(out, "summary.jsonl")
        self.results: list[dict] = []
        self.dirs: list[str] = []
        os.makedirs(self.site)
        # COLLTRACE=1 from the checkout: colltrace.pth processed from a folder on PYTHONPATH
        shutil.copy(os.path.join(REPO, "colltrace.pth"), self.site)
        with open(os.path.join(self.site, "sitecustomize.py"), "w") as f:
            f.write("import os, site\nsite.addsitedir(os.path.dirname(os.path.abspath(__file__)))\n")
        self.pythonpath = os.pathsep.join([REPO, self.site]
                                          + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

    # -- output -----------------------------------------------------------------------
    def log(self, text: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def result(self, step: str, ok, expect: str, seen: dict, started: float, skipped: str | None = None) -> None:
        r = {"step": step, "ok": ok, "expect": expect, "seen": seen, "seconds": round(time.time() - started, 1)}
        if skipped:
            r["skipped"] = skipped
        self.results.append(r)
        with open(self.summary_path, "a") as f:
            f.write(json.dumps(r, default=str) + "\n")
        mark = "skipped" if ok is None else "ok" if ok else "FAILED"
        line = f"[{time.time() - self.t0:6.1f}s] {step}: {mark} ({r['seconds']} s) {skipped or ''}"
        print(line, flush=True)
        self.log(line + "\n  expect: " + expect + "\n  seen: " + json.dumps(seen, default=str)[:4000])

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)

    # -- jobs -------------------------------------------------------------------------
    def env(self, traced: bool = True, extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLTRACE", "TORCH_DISTRIBUTED_DEBUG"))}
        env.update(PYTHONPATH=self.pythonpath, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
        if not self.cuda:
            env["CHECK_CPU"] = "1"
        else:
            env["NCCL_SOCKET_IFNAME"] = "lo"
        if traced:
            env.update(COLLTRACE="1", COLLTRACE_STALL_S=str(STALL_S))
        env.update(extra or {})
        return env

    def start(self, tag: str, mode: str, args=(), n: int = 1, traced: bool = True,
              env: dict | None = None) -> RankFilesJob:
        d = os.path.join(self.work, tag)
        os.makedirs(d, exist_ok=True)
        self.dirs.append(d)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        base = self.env(traced, env)
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n))
        if traced:
            base["COLLTRACE_DIR"] = d
        procs, files = [], []
        for r in range(n):
            o, e = os.path.join(d, f"out-{r}.txt"), os.path.join(d, f"err-{r}.txt")
            rank_env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
            if n > 1 and self.cuda:
                rank_env["NCCL_HOSTID"] = f"colltrace-check-{r}"   # NCCL refuses two ranks on one GPU of one host
            with open(o, "w") as fo, open(e, "w") as fe:
                procs.append(subprocess.Popen([sys.executable, JOB, mode, *args], env=rank_env, stdout=fo, stderr=fe,
                                              start_new_session=True))
            files.append((o, e))
        self.log(f"--- {tag}: {mode} {' '.join(args)} x{n} {'traced' if traced else 'untraced'} in {d}")
        return RankFilesJob(procs, d, time.time(), files)

    def finish(self, job: RankFilesJob) -> None:
        job.kill()
        for r in range(len(job.procs)):
            self.log(f"--- {os.path.basename(job.dir)} rank {r} exit {job.procs[r].poll()}\n{job.out(r)[-3000:]}\n"
                     f"--- stderr\n{job.err(r)[-6000:]}")

    def cli(self, *args, timeout: float = 60) -> tuple[int, str]:
        try:
            p = subprocess.run([sys.executable, "-m", "colltrace", *args], env=self.env(traced=False),
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return -1, "timed out"
        self.log(f"--- colltrace {' '.join(args)}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}")
        return p.returncode, p.stdout

    def dump_records(self, directory: str) -> dict:
        """Torch's own Flight Recorder dumps in `directory`, read as `colltrace analyze` reads them:
        {rank: its records}."""
        sys.path.insert(0, REPO)
        from colltrace.tracefile import postmortem

        try:
            snap = postmortem.load(directory)
        except Exception as exc:
            self.log(f"--- {directory}: {exc}")
            return {}
        return {r: e.get("records") or [] for r, e in snap["ranks"].items()}

    def records(self, directory: str) -> dict:
        rc, out = self.cli("dump", directory, "--json")
        try:
            return json.loads(out).get("ranks", {}) if rc == 0 else {}
        except ValueError:
            return {}

    # -- steps ------------------------------------------------------------------------
    def step_A(self):
        t = time.time()
        code = r"""
import json, os, sys, sysconfig
import torch, torch.distributed as dist
c = torch._C._distributed_c10d
out = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.cuda.is_available(),
       "nccl": dist.is_nccl_available(), "dumps": sorted(n for n in dir(c) if "dump" in n.lower())}
if out["cuda"]:
    out["device"] = torch.cuda.get_device_name(0)
    out["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
from colltrace.rank import cudamarks, fastpath, hooks
out["fastpath"] = fastpath.available()
out["hooks"] = hooks.supported(dist.ProcessGroup)
out["libcudart"] = cudamarks._Cudart.find() is not None
if out["cuda"]:
    torch.ones(1, device="cuda")
    rt = cudamarks.TorchCuda()
    out["own_stream"] = rt.own_stream(0) is not None
    out["thread_local_queries"] = rt.thread_local_queries()
for m in ("psutil", "numpy", "pytest", "pytest_timeout"):
    try:
        __import__(m); out[m] = True
    except Exception:
        out[m] = False
print("FACTS " + json.dumps(out))
"""
        seen: dict = {}
        built = self.build_fastpath()
        seen["fastpath_build"] = built
        try:
            p = subprocess.run([sys.executable, "-c", code], env=self.env(traced=False), capture_output=True, text=True,
                               timeout=60)
            self.log(p.stdout + p.stderr)
            line = [x for x in p.stdout.splitlines() if x.startswith("FACTS ")]
            seen.update(json.loads(line[-1][6:]) if line else {"error": p.stderr[-2000:]})
        except subprocess.TimeoutExpired:
            seen["error"] = "timed out"
        ok = bool(seen.get("cuda") and seen.get("nccl")) if self.cuda else None
        self.result("A", ok, "torch sees the GPU and NCCL; the facts the other steps rest on", seen, t,
                    None if self.cuda else "no CUDA: facts only")

    def build_fastpath(self) -> str:
        """The compiled hot path for this Python, where a compiler and Python's headers are (the
        checkout ships a build for CPython 3.11 only)."""
        import sysconfig

        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        target = os.path.join(REPO, "colltrace", "rank", "_fastpath" + suffix)
        if os.path.exists(target):
            return "present"
        include = sysconfig.get_paths()["include"]
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None or not os.path.exists(os.path.join(include, "Python.h")):
            return "no compiler or no Python.h: the Python wrappers"
        try:
            p = subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{include}",
                                os.path.join(REPO, "colltrace", "rank", "_fastpath.c"), "-o", target],
                               capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return "compile timed out"
        return "built" if p.returncode == 0 else f"compile failed: {p.stderr[-300:]}"

    def step_B(self):
        t = time.time()
        fr_out = os.path.join(self.work, "B-torch-dump")
        job = self.start("B-fr", "fr", n=2, env={"FR_OUT": fr_out, "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                                                 "TORCH_FR_BUFFER_SIZE": "2000"})
        codes = job.wait(90)
        self.finish(job)
        facts = job.tagged(0, "FACTS") or {}
        mine = {tuple(x[:2]) for x in facts.get("answer") or [] if x[0] == "0"}
        recs = self.records(job.dir).get("0", [])
        dump_recs = self.dump_records(fr_out).get("0", [])
        counter = facts.get("counter") or 0
        seen = {"exit": codes, "dumps": facts.get("dumps"), "answer_error": facts.get("answer_error"),
                "answer_seqs": sorted(s for _, s in mine), "counter": counter, "routes": facts.get("routes"),
                "records": [(r["op"], r["seq"], r["state"]) for r in recs], "torch_dump_records": len(dump_recs)}
        ok = (codes == [0, 0] and facts.get("answer_error") is None and bool(mine)
              and max(s for _, s in mine) == counter
              and all(r["state"] == "completed" for r in recs) and len(dump_recs) >= 9)
        if self.cuda:
            ok = ok and (facts.get("dumps") or {}).get("_dump_nccl_trace_json", 0) >= 9
        self.result("B1", ok, "colltrace's Flight Recorder answer names group 0's collectives up to the backend's "
                    "counter (NCCL's recorder holds >= 9 entries; gloo's holds none of them); every record completed; "
                    "torch's own dump read back with >= 9 records", seen, t)

        t = time.time()
        job = self.start("B-mixed", "mixed", n=2)
        codes = job.wait(90)
        self.finish(job)
        facts = job.tagged(0, "FACTS") or {}
        recs = self.records(job.dir).get("0", [])
        got = [(r["group"], r["seq"], r["seq_end"], r["op"]) for r in recs if r["op"] != "untraced"]
        want = [("0:cpu", 1, 1, "all_reduce")]
        if self.cuda:
            want += [("0", 1, 1, "all_reduce"), ("0:cpu", 2, 2, "all_reduce"), ("0", 2, 2, "all_reduce")]
        else:
            want += [("0:cpu", 2, 2, "all_reduce")]
        want += [("0:cpu", 3, 4, "all_gather_object")]
        rc, out = self.cli("analyze", job.dir, "--json")
        seen = {"exit": codes, "backend": facts.get("backend"), "counters": facts.get("counters"), "records": got,
                "analyze_exit": rc, "untraced": [r for r in recs if r["op"] == "untraced"][:3]}
        ok = codes == [0, 0] and got == want and rc == 0 and not seen["untraced"]
        self.result("B2", ok, f"a group of two backends: each numbers its own ops ({want}), no untraced gaps, "
                    "no finding", seen, t)

    def _runahead(self, step: str, shape: str, expect: str, judge):
        t = time.time()
        job = self.start(f"{step}-{shape}", "runahead", (shape,), n=4)
        job.watch(lambda j: len(j.printed("READY")) == 4 or not j.alive(), 60)
        ready = max(job.printed("READY"), default=None)
        # the findings a hang makes: wait for the first, then a little for any that follow it
        first_at = None
        if ready is not None:
            job.watch(lambda j: any(f.get("kind") in HANGS for f in findings(j.dir)), STALL_S * 3 + 10)
            first_at = time.time()
            time.sleep(STALL_S + 2)   # a stall the finding should have made unnecessary would come by now
        found = findings(job.dir)
        self.finish(job)
        hangs = [f for f in found if f.get("kind") in HANGS]
        seen = {"ready": ready is not None, "findings": [brief(f) for f in found],
                "first_after_ready_s": (None if not hangs or ready is None
                                        else round(hangs[0].get("detected_at", first_at) - ready, 2)),
                "lines": {k: LINES[k] for k in ("A", "B", "C", "r3_gather")}}
        ok = ready is not None and seen["first_after_ready_s"] is not None and judge(hangs, seen)
        self.result(step, ok, expect, seen, t)

    def step_C1(self):
        def judge(hangs, seen):
            first = hangs[0] if hangs else {}
            at_a = all(LINES["A"] in lines_of(first, r) for r in (0, 1, 2))
            names_c = any(LINES["C"] in lines_of(f, 0) and LINES["A"] not in lines_of(f, 0) for f in hangs)
            return bool(hangs) and at_a and not names_c and len(hangs) == 1 and seen["first_after_ready_s"] <= 3
        self._runahead("C1", "cross", "one finding, within ~1 s of the last rank parking: ranks 0-2 at the stuck "
                       "all_reduce A (not C, the later object collective they block in), rank 3 in its gather on the "
                       "other group", judge)

    def step_C2(self):
        def judge(hangs, seen):
            return (len(hangs) == 1 and all(LINES["A"] in lines_of(hangs[0], r) for r in (0, 1, 2))
                    and 3 in (hangs[0].get("missing_ranks") or []) and seen["first_after_ready_s"] <= STALL_S + 3)
        self._runahead("C2", "absent", f"one stall ~{STALL_S:.0f} s after the ranks park: ranks 0-2 at A, "
                       "rank 3 missing; nothing of its own for B (queued behind A)", judge)

    def step_C3(self):
        def judge(hangs, seen):
            first = hangs[0] if hangs else {}
            return (len(hangs) == 1 and first.get("kind") == "mismatch"
                    and all(LINES["A"] in lines_of(first, r) for r in (0, 1, 2))
                    and LINES["r3_gather"] in lines_of(first, 3) and seen["first_after_ready_s"] <= 3)
        self._runahead("C3", "same", "one mismatch within ~1 s: all_reduce A on ranks 0-2 against rank 3's gather "
                       "at the same number; no stall for B", judge)

    def step_D(self):
        t = time.time()
        prefix = os.path.join(self.work, "D-dumps", "fr_")   # NCCL's own dump on its timeout (both names torch used)
        os.makedirs(os.path.dirname(prefix))
        self.dirs.append(os.path.dirname(prefix))
        env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
               "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_ON_TIMEOUT": "1",
               "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix, "TORCH_FR_DUMP_TEMP_FILE": prefix,
               "COLLTRACE_ON_HANG": "warn"}
        job = self.start("D-timeout", "timeout", n=2, env=env)
        job.watch(lambda j: not j.alive(), 50)
        ended = [p.poll() for p in job.procs]
        time.sleep(2)   # the watchdog reads the endings
        self.finish(job)
        rc, out = self.cli("analyze", job.dir, "--json")
        try:
            verdict = json.loads(out)
        except ValueError:
            verdict = {}
        fs = verdict.get("findings") or []
        stuck = [r for r in self.records(job.dir).get("0", []) if LINES["stuck"] == _user_line(r)]
        dumps = sorted(glob.glob(prefix + "*"))
        fr_rc = self.cli("analyze", os.path.dirname(prefix), "--json")[0] if dumps else None
        seen = {"exits": ended, "analyze_exit": rc, "findings": [brief(f) for f in fs],
                "stuck_record": [(r["op"], r["state"], r.get("error")) for r in stuck],
                "nccl_dumps": [os.path.basename(p) for p in dumps],
                "fr_analyze_exit": fr_rc}
        first = fs[0] if fs else {}
        ok = (None not in ended and rc == 1 and first.get("kind") in ("stall", "deadlock", "mismatch")
              and LINES["stuck"] in lines_of(first, 0) and LINES["stuck_other"] in lines_of(first, 1)
              and bool(stuck) and all(r["state"] != "completed" for r in stuck))
        self.result("D", ok, "both ranks end of the backend's timeout (NCCL: its watchdog's abort); `analyze` "
                    "afterwards exits 1 naming the hang first (rank 0's all_reduce on the default group, rank 1's on "
                    "the other), the endings as its consequence; the timed-out all_reduce is not 'completed' in `dump`",
                    seen, t)

    def step_E(self):
        t = time.time()
        if not self.cuda:
            self.result("E", None, "CUDA-graph captures succeed traced", {}, t, "skipped: no CUDA")
            return
        seen, ok = {}, True
        for variant, traced in (("global", False), ("global", True), ("raw", True), ("thread_local", True)):
            name = f"{variant}{'' if traced else '-untraced'}"
            job = self.start(f"E-{name}", "graph", (variant,), n=1, traced=traced)
            code = job.wait(60)[0]
            self.finish(job)
            g = job.tagged(0, "GRAPH") or {}
            recs = self.records(job.dir).get("0", []) if traced else []
            captured = [r for r in recs if r.get("captured")]
            eager = [r for r in recs if not r.get("captured") and r["op"] != "untraced"]
            seen[name] = {"exit": code, "graph_ok": g.get("ok"), "captured": len(captured),
                          "eager_states": sorted({r["state"] for r in eager}),
                          "error": job.err(0)[-400:] if code else None}
            ok = ok and code == 0 and g.get("ok") is True
            if traced:
                ok = ok and len(captured) == 200 and seen[name]["eager_states"] == ["completed"]
        self.result("E", ok, "every capture succeeds and replays right, traced as untraced (no CUDA call from "
                    "colltrace's threads during a global-mode capture); 200 captured records, every eager one "
                    "completed", seen, t)

    def step_F(self):
        t = time.time()
        job = self.start("F-nosync", "nosync", n=1)
        code = job.wait(90)[0]
        self.finish(job)
        facts = job.tagged(0, "NOSYNC") or {}
        seen = {"exit": code, **facts}
        try:
            p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "cuda_path.py"), "--blocks", "9",
                                "--calls", "1000"],
                               env=self.env(traced=False), capture_output=True, text=True, timeout=90)
            seen["cpu_side_stand_in"] = (json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0
                                         else p.stderr[-300:])
        except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            seen["cpu_side_stand_in"] = repr(exc)
        ok = code == 0 and facts.get("pending_marks") == 0
        if self.cuda:
            ok = ok and facts.get("busy") is True
        self.result("F", ok, "the GPU still busy after 600 traced calls were enqueued behind a long kernel (no host "
                    "sync added); every mark drained; the cost per call traced vs untraced, as measured", seen, t)

    def step_G(self):
        t = time.time()
        job = self.start("G-funcol", "funcol", n=2)
        codes = job.wait(60)
        time.sleep(1)
        found = findings(job.dir)
        self.finish(job)
        rc, _ = self.cli("analyze", job.dir, "--json")
        seen = {"exit": codes, "findings": [brief(f) for f in found], "analyze_exit": rc}
        ok = codes == [0, 0] and not found and rc == 0
        self.result("G", ok, "a healthy job (functional all_reduces on a tp group, waited, then only default-group "
                    "work past the stall threshold): no finding, exit 0 everywhere", seen, t)

    def step_H(self):
        t = time.time()
        if self.left() < 120:
            self.result("H", None, "tests/gpu pass", {}, t, f"skipped: {self.left():.0f} s of the budget left")
            return
        cmd = [sys.executable, "-m", "pytest", os.path.join(REPO, "tests", "gpu"), "-o", "addopts=",
               "-p", "no:cacheprovider", "-q", "-rfEs", "--timeout", "100"]
        try:
            p = subprocess.run(cmd, env=self.env(traced=False), cwd=REPO, capture_output=True, text=True,
                               timeout=max(60, self.left() - 20))
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as exc:
            rc, text = -1, f"timed out\n{exc.stdout or ''}"
        self.log(f"--- pytest tests/gpu: exit {rc}\n{text[-8000:]}")
        tail = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
        self.result("H", rc == 0, "python3 -m pytest tests/gpu passes",
                    {"exit": rc, "summary": tail[-1:] if tail else text[-300:]}, t)

    def pack(self) -> None:
        with tarfile.open(os.path.join(self.out, "traces.tgz"), "w:gz") as tar:
            for d in self.dirs:
                for path in glob.glob(os.path.join(d, "*")):
                    name = os.path.basename(path)
                    if name.endswith((".jsonl", ".txt", ".json")) or name.startswith("fr_"):
                        tar.add(path, arcname=os.path.join(os.path.basename(d), name))


def _user_line(record: dict):
    for f in reversed(record.get("frames") or []):
        if str(f.get("file", "")).endswith("check_job.py"):
            return f["line"]
    return None


STEPS = ("A", "B", "C1", "C2", "C3", "D", "E", "F", "G", "H")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated steps (default: all)")
    ap.add_argument("--budget", type=float, default=460.0,
                    help="seconds for the whole check; H runs only if 120 are left")
    a = ap.parse_args()
    out = os.environ.get("OUT") or tempfile.mkdtemp(prefix="colltrace-gpu-out-")
    os.makedirs(out, exist_ok=True)
    try:
        import torch
        cuda = torch.cuda.is_available() and torch.distributed.is_nccl_available()
    except Exception:
        cuda = False
    check = Check(out, a.budget, cuda)
    print(f"colltrace GPU check: {'CUDA' if cuda else 'no CUDA (dry run: gloo/CPU forms)'}; results in {out}",
          flush=True)
    only = [s.strip() for s in a.only.split(",") if s.strip()] or list(STEPS)
    for step in STEPS:
        if step not in only:
            continue
        started = time.time()
        if step != "H" and check.left() < 20:
            check.result(step, None, "", {}, started, "skipped: the budget is spent")
            continue
        try:
            getattr(check, "step_" + step)()
        except Exception as exc:   # a broken step is a failed step; the others still run
            check.result(step, False, "the step itself ran", {"error": f"{type(exc).__name__}: {exc}"}, started)
    check.pack()
    failed = [r["step"] for r in check.results if r["ok"] is False]
    print(f"done in {time.time() - check.t0:.0f} s; failed: {failed or 'none'}; {out}/summary.jsonl", flush=True)
    shutil.rmtree(check.work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
