"""The hit-rate row (``[hit_rate]``): the arm under test's token hit rate (``measured``), its
chunk-aligned rate (``segment``), or a simulated rate from the run's ``simulation.json``
(``simulated``), which decides only when the audit binds the file to the run (and, under
``[provenance]``, the attestation signs it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvaudit.core.attestation import attestation_key, verify_attestation
from kvaudit.core.errors import DatasetError, KvauditError, cut
from kvaudit.core.run_dir import RunDir
from kvaudit.core.run_format import SIMULATION_FILE
from kvaudit.reports.gate_checks.base import (
    Check,
    Table,
    ThresholdResult,
    evaluates,
    missing_result,
    number,
    pct,
    section,
    short,
)

if TYPE_CHECKING:
    from kvaudit.reports.analysis import Analysis

# One name per quantity, as the report names it (docs/reports.md, "Hit rates").
SOURCES = {"measured": "token hit rate", "segment": "chunk-aligned hit rate", "simulated": "simulated token hit rate"}


@section("hit_rate", {"min", "source", "key", "missing"})
def parse_hit_rate(sec: dict[str, Any], t: Table) -> list[Check]:
    lo = number(t.field("min"), sec.get("min"), 0.0, 1.0)
    src = sec.get("source", "measured")
    if src not in SOURCES:
        raise KvauditError(f"{t.field('source')} must be 'measured', 'segment' or 'simulated'")
    if (src == "simulated" or "key" in sec) and not isinstance(sec.get("key"), str):
        raise KvauditError(f"{t.field('key')} must name a simulation.json entry")
    return [Check(f"{t.arm} {SOURCES[src]}", "hit_rate", {"min": lo, "source": src, "key": sec.get("key")},
                  t.missing)]


@evaluates("hit_rate")
def hit_rate_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    k, p = check.kind, check.params
    thr = f"≥ {pct(p['min'])}"
    if p["source"] in ("measured", "segment"):
        rate = an.hit_rate(arm, "segment" if p["source"] == "segment" else "prompt")
        where = f"arm '{arm}' has no token counts in pairs.jsonl"
    elif an.run.simulation is None:
        rate, where = None, f"the run has no {SIMULATION_FILE} (`kvaudit simulate --out RUN`, then `kvaudit audit`)"
    else:
        unbound = simulation_unbound(an, attested=p.get("attested", False))
        if unbound:
            return ThresholdResult(check.name, k, "error", "not bound to the run", thr, f"cannot judge: {unbound}")
        try:
            rate = an.simulated_hit_rates().get(p["key"])
        except DatasetError as e:
            return ThresholdResult(check.name, k, "error", "refused", thr, f"cannot judge: {cut(e, 300)}")
        where = f"{SIMULATION_FILE} has no entry '{short(p['key'])}'"
    if rate is None:
        return missing_result(check, "n/a", thr, where)
    return ThresholdResult(check.name, k, "pass" if rate >= p["min"] else "fail", pct(rate), thr)


def simulation_unbound(an: Analysis, *, attested: bool) -> str | None:
    """Why the run's ``simulation.json`` may not decide a gate row, or None when it may: the
    verified audit records its sha256 (``inputs.simulation.json``) and, with ``attested``, the
    run's attestation signs it. An audit or attestation written before the file was in the run (or
    before this binding existed) binds nothing."""
    files = RunDir(an.run.path)
    path, audit = files.simulation_file, an.run.audit
    rerun = f"re-run `kvaudit audit {an.run.path}`"
    if audit.state != "verified" or audit.inputs is None:
        return f"{path} is bound to the run by {files.audit_file}, which is {audit.state}: {audit.reason}"
    recorded = audit.inputs.simulation_sha256
    if recorded is None:
        return (f"{path} is not bound to the run: {files.audit_file} records no sha256 for it (field "
                f"'inputs.{SIMULATION_FILE}'; the file was added after the audit, or the audit predates "
                f"this binding): {rerun}")
    if recorded != an.run.simulation_sha256:
        return (f"{path} changed after the audit (its sha256 differs from {files.audit_file}, field "
                f"'inputs.{SIMULATION_FILE}'): {rerun}")
    if attested:
        found = verify_attestation(an.run.path, attestation_key())
        if found.state != "verified":
            return f"{path} is not signed: {found.reason}"
        if found.subject.get(SIMULATION_FILE) != an.run.simulation_sha256:
            return (f"{path} is not in the run's attestation ({files.attestation_file} signs only "
                    f"{', '.join(found.subject)}): put it in the run before `kvaudit run` signs (rerun the "
                    "same `kvaudit run` command: it resumes, runs nothing and signs again), then re-audit")
    return None
