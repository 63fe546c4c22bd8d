"""`python -m colltrace ...`: the same as the `colltrace` command."""
import sys

from colltrace.cli import main

sys.exit(main())
