"""The subcommands, registered in one list: each is one class with name, help, prepare_parser()
and run(), in a module of its own; none imports this package."""
from __future__ import annotations

import argparse
from typing import Protocol

from colltrace.commands.analyze import AnalyzeCommand
from colltrace.commands.build_hooks import BuildHooksCommand
from colltrace.commands.dashboard import DashboardCommand
from colltrace.commands.dump import DumpCommand
from colltrace.commands.export import ExportCommand
from colltrace.commands.lint import LintCommand
from colltrace.commands.run import RunCommand
from colltrace.commands.watch import WatchCommand


class Command(Protocol):
    """What cli.py asks of each subcommand class's instances."""

    name: str
    help: str

    def prepare_parser(self, p: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int: ...


COMMANDS: list[type[Command]] = [RunCommand, DumpCommand, AnalyzeCommand, ExportCommand, WatchCommand,
                                 DashboardCommand, LintCommand, BuildHooksCommand]
