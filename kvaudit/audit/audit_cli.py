"""`kvaudit audit RUN`: prove that only the reuse differs between the arms of a run.

Runs every check of :mod:`kvaudit.audit.checks` on a run directory, writes ``RUN/audit.json``
(bound to the hashes of the files it judged: :mod:`kvaudit.audit.trust`), prints a table, and
returns 0 when every required check passes, 1 when one fails, 2 when one cannot be judged (the
run lacks its evidence). Missing or corrupt run files raise a user error (exit 2 through the
dispatcher).

``--identity-tol`` changes the outcome of the identity and repair controls, so it is range-checked
here (NaN, an infinity, a negative value or one above
:data:`~kvaudit.audit.checks.MAX_IDENTITY_TOL` is an argparse error, exit 2), recorded in
``audit.json`` (``parameters.identity_tol``), and a value looser than the dtype's default is named
below the table: ``kvaudit gate`` shows it in its audit row and cannot pass such an audit unless
the policy allows it (``[audit] max_identity_tol``). ``--dataset`` changes only the coverage
check, which is never required.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from kvaudit.audit.checks import (
    MAX_IDENTITY_TOL,
    CheckResult,
    check_identity_tol,
    identity_tolerance,
    run_dtype,
)
from kvaudit.audit.trust import build_audit
from kvaudit.core.errors import excerpt, printable
from kvaudit.core.run_dir import RunDir


def identity_tol_arg(text: str) -> float:
    """``--identity-tol``: a number of logits in [0, MAX_IDENTITY_TOL]; anything else is an
    argparse error (exit 2) saying why."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    try:
        return check_identity_tol(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run directory written by `kvaudit run`")
    parser.add_argument("--identity-tol", type=identity_tol_arg, default=None, metavar="LOGITS",
                        help="max first-token logit difference of the identity arm vs recompute "
                             "(default: 1e-4 for float32, 1.0 for bfloat16, 0.25 for float16; at most "
                             f"{MAX_IDENTITY_TOL:g}); recorded in audit.json; `kvaudit gate` passes an audit "
                             "with a looser value than the default only where the policy allows it "
                             "([audit] max_identity_tol)")
    parser.add_argument("--dataset", metavar="DIR", default=None,
                        help="the run's dataset, for reuse-dynamics coverage (default: the path in "
                             "the manifest, when it is still there and unchanged)")


def audit(run_dir: str | Path, *, identity_tol: float | None = None,
          dataset_dir: str | Path | None = None) -> dict[str, Any]:
    """Audit ``run_dir``, write ``audit.json`` there and return its content (an out-of-range
    ``identity_tol`` is a :class:`~kvaudit.core.errors.KvauditError`: :func:`build_audit`)."""
    files = RunDir(run_dir)
    with files.lock("audit"):
        record = build_audit(run_dir, identity_tol=identity_tol, dataset_dir=dataset_dir)
        files.write_audit(record)
    return record.to_dict()


def _status(c: CheckResult | dict) -> str:
    d = c if isinstance(c, dict) else asdict(c)
    if d.get("not_applicable"):
        return "-"  # does not apply, or not run (its detail says which): never PASS
    if d.get("cannot_judge"):
        return "N/A" if d["required"] else "n/a"
    if not d["passed"]:
        return "FAIL" if d["required"] else "fail"
    return "WARN" if d["warning"] else "PASS"


def print_table(result: dict[str, Any], path: Path, out: TextIO | None = None) -> None:
    """One line per check (status, required, detail), then its warning and failing cases; text
    from the run's files (case ids in details) is printed escaped."""
    out = out or sys.stdout
    width = max(len(c["name"]) for c in result["checks"])
    print(f"{'check':<{width}}  result  required  detail", file=out)
    for c in result["checks"]:
        req = "yes" if c["required"] else "no"
        print(f"{c['name']:<{width}}  {_status(c):<6}  {req:<8}  {printable(c['detail'])}", file=out)
        pad = " " * (width + 2)
        if c["warning"]:
            print(f"{pad}warning: {printable(c['warning'])}", file=out)
        if c["failing_cases"]:
            shown = ", ".join(excerpt(str(case)) for case in c["failing_cases"][:10])
            more = f" (+{len(c['failing_cases']) - 10} more)" if len(c["failing_cases"]) > 10 else ""
            print(f"{pad}failing cases: {shown}{more}", file=out)
    failed = [c["name"] for c in result["checks"] if c["required"] and not c["passed"]]
    n_warn = sum(1 for c in result["checks"] if c["warning"])
    verdict = {"passed": "PASSED", "failed": f"FAILED ({', '.join(failed)})",
               "cannot_judge": f"CANNOT JUDGE ({', '.join(failed)})"}[result["verdict"]]
    print(f"\naudit {verdict}; {n_warn} warning(s); written to {printable(RunDir(path).audit_file)}", file=out)


def loosened_note(run_dir: str | Path, identity_tol: float | None) -> str | None:
    """A sentence when ``identity_tol`` is looser than the run's dtype default, else None."""
    if identity_tol is None:
        return None
    dtype = run_dtype(RunDir(run_dir).read_manifest())
    default, _ = identity_tolerance(dtype)
    if identity_tol <= default:
        return None
    return (f"note: --identity-tol {identity_tol:g} is looser than the {printable(dtype or 'unknown dtype')} "
            f"default {default:g}; `kvaudit gate` cannot pass this audit unless the policy allows it "
            f"([audit] max_identity_tol = {identity_tol:g} or more)")


def run(args: argparse.Namespace) -> int:
    result = audit(args.run_dir, identity_tol=args.identity_tol, dataset_dir=args.dataset)
    print_table(result, Path(args.run_dir))
    note = loosened_note(args.run_dir, args.identity_tol)
    if note:
        print(note)
    return {"passed": 0, "failed": 1, "cannot_judge": 2}[result["verdict"]]
