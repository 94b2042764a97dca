"""The subcommands of ``kvaudit``, by name: one :class:`~kvaudit.core.registry.Registry` of lazy
entries, each a module with ``add_arguments(parser)`` and ``run(args) -> int``.

:mod:`kvaudit.cli` builds its parser from this table (and the generators' table,
:data:`kvaudit.generators.registry.GENERATORS`); :mod:`kvaudit.demo` runs its stages through
:func:`run_command`, never through the CLI that lists it. Modules are imported only when their
command runs, so ``kvaudit --help`` stays fast.
"""

from __future__ import annotations

import argparse

from kvaudit.core.registry import Entry, Registry
from kvaudit.generators.registry import GENERATORS

COMMANDS: Registry[Entry] = Registry("command", (
    Entry("run", "kvaudit.stages.run",
          "run every case of a dataset under every arm (--until-decided: stop when the gate is decided)"),
    Entry("audit", "kvaudit.audit.audit_cli", "confounder audit of a run directory"),
    Entry("report", "kvaudit.reports.report_cli", "statistics, summary.json and report.html for a run"),
    Entry("gate", "kvaudit.reports.gate_cli", "CI gate: exit 0 pass, 1 fail, 2 cannot judge"),
    Entry("plan", "kvaudit.reports.plan_cli", "false-pass rate, power and cases needed for each gate threshold"),
    Entry("export", "kvaudit.reports.export_cli", "write a run as an inspect-ai eval log or lm-eval results"),
    Entry("compare", "kvaudit.reports.compare_cli", "runs side by side: compare.html and compare.json per dataset"),
    Entry("simulate", "kvaudit.simulator.simulate_cli", "prefix vs segment cache hit rates on a workload"),
    Entry("replay", "kvaudit.replay.replay_cli", "serve a workload under one cache policy and a KV budget: "
          "TTFT percentiles and hit rates beside the simulator's"),
    Entry("demo", "kvaudit.demo", "full audit of the default model and dataset, ending in an HTML report"),
), requires=("add_arguments", "run"))


def run_command(argv: list[str]) -> int:
    """Run one subcommand (``["run", "--dataset", ...]`` or ``["generate", "boxoffice", ...]``) in
    this process and return its exit code. Errors propagate (the caller's ``kvaudit.cli.main``
    turns them into exit codes); a bad option returns 2 after argparse's message."""
    name, rest = argv[0], argv[1:]
    if name == "generate":
        name, rest = rest[0], rest[1:]
        mod, prog = GENERATORS.load(name), f"kvaudit generate {name}"
    else:
        mod, prog = COMMANDS.load(name), f"kvaudit {name}"
    parser = argparse.ArgumentParser(prog=prog)
    mod.add_arguments(parser)
    try:
        args = parser.parse_args(rest)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    return int(mod.run(args) or 0)
