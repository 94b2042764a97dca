"""Write a run's report files: ``summary.json``, ``samples.jsonl`` and ``report.html``.

:func:`write_report` analyses the run under a policy and writes the three files through
:class:`kvaudit.core.run_dir.RunDir`, holding the run directory's lock while it reads and writes.
``kvaudit report`` (:mod:`kvaudit.reports.report_cli`) calls it, and so can other code.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def write_report(run_dir: str | Path, *, policy_path: str | Path | None = None, near_tie: float = 1.0,
                 max_cases: int = 2000, compare: Sequence[str | Path] = ()) -> Path:
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

    policy = load_policy(policy_path, run_dir)
    with RunDir(run_dir).lock("report"):
        run = load_run(run_dir)
        an = Analysis(run, near_tie=near_tie, confidence=policy.confidence, min_icc=policy.min_icc)
        summary = build_summary(an, policy)
        summary["cross_backend"] = [compare_runs(run, load_run(other)) for other in compare]
        page = html.render(summary, an, policy, max_cases=max_cases)  # everything before the first write
        return RunDir(run.path).write_report(summary, sample_rows(an), page)
