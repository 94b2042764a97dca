"""Write summary.json, report.html and samples.jsonl for a run directory (`kvaudit report RUN`).

Other commands (the demo) call :func:`write_report` directly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvaudit.core.arg_types import non_negative_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run directory (manifest.json, pairs.jsonl, audit.json)")
    parser.add_argument("--policy", metavar="FILE", help="gate policy TOML (default: the shipped policy)")
    parser.add_argument("--near-tie", type=float, default=1.0, metavar="LOGITS",
                        help="recompute first-token margins below this count as near ties (default 1.0)")
    parser.add_argument("--max-cases", type=non_negative_int, default=2000, metavar="N",
                        help="cases shown in the drill-down, flips first (default 2000)")
    parser.add_argument("--compare", action="append", default=[], metavar="OTHER_RUN",
                        help="a run of the same dataset on another backend: adds a cross-backend "
                             "agreement table (repeatable)")


def write_report(run_dir: str | Path, *, policy_path: str | Path | None = None, near_tie: float = 1.0,
                 max_cases: int = 2000, compare: list[str | Path] = ()) -> Path:
    """Write the three report files into ``run_dir``; return the path of ``report.html``.

    ``compare``: runs of the same dataset on other backends, for the cross-backend table.
    """
    from kvaudit.core.run_dir import RunDir
    from kvaudit.reports import html
    from kvaudit.reports.analysis import Analysis, load_run
    from kvaudit.reports.cross_backend import compare_runs
    from kvaudit.reports.export import sample_rows
    from kvaudit.reports.policy import load_policy
    from kvaudit.reports.summary import build_summary

    policy = load_policy(policy_path)
    with RunDir(run_dir).lock("report"):
        run = load_run(run_dir)
        an = Analysis(run, near_tie=near_tie, confidence=policy.confidence, min_icc=policy.min_icc)
        summary = build_summary(an, policy)
        summary["cross_backend"] = [compare_runs(run, load_run(other)) for other in compare]
        files = RunDir(run.path)
        files.write_summary(summary)
        files.write_samples(sample_rows(an))
        return files.write_report(html.render(summary, an, policy, max_cases=max_cases))


def run(args: argparse.Namespace) -> int:
    path = write_report(args.run_dir, policy_path=args.policy, near_tie=args.near_tie,
                        max_cases=args.max_cases, compare=args.compare)
    print(path)
    return 0
