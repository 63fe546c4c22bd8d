"""`colltrace build-hooks`: compile colltrace's C++ module against this environment's torch, once per
venv or image, so that a traced collective reads its group's counter and its tensor without torch's
Python bindings and, on torch >= 2.14, no longer pays c10d's Python-hook toll."""
from __future__ import annotations

import sys


class BuildHooksCommand:
    name = "build-hooks"
    # The figures are benchmarks/README.md's (tests/unit/test_docs.py holds them equal to the README's).
    help = ("Compile colltrace's C++ module for this torch (needs a C++ compiler and ninja), once per environment: "
            "ranks then read group counters and tensors from C++ and, on torch >= 2.14, register c10d's hooks "
            "from C++. A traced 1-element all_reduce then adds +4,725 instructions instead of +7,605 on "
            "torch 2.13, +5,066 instead of +12,284 on 2.14.1.")

    def prepare_parser(self, p):
        p.add_argument("--force", action="store_true", help="build again even where a build for this torch exists")
        p.add_argument("--verbose", action="store_true", help="show the compiler's commands and output")

    def run(self, args, parser) -> int:
        from colltrace.errors import ColltraceError
        from colltrace.rank import fastpath, hookbuild

        try:
            import torch
        except ImportError:
            raise ColltraceError("torch is not importable here; run build-hooks in the job's environment") from None
        from colltrace import torchcompat

        # a build against an untested torch may fail: read it in that light
        torchcompat.say_if_newer(torch.__version__)
        if not hookbuild.available():
            raise ColltraceError(f"torch {torch.__version__} was built without torch.distributed; nothing to build for")
        if not fastpath.available():
            raise ColltraceError("colltrace's compiled hot path is not built here (reinstall colltrace with a C "
                                 "compiler); the C++ module serves it")
        path = hookbuild.built()
        if path is not None and not args.force:
            sys.stderr.write(f"colltrace: already built for torch {torch.__version__}: {path}\n")
            return 0
        what = ("the counter and tensor readers and c10d hooks" if hookbuild.supported()
                else "the counter and tensor readers")
        sys.stderr.write(f"colltrace: compiling {what} for torch {torch.__version__} (about half a minute)...\n")
        try:
            path = hookbuild.build(verbose=args.verbose)
        except RuntimeError as exc:
            raise ColltraceError(f"build-hooks: {exc}") from None
        sys.stderr.write(f"colltrace: built {path}\n"
                         f"colltrace: traced ranks on torch {torch.__version__} in this environment now use it "
                         "(COLLTRACE_HOOKS=python: the Python route)\n")
        return 0
