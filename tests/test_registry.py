"""The one registry type (kvaudit.core.registry): commands, generators, backends and audit checks
are all Registries; an unknown name is a user error listing the known ones; entries load lazily
and are checked for what their users call, and every command is one the cli can build and run."""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys

import pytest

from kvaudit.audit.checks.base import REGISTRY as CHECKS
from kvaudit.commands import COMMANDS, GENERATORS, run_command
from kvaudit.core.errors import KvauditError
from kvaudit.core.registry import Entry, Registry
from kvaudit.runners.registry import BACKENDS


def test_every_registry_is_one_type():
    for reg in (COMMANDS, GENERATORS, BACKENDS, CHECKS):
        assert isinstance(reg, Registry)
    assert list(COMMANDS)[:2] == ["run", "audit"] and "demo" in COMMANDS


def test_an_unknown_name_is_a_user_error_listing_the_known_ones():
    with pytest.raises(KvauditError, match=r"unknown backend 'tgi'; known: transformers, vllm, openai"):
        BACKENDS["tgi"]
    assert "tgi" not in BACKENDS and BACKENDS.get("tgi") is None


def test_a_name_registered_twice_is_refused():
    reg = Registry("thing", [Entry("a", "json")])
    with pytest.raises(ValueError, match="thing 'a' registered twice"):
        reg.register(Entry("a", "os"))


def test_load_checks_what_the_users_call():
    reg = Registry("command", [Entry("j", "json"), Entry("dumps", "json:dumps")], requires=("loads",))
    assert reg.load("j").loads("[1]") == [1]
    with pytest.raises(TypeError, match=r"command 'dumps' \(json:dumps\) lacks loads"):
        reg.load("dumps")


def test_every_command_builds_its_cli_and_runs_on_the_parsed_arguments(capsys):
    """What load does not check: each command has a help line, its options sit beside the cli's
    own (--debug) and its help formats (a stray % breaks it), and its run takes the parsed arguments
    (run(args) -> int, as the cli and run_command call it)."""
    from kvaudit import cli

    assert "generate" not in COMMANDS  # the cli's own subcommand for the generators
    for name, entry in COMMANDS.items():
        assert entry.help, name
        assert cli.main([name, "--help"]) == 0, name
        assert capsys.readouterr().out.startswith(f"usage: kvaudit {name} "), name
        inspect.signature(COMMANDS.load(name).run).bind(argparse.Namespace())


def test_help_imports_no_engine_or_stage_module():
    code = ("import sys; from kvaudit.cli import build_parser; build_parser(['--help']); "
            "print(sorted(m for m in sys.modules if m.startswith(('kvaudit.runners.', 'kvaudit.reports.', "
            "'torch', 'vllm', 'transformers'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_run_command_runs_a_generator_and_returns_argparse_errors_as_2(tmp_path, capsys):
    assert run_command(["generate", "boxoffice", "--out", str(tmp_path / "d"), "--cases", "3"]) == 0
    assert (tmp_path / "d" / "cases.jsonl").is_file()
    assert run_command(["audit", "--no-such-option"]) == 2
    assert "kvaudit audit: error: the following arguments are required: RUN" in capsys.readouterr().err
