"""Export a run as logs other tools read (``kvaudit export RUN --format inspect|lm-eval --out PATH``).

This module parses the command line, loads the run and calls one exporter:
``--format inspect`` writes an inspect-ai eval log (:mod:`kvaudit.reports.export_inspect`; it
needs the ``inspect`` extra), ``--format lm-eval`` lm-evaluation-harness's results and samples
files under a folder (:mod:`kvaudit.reports.export_lm_eval`; it needs nothing of lm-eval). What
both share is in :mod:`kvaudit.reports.export`.
"""

from __future__ import annotations

import argparse

from kvaudit.core.arg_types import non_negative_float

FORMATS = ("inspect", "lm-eval")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run directory (manifest.json, pairs.jsonl)")
    parser.add_argument("--format", required=True, choices=FORMATS,
                        help="inspect: an inspect-ai eval log; lm-eval: lm-evaluation-harness "
                             "results_<time>.json and samples_<task>_<time>.jsonl")
    parser.add_argument("--out", required=True, metavar="PATH",
                        help="inspect: a .eval/.json file or a folder; lm-eval: a folder")
    parser.add_argument("--policy", metavar="FILE",
                        help="gate policy TOML for the arm and confidence (default: the shipped policy)")
    parser.add_argument("--near-tie", type=non_negative_float, default=1.0, metavar="LOGITS",
                        help="recompute first-token margins below this count as near ties: a finite "
                             "number, 0 or more (default 1.0)")


def run(args: argparse.Namespace) -> int:
    from kvaudit.core.errors import printable
    from kvaudit.reports.analysis import Analysis, load_run
    from kvaudit.reports.policy import load_policy

    if args.format == "inspect":
        from kvaudit.reports.export_inspect import need_inspect, write_inspect

        need_inspect()  # before reading the run: a missing extra is the first thing to say
    policy = load_policy(args.policy, args.run_dir)
    an = Analysis(load_run(args.run_dir), near_tie=args.near_tie, confidence=policy.confidence,
                  min_icc=policy.min_icc)
    if args.format == "inspect":
        path = write_inspect(an, args.out)
        print(f"wrote {printable(path)} ({len(an.run.pairs)} samples, {len(an.arms)} arms); "
              f"open it with: inspect view --log-dir {printable(path.parent)}")
    else:
        from kvaudit.reports.export_lm_eval import write_lm_eval

        paths = write_lm_eval(an, args.out)
        print(f"wrote {printable(paths[0])} and {len(paths) - 1} samples file(s) beside it")
    return 0
