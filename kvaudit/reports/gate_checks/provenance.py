"""The provenance row (``[provenance]``): the run's ``attestation.json`` verifies under
``KVAUDIT_ATTESTATION_KEY`` (docs/audit.md, "Provenance"); missing or broken: cannot judge, never
skipped. Under it, a simulated hit rate must be signed too (:func:`kvaudit.reports.policy.parse_policy`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvaudit.core.attestation import attestation_key, verify_attestation
from kvaudit.core.vocabulary import GateStatus
from kvaudit.reports.gate_checks.base import (
    Check,
    Table,
    ThresholdResult,
    evaluates,
    section,
    switch,
)

if TYPE_CHECKING:
    from kvaudit.reports.analysis import Analysis


@section("provenance", {"require_attestation"})
def parse_provenance(sec: dict[str, Any], t: Table) -> list[Check]:
    if not switch(t.field("require_attestation"), sec.get("require_attestation", False)):
        return []
    return [Check("run attested by kvaudit run", "provenance", {}, "error")]


@evaluates("provenance")
def provenance_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    found = verify_attestation(an.run.path, attestation_key())
    status: GateStatus = "pass" if found.state == "verified" else "error"
    return ThresholdResult(check.name, check.kind, status, found.state.replace("_", " "), "verified",
                           found.reason if status == "pass" else f"cannot judge: {found.reason}")
