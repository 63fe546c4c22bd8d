"""`colltrace build-hooks`: compile colltrace's c10d hooks in C++ against this environment's torch
(>= 2.14), once per venv or image, so that a traced collective no longer pays c10d's Python-hook toll."""
from __future__ import annotations

import sys


class BuildHooksCommand:
    name = "build-hooks"
    help = ("Compile colltrace's c10d hooks in C++ for this torch (>= 2.14; needs a C++ compiler and ninja), "
            "once per environment: ranks then skip c10d's Python-hook cost on every traced collective.")

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
        if not hookbuild.supported():
            sys.stderr.write(f"colltrace: torch {torch.__version__} has no c10d collective hooks (they came in 2.14); "
                             "nothing to build: the wrappers trace every collective\n")
            return 0
        if not fastpath.available():
            raise ColltraceError("colltrace's compiled hot path is not built here (reinstall colltrace with a C "
                                 "compiler); the C++ hooks test its thread-local depth")
        path = hookbuild.built()
        if path is not None and not args.force:
            sys.stderr.write(f"colltrace: already built for torch {torch.__version__}: {path}\n")
            return 0
        sys.stderr.write(f"colltrace: compiling the c10d hooks for torch {torch.__version__} "
                         "(about half a minute)...\n")
        try:
            path = hookbuild.build(verbose=args.verbose)
        except RuntimeError as exc:
            raise ColltraceError(f"build-hooks: {exc}") from None
        sys.stderr.write(f"colltrace: built {path}\n"
                         f"colltrace: traced ranks on torch {torch.__version__} in this environment now register these "
                         "hooks (COLLTRACE_HOOKS=python: the Python ones)\n")
        return 0
