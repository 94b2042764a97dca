"""The audit row (``[audit]``): the fresh verdict of a verified confounder audit, with the
identity tolerance it used. An audit run with a tolerance looser than the run's dtype default
cannot pass unless ``max_identity_tol`` allows it; required checks without their evidence pass
only where ``accept_cannot_judge`` names them; a failed check is never accepted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvaudit.core.errors import KvauditError
from kvaudit.reports.gate_checks.base import (
    Check,
    Table,
    ThresholdResult,
    evaluates,
    missing_result,
    number,
    section,
    short,
    switch,
)

if TYPE_CHECKING:
    from kvaudit.reports.analysis import Analysis


@section("audit", {"require_passed", "accept_cannot_judge", "max_identity_tol", "missing"})
def parse_audit(sec: dict[str, Any], t: Table) -> list[Check]:
    max_tol = sec.get("max_identity_tol")
    if max_tol is not None:
        from kvaudit.audit.checks import MAX_IDENTITY_TOL

        max_tol = number(f"{t.field('max_identity_tol')} (logits)", max_tol, 0.0, MAX_IDENTITY_TOL)
    if not switch(t.field("require_passed"), sec.get("require_passed", True)):
        return []
    return [Check("audit passed", "audit",
                  {"accept": _accepted_unjudged(t, sec.get("accept_cannot_judge", [])), "max_identity_tol": max_tol},
                  t.missing)]


def _accepted_unjudged(t: Table, v: Any) -> list[str]:
    """``audit.accept_cannot_judge``: required audit checks a team accepts without their evidence
    (a server that cannot show it, e.g. ``server_consumed_ids`` on llama.cpp), each a check name."""
    from kvaudit.audit.checks import registered

    where = t.field("accept_cannot_judge")
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise KvauditError(f"{where} must be a list of audit check names")
    known = {c.name for c in registered()}
    unknown = [x for x in v if x not in known]
    if unknown:
        raise KvauditError(f"{where}: no audit check named {', '.join(map(repr, unknown))} "
                           f"(checks: {', '.join(sorted(known))})")
    return list(v)


def _tolerance(an: Analysis, max_tol: float | None) -> tuple[str, str | None, float]:
    """The identity tolerance the verified audit used, as ``(sentence, why it is not accepted or
    None, the loosest accepted)``: an ``--identity-tol`` looser than the run's dtype default is
    accepted only up to the policy's ``[audit] max_identity_tol``."""
    from kvaudit.audit.checks import identity_tolerance, run_dtype

    dtype = run_dtype(an.run.manifest)
    default, _ = identity_tolerance(dtype)
    named = f"the {short(dtype, 20)} default" if dtype else "the default for an unknown dtype"
    allowed = max(default, max_tol) if max_tol is not None else default
    params = an.run.audit.parameters
    used = params.identity_tol if params is not None else None
    if used is None:
        return f"identity tolerance {default:g} ({named})", None, allowed
    text = f"identity tolerance {used:g} (--identity-tol; {named} is {default:g})"
    if used <= allowed:
        return text, None, allowed
    why = (f"the audit ran with --identity-tol {used:g}, looser than {named} {default:g}"
           + (f" and than the policy's [audit] max_identity_tol {max_tol:g}" if max_tol is not None else
              ", and the policy does not allow a looser tolerance ([audit] max_identity_tol)")
           + f": re-run `kvaudit audit {an.run.path}` without --identity-tol (or raise max_identity_tol "
             "in the policy, if the looser tolerance is intended)")
    return text, why, allowed


@evaluates("audit")
def audit_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    k, p = check.kind, check.params
    audit = an.run.audit
    if audit.state == "missing":
        return missing_result(check, "not run", "passed", audit.reason)
    if audit.state != "verified":
        return ThresholdResult(check.name, k, "error", "refused", "passed", audit.reason)
    tol, loosened, allowed = _tolerance(an, p.get("max_identity_tol"))
    thr = f"passed, identity tolerance ≤ {allowed:g}"
    required = [c for c in audit.checks if c.required]
    unjudged = [c.name for c in required if c.cannot_judge]
    failed = [c.name for c in required if not c.passed and not c.cannot_judge]
    if audit.verdict == "failed":  # a looser tolerance only passes more: this fails at the default too
        return ThresholdResult(check.name, k, "fail", "failed", thr, f"failed checks: {', '.join(failed)}; {tol}")
    waived = [n for n in unjudged if n in p.get("accept", ())]
    if audit.verdict == "cannot_judge" and waived != unjudged:
        return ThresholdResult(check.name, k, "error", "cannot judge", thr,
                               f"checks without their evidence: {', '.join(unjudged)}; {tol}")
    observed = "passed" if audit.verdict == "passed" else "passed except accepted unjudged"
    if loosened:
        return ThresholdResult(check.name, k, "error", f"{observed} at a loosened tolerance", thr,
                               f"cannot judge: {loosened}")
    detail = f"verified against the run's files; {tol}"
    if waived:
        detail += "; the policy accepts without their evidence: " + ", ".join(waived)
    return ThresholdResult(check.name, k, "pass", observed, thr, detail)
