"""The subcommands; each is one class with name, help, prepare_parser() and run()."""


class UsageError(Exception):
    """Bad flags or unreadable input: printed as one line, exit code 2."""


from colltrace.commands.analyze import AnalyzeCommand  # noqa: E402
from colltrace.commands.dashboard import DashboardCommand  # noqa: E402
from colltrace.commands.dump import DumpCommand  # noqa: E402
from colltrace.commands.export import ExportCommand  # noqa: E402
from colltrace.commands.lint import LintCommand  # noqa: E402
from colltrace.commands.run import RunCommand  # noqa: E402
from colltrace.commands.watch import WatchCommand  # noqa: E402

COMMANDS = [RunCommand, DumpCommand, AnalyzeCommand, ExportCommand, WatchCommand, DashboardCommand, LintCommand]
