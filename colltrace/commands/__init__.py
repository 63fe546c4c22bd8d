"""The subcommands, registered in one list: each is one class with name, help, prepare_parser()
and run(), in a module of its own; none imports this package."""
from colltrace.commands.analyze import AnalyzeCommand
from colltrace.commands.build_hooks import BuildHooksCommand
from colltrace.commands.dashboard import DashboardCommand
from colltrace.commands.dump import DumpCommand
from colltrace.commands.export import ExportCommand
from colltrace.commands.lint import LintCommand
from colltrace.commands.run import RunCommand
from colltrace.commands.watch import WatchCommand

COMMANDS = [RunCommand, DumpCommand, AnalyzeCommand, ExportCommand, WatchCommand, DashboardCommand, LintCommand,
            BuildHooksCommand]
