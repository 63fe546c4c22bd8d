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


def port(text: str) -> int:
    """A TCP port to listen on: 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, not {text}")
    return value


def add_stall_s(p: argparse.ArgumentParser, help: str) -> None:
    """The analyzer's stall threshold, as analyze, export and the dashboard take it."""
    p.add_argument("--stall-s", type=non_negative, default=None, metavar="S", help=help)


def add_frdump_prefix(p: argparse.ArgumentParser, help: str) -> None:
    """Where the trace folder is one of Flight Recorder dumps: the file name before the rank."""
    p.add_argument("--prefix", default=None, help=help)
