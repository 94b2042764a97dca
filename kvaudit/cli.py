"""The single `kvaudit` command and its subcommands.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
those modules import heavy libraries (torch, transformers) only inside ``run``, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvaudit.core.errors import USER_ERRORS
from kvaudit.generators.registry import GENERATORS

# name -> (module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("kvaudit.runners.run_cli", "run every case of a dataset under every arm"),
    "audit": ("kvaudit.audit.audit_cli", "confounder audit of a run directory"),
    "report": ("kvaudit.reports.report_cli", "statistics, summary.json and report.html for a run"),
    "gate": ("kvaudit.reports.gate", "CI gate: exit 0 pass, 1 fail, 2 cannot judge"),
    "plan": ("kvaudit.reports.plan_cli", "false-pass rate, power and cases needed for each gate threshold"),
    "export": ("kvaudit.reports.export_cli", "write a run as an inspect-ai eval log or lm-eval results"),
    "compare": ("kvaudit.reports.compare_cli", "runs side by side: compare.html and compare.json per dataset"),
    "simulate": ("kvaudit.simulator.simulate_cli", "prefix vs segment cache hit rates on a workload"),
    "demo": ("kvaudit.demo", "full audit of the default model and dataset, ending in an HTML report"),
}


def _add(sub: argparse._SubParsersAction, name: str, module: str, help_: str, load: bool) -> None:
    p = sub.add_parser(name, help=help_, description=help_)
    if load:  # import only the module of the command being run: --help stays fast
        mod = importlib.import_module(module)
        p.description = (mod.__doc__ or help_).strip().splitlines()[0]
        mod.add_arguments(p)
        p.set_defaults(_module=mod)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    parser = argparse.ArgumentParser(prog="kvaudit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write a dataset or workload")
    gsub = gen.add_subparsers(dest="generator", required=True)
    for name, (module, help_) in GENERATORS.items():
        _add(gsub, name, module, help_, words[:2] == ["generate", name])
    for name, (module, help_) in COMMANDS.items():
        _add(sub, name, module, help_, words[:1] == [name])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args._module.run(args) or 0)
    except USER_ERRORS as e:
        print(f"kvaudit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvaudit: interrupted; finished cases are saved, rerun the same command to resume",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
