"""Write summary.json, report.html and samples.jsonl for a run directory (`kvaudit report RUN`).

This module parses the command line and calls :func:`kvaudit.reports.report.write_report`, which
writes the files; other code calls that function directly.
"""

from __future__ import annotations

import argparse

from kvaudit.core.arg_types import non_negative_float, non_negative_int
from kvaudit.reports.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run directory (manifest.json, pairs.jsonl, audit.json)")
    parser.add_argument("--policy", metavar="FILE", help="gate policy TOML (default: the shipped policy)")
    parser.add_argument("--near-tie", type=non_negative_float, default=1.0, metavar="LOGITS",
                        help="recompute first-token margins below this count as near ties: a finite "
                             "number, 0 or more (default 1.0)")
    parser.add_argument("--max-cases", type=non_negative_int, default=2000, metavar="N",
                        help="cases shown in the drill-down, flips first (default 2000)")
    parser.add_argument("--compare", action="append", default=[], metavar="OTHER_RUN",
                        help="a run of the same dataset on another backend: adds a cross-backend "
                             "agreement table (repeatable)")


def run(args: argparse.Namespace) -> int:
    from kvaudit.reports import replay_report

    if replay_report.is_replay(args.run_dir):  # a replay directory: its page beside its replay.json
        from kvaudit.core.replay_format import ReplayDir

        with ReplayDir(args.run_dir).lock("report"):
            _, path = replay_report.write([args.run_dir], args.run_dir)
        print(path)
        return 0
    path = write_report(args.run_dir, policy_path=args.policy, near_tie=args.near_tie,
                        max_cases=args.max_cases, compare=args.compare)
    print(path)
    return 0
