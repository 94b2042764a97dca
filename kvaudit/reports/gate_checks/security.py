"""The security rows (``[security]``), for server runs with the tenant probes (docs/engines.md):
tenant isolation (another tenant's identical request is never served from the cache) and the
timing side channel (the AUC of hit against miss TTFT, its interval within [1 - max, max])."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvaudit.core.errors import KvauditError
from kvaudit.core.vocabulary import GateStatus
from kvaudit.reports.gate_checks.base import (
    Check,
    Table,
    ThresholdResult,
    evaluates,
    missing_result,
    number,
    section,
    switch,
)

if TYPE_CHECKING:
    from kvaudit.reports.analysis import Analysis


@section("security", {"require_tenant_isolation", "max_timing_auc", "missing"})
def parse_security(sec: dict[str, Any], t: Table) -> list[Check]:
    out = []
    if switch(t.field("require_tenant_isolation"), sec.get("require_tenant_isolation", False)):
        out.append(Check("tenant isolation", "tenant_isolation", {}, t.missing))
    if "max_timing_auc" in sec:
        mx = number(t.field("max_timing_auc"), sec["max_timing_auc"])
        if not 0.5 <= mx < 1:
            raise KvauditError(f"{t.field('max_timing_auc')} must be in [0.5, 1)")
        out.append(Check("timing side channel", "timing", {"max": mx}, t.missing))
    return out


@evaluates("tenant_isolation")
def isolation_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    rows = an.security["isolation"]
    if not rows:
        return missing_result(check, "no probes", "no other tenant served from the cache",
                              "the run has no tenant-probe arm (prefix_cache_other_tenant, reuse_other_tenant)")
    status: GateStatus = ("fail" if any(r["verdict"] == "fail" for r in rows) else
                          "error" if any(r["verdict"] != "pass" for r in rows) else "pass")
    obs = "; ".join(f"{r['what']}: {r['verdict'].replace('_', ' ')}" for r in rows)
    return ThresholdResult(check.name, check.kind, status, obs, "no other tenant served from the cache",
                           "; ".join(r["reason"] for r in rows))


@evaluates("timing")
def timing_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    from kvaudit.stats.timing import MIN_CASES, timing_decision

    p = check.params
    thr = f"AUC interval within [{1 - p['max']:.2f}, {p['max']:.2f}]"
    if not an.timing:
        return missing_result(check, "no probes", thr, "the run has no tenant-probe arm to time hits against")
    statuses: list[str] = []
    parts: list[str] = []
    why: list[str] = []
    for what, t in an.timing.items():
        dec = timing_decision(t, p["max"])
        statuses.append({"pass": "pass", "fail": "fail"}.get(dec, "error"))
        need = f", {t.requests_needed} request pair(s) to tell apart" if t.requests_needed else ""
        on = f"{t.n} cases in {t.batches} batches" if t.batches is not None else f"{t.n} cases"
        parts.append(f"{what}: AUC {t.auc:.3f} [{t.lower:.3f}, {t.upper:.3f}] on {on}{need}")
        if t.unjudged:
            why.append(f"cannot judge {what}: {t.unjudged}")
        elif dec == "cannot_judge":
            why.append(f"cannot judge {what}: " + (f"fewer than {MIN_CASES} {'batches' if t.batches is not None else 'cases'}"
                                                    if t.units < MIN_CASES else
                                                    "the interval straddles the threshold (more cases needed)"))
    status: GateStatus = "fail" if "fail" in statuses else "error" if "error" in statuses else "pass"
    return ThresholdResult(check.name, check.kind, status, "; ".join(parts), thr,
                           "; ".join(why) if status == "error" else "")
