"""The CI gate's logic: judge a run against a policy; the verdict as Markdown and JUnit XML.

:func:`judge` loads the policy and the run and evaluates every threshold, with a
:func:`completeness` row first for a run that lacks cases; it never raises for bad user input
(a missing or corrupt run, a bad policy: its ``error`` says why). The verdict is ``pass``,
``fail`` (some threshold fails, also when other rows could not be judged) or ``error``: cannot
judge (the audit not run, stale, foreign or hand-written, or run with a loosened identity
tolerance the policy does not allow; a threshold without data or with too few documents to
decide; a ``simulation.json`` the audit and attestation do not bind; the noise floor failing a
threshold; missing cases unless they are allowed; no quality threshold decided, whatever else
passed). :func:`markdown` is the summary (fit for a CI job summary);
:func:`junit_xml` has one test case per threshold, so CI systems list each threshold as a test.
The command, ``kvaudit gate``, with its exit status, is :mod:`kvaudit.reports.gate_cli`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from kvaudit.core.vocabulary import Verdict
from kvaudit.reports.gate_checks import ThresholdResult

# What CI acts on (the exit codes every kvaudit command keeps): 0 pass, 1 a failed verdict, 2 anything else.
EXIT: dict[Verdict, int] = {"pass": 0, "fail": 1, "error": 2}

_ICON = {"pass": "✅ pass", "fail": "❌ fail", "error": "⚠️ cannot judge", "skip": "⏭ skip"}
_TITLE = {"pass": "✅ PASS", "fail": "❌ FAIL", "error": "⚠️ CANNOT JUDGE"}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(verdict: str, results: list, *, run_dir: str, policy: str, arm: str | None,
             error: str | None = None) -> str:
    lines = [f"## kvaudit gate: {_TITLE[verdict]}", "",
             f"Run `{run_dir}` · policy `{policy}`" + (f" · arm `{arm}`" if arm else ""), ""]
    if error:
        lines += [f"**Cannot judge this run:** {_cell(error)}", ""]
    if results:
        lines += ["| threshold | result | observed | required | detail |", "|---|---|---|---|---|"]
        lines += [f"| {_cell(r.name)} | {_ICON[r.status]} | {_cell(r.observed)} | {_cell(r.threshold)} | "
                  f"{_cell(r.detail)} |" for r in results]
        lines.append("")
    return "\n".join(lines)


def junit_xml(results: list, *, run_dir: str, policy: str, error: str | None = None) -> str:
    count = lambda s: sum(r.status == s for r in results)  # noqa: E731
    errors = count("error") + (1 if error else 0)
    tests = len(results) + (1 if error else 0)
    attrs = {"name": "kvaudit gate", "tests": str(tests), "failures": str(count("fail")),
             "errors": str(errors), "skipped": str(count("skip"))}
    root = ET.Element("testsuites", attrs)
    suite = ET.SubElement(root, "testsuite", {**attrs, "time": "0"})
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", {"name": "run", "value": run_dir})
    ET.SubElement(props, "property", {"name": "policy", "value": policy})
    if error:
        case = ET.SubElement(suite, "testcase", {"classname": "kvaudit.gate", "name": "load run", "time": "0"})
        ET.SubElement(case, "error", {"message": error, "type": "cannot-judge"}).text = error
    for r in results:
        case = ET.SubElement(suite, "testcase", {"classname": "kvaudit.gate", "name": r.name, "time": "0"})
        message = f"observed {r.observed}; required {r.threshold}"
        if r.status == "fail":
            ET.SubElement(case, "failure", {"message": message, "type": "threshold"}).text = r.detail or message
        elif r.status == "error":
            ET.SubElement(case, "error", {"message": r.detail or message, "type": "cannot-judge"}).text = r.detail
        elif r.status == "skip":
            ET.SubElement(case, "skipped", {"message": r.detail or "no data"})
        ET.SubElement(case, "system-out").text = f"{message}. {r.detail}".strip()
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def completeness(run, *, allow_partial: bool):
    """A gate row for a run that lacks cases: cannot judge, or pass with the cases named."""
    if not run.missing_cases:
        return None
    n = run.n_expected - len(run.pairs) if run.n_expected else len(run.missing_cases)
    shown = ", ".join(run.missing_cases[:10]) + (" ..." if len(run.missing_cases) > 10 else "")
    observed = f"{len(run.pairs)} of {run.n_expected} cases"
    if allow_partial:
        return ThresholdResult("run complete", "completeness", "pass", observed, "all cases (--allow-partial)",
                               f"judged on the finished cases only; {n} missing: {shown}")
    return ThresholdResult("run complete", "completeness", "error", observed, "all cases",
                           f"{n} case(s) missing ({shown}): finish the run (rerun `kvaudit run`) or pass "
                       "--allow-partial")


@dataclass(frozen=True)
class GateVerdict:
    """The gate's judgement of one run: the ``verdict``, its rows (``results``), the policy file it
    used, the arm it judged (None when the policy or run could not be read) and, for a verdict of
    error that no row explains (a bad policy, an unreadable run), the ``error`` saying why."""

    verdict: Verdict
    results: list[ThresholdResult]
    policy_source: str
    arm: str | None
    error: str | None = None

    @property
    def exit_code(self) -> int:
        """What CI acts on: 0 pass, 1 fail, 2 cannot judge."""
        return EXIT[self.verdict]


def judge(run_dir: str | Path, policy_path: str | Path | None = None, *, allow_partial: bool = False) -> GateVerdict:
    """The gate's :class:`GateVerdict` on a run; never raises for bad user input (a bad policy, an
    unreadable or malformed run: ``error`` says why)."""
    from kvaudit.core.errors import USER_ERRORS, cut, os_error_message
    from kvaudit.reports.analysis import Analysis, load_run
    from kvaudit.reports.policy import default_policy, evaluate, load_policy, verdict

    source = str(policy_path or default_policy(run_dir))
    try:
        policy = load_policy(policy_path, run_dir)
        run = load_run(run_dir)
        results = evaluate(policy, Analysis(run, confidence=policy.confidence, min_icc=policy.min_icc))
        row = completeness(run, allow_partial=allow_partial)
        results = ([row] if row else []) + results
    except USER_ERRORS as e:
        return GateVerdict("error", [], source, None, cut(e))
    except OSError as e:  # a run file that is a directory, unreadable, ...
        return GateVerdict("error", [], source, None, os_error_message(e))
    return GateVerdict(verdict(results), results, policy.source, policy.arm)
