"""Runs side by side: compare.html and compare.json with a row per run and arm (`kvaudit compare RUN... --out DIR`).

Every run is analysed on its own (its deltas, flips, hit rate, speed-up, gate verdict and
routing per task family, as its own report gives them); runs on different datasets go into
separate tables. See :mod:`kvaudit.reports.compare`. Exit 0 when the files are written, 2 when a
run cannot be read.
"""

from __future__ import annotations

import argparse

from kvaudit.core.arg_types import positive_seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run directories (manifest.json, pairs.jsonl), or replay directories (kvaudit replay)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="write compare.html and compare.json here (replays: replays.html and replays.json)")
    parser.add_argument("--policy", metavar="FILE",
                        help="policy TOML for the verdicts and routing margins (default: the shipped policy)")
    parser.add_argument("--slo-ttft", type=positive_seconds, default=None, metavar="SECONDS",
                        help="replay load sweeps: mark the highest offered load whose p95 TTFT stays within this")
    parser.add_argument("--arm", action="append", default=[], metavar="ARM",
                        help="arm under test, one row per run and arm (repeatable; default: the policy's arm)")


def run(args: argparse.Namespace) -> int:
    from kvaudit.core.errors import KvauditError
    from kvaudit.reports import replay_report
    from kvaudit.reports.compare import write_comparison

    replays = [r for r in args.runs if replay_report.is_replay(r)]
    if replays:  # replays side by side (kvaudit replay): replays.json and replays.html
        if len(replays) != len(args.runs):
            other = next(r for r in args.runs if r not in replays)
            raise KvauditError(f"{other}: not a replay directory; compare replays with replays and runs with runs")
        for path in replay_report.write(replays, args.out, args.slo_ttft):
            print(path)
        return 0

    json_path, html_path = write_comparison(args.runs, args.out, policy_path=args.policy,
                                            arms=args.arm or None)
    print(html_path)
    print(json_path)
    return 0
