"""The types of the subcommands' numeric flags: a bad value is argparse's one-line error, exit 2."""
from __future__ import annotations

import argparse


def non_negative(text: str) -> float:
    """A number of seconds (or a share) for a flag: >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:   # also NaN
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {text}")
    return value
