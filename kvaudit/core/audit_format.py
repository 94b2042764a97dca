"""The typed record of a run's ``audit.json`` (:class:`AuditRecord`) and its one reader/writer pair.

``kvaudit audit RUN`` writes it (format :data:`AUDIT_FORMAT`)::

    {"format": 2, "kvaudit_version": "...",
     "inputs": {"pairs.jsonl": sha256, "manifest.json": sha256, "dataset": content hash or null,
                "simulation.json": sha256 or null},
     "parameters": {"identity_tol": float or null, "dataset_dir": str or null},
     "verdict": "passed" | "failed" | "cannot_judge", "passed": bool, "checks": [...]}

:func:`read_audit` checks the ``format`` first (a record of another format is refused as such),
then every field's type; a malformed file raises
:class:`~kvaudit.core.manifest.RunFileError` naming the file and the field. What the record
*means* (whether its hashes still match the run's files and its checks a fresh audit) is for
:func:`kvaudit.audit.trust.verify` to say; this module only reads and writes it. Keys the format
does not define are ignored (the record is re-derived from the run whenever it is read).

``inputs["simulation.json"]`` binds the cache simulator's results in the run (which decide the
gate's ``[hit_rate] source = "simulated"`` row) to the run: null when the run had none at audit
time; an audit written before this field existed reads as null (the row then cannot judge until
the run is audited again). ``parameters.identity_tol`` is the ``--identity-tol`` override (null:
the dtype's default); the gate shows it and refuses a loosened one the policy does not allow.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.core.errors import excerpt
from kvaudit.core.jsonio import write_json
from kvaudit.core.manifest import RunFileError, read_record
from kvaudit.core.run_format import AUDIT_FILE, MANIFEST_FILE, PAIRS_FILE, SIMULATION_FILE
from kvaudit.core.typed_json import record_from_json
from kvaudit.core.vocabulary import AuditVerdict, words

AUDIT_FORMAT = 2
VERDICTS = words(AuditVerdict)


@dataclass
class CheckResult:
    """One audit check's outcome (the checks themselves live in :mod:`kvaudit.audit.checks`)."""

    name: str
    passed: bool
    required: bool
    detail: str
    failing_cases: list[str] = field(default_factory=list)
    warning: str | None = None
    cannot_judge: bool = False  # the run lacks the evidence this check needs (never a pass)
    # The check is about something this run is not (a reuse check on a serving-change run, or the
    # reverse): shown as "does not apply", never as "pass"; it neither passes nor fails the audit.
    not_applicable: bool = False


@dataclass
class AuditInputs:
    """The sha256 of the two run files the audit judged, the content hash of the dataset it
    read (``None``: none was found) and the sha256 of the run's ``simulation.json`` (``None``:
    the run had none), which the audit binds to the run for the gate."""

    pairs_sha256: str = field(metadata={"json": PAIRS_FILE})
    manifest_sha256: str = field(metadata={"json": MANIFEST_FILE})
    dataset: str | None = None
    simulation_sha256: str | None = field(default=None, metadata={"json": SIMULATION_FILE})

    def to_dict(self) -> dict[str, Any]:
        return {PAIRS_FILE: self.pairs_sha256, MANIFEST_FILE: self.manifest_sha256, "dataset": self.dataset,
                SIMULATION_FILE: self.simulation_sha256}


@dataclass
class AuditParameters:
    """What the audit was run with (a fresh audit reruns with the same)."""

    identity_tol: float | None = None
    dataset_dir: str | None = None


@dataclass
class AuditRecord:
    """``audit.json``: the verdict, the checks and what they were computed from."""

    kvaudit_version: str
    inputs: AuditInputs
    parameters: AuditParameters
    verdict: AuditVerdict
    passed: bool
    checks: list[CheckResult] = field(default_factory=list)
    format: int = AUDIT_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "kvaudit_version": self.kvaudit_version,
                "inputs": self.inputs.to_dict(), "parameters": asdict(self.parameters),
                "verdict": self.verdict, "passed": self.passed, "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, obj: Any, file: str | os.PathLike = AUDIT_FILE) -> AuditRecord:
        """Validate a parsed ``audit.json`` (errors name ``file`` and the field)."""
        if not isinstance(obj, dict) or obj.get("format") != AUDIT_FORMAT:
            got = obj.get("format") if isinstance(obj, dict) else None
            raise RunFileError(f"{file}: not an audit of format {AUDIT_FORMAT} (field 'format' is "
                               f"{excerpt(repr(got), 60)}); it was not written by this kvaudit")
        return record_from_json(obj, cls, str(file), error=RunFileError)


def read_audit(run_dir: str | os.PathLike) -> AuditRecord:
    """``RUN/audit.json`` as an :class:`AuditRecord`; a :class:`RunFileError` naming the file
    (and the field) when it is missing, not JSON, of another format or malformed."""
    return read_record(Path(run_dir) / AUDIT_FILE, AuditRecord.from_dict)


def write_audit(run_dir: str | os.PathLike, record: AuditRecord) -> None:
    """Write ``RUN/audit.json`` atomically."""
    write_json(Path(run_dir) / AUDIT_FILE, record.to_dict())

