"""The one error type: every user-facing error is one line and an exit code; one HOST:PORT parser."""
import pytest

from colltrace import address, cli, config
from colltrace.commands.analyze import AnalyzeCommand
from colltrace.errors import ColltraceError, InputError, UsageError
from colltrace.host import storelink
from colltrace.tracefile import frdump, reader


def test_the_cli_prints_one_line_and_the_errors_exit_code(monkeypatch, capsys, tmp_path):
    class Refused(ColltraceError):
        exit_code = 3

    def run(self, args, parser):
        raise Refused("the store at node0:29500 refused us")

    monkeypatch.setattr(AnalyzeCommand, "run", run)
    assert cli.main(["analyze", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err == "colltrace: error: the store at node0:29500 refused us\n"


def test_unreadable_input_raised_deep_inside_is_exit_2_with_the_files_name(tmp_path, capsys):
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x80\x04not a pickle")
    assert cli.main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nccl_trace_rank_0" in err and "Traceback" not in err


def test_the_errors_users_read_are_colltrace_errors():
    assert issubclass(reader.TraceError, InputError)
    assert issubclass(frdump.DumpError, InputError)
    assert issubclass(storelink.StoreError, ColltraceError)
    assert issubclass(address.AddressError, UsageError) and issubclass(address.AddressError, ValueError)


@pytest.mark.parametrize("text,kw,want", [
    ("node0:29500", {}, ("node0", 29500)),
    (" [::1]:29500 ", {}, ("::1", 29500)),
    ("8765", {"default_host": "127.0.0.1", "any_port": True}, ("127.0.0.1", 8765)),
    ("0.0.0.0:0", {"default_host": "127.0.0.1", "any_port": True}, ("0.0.0.0", 0)),
])
def test_one_parser_reads_store_and_bind_addresses(text, kw, want):
    assert address.parse(text, **kw) == want


@pytest.mark.parametrize("text,kw", [
    ("node0", {}), ("node0:", {}), (":29500", {}), ("node0:0", {}), ("node0:70000", {}), ("node0:http", {}),
    ("", {"default_host": "127.0.0.1", "any_port": True}), ("x:", {"default_host": "127.0.0.1"}),
])
def test_bad_addresses_say_which_form_was_expected(text, kw):
    with pytest.raises(address.AddressError, match="is not (HOST:PORT|\\[HOST:\\]PORT)"):
        address.parse(text, **kw)


def test_the_store_and_the_dashboard_use_that_parser():
    with pytest.raises(storelink.StoreError, match="is not HOST:PORT"):
        storelink.parse_address("node0")
    with pytest.raises(ValueError, match=r"is not \[HOST:\]PORT"):
        config.parse_bind("host:port")
    assert config.parse_bind("8765") == ("127.0.0.1", 8765)
