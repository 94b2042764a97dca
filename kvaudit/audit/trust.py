"""The audit's chain of trust: ``audit.json`` binds its verdict to the exact files it judged.

``kvaudit audit RUN`` writes an :class:`~kvaudit.core.audit_format.AuditRecord` (format
:data:`~kvaudit.core.audit_format.AUDIT_FORMAT`: the sha256 of ``pairs.jsonl`` and ``manifest.json``,
the dataset's content hash, the sha256 of ``simulation.json`` when the run has one, the
parameters, the verdict and the checks; see :mod:`kvaudit.core.audit_format`).

:func:`verify` is what every reader that acts on the audit (the gate, the report) calls. It
refuses an ``audit.json`` that is missing, of another format or kvaudit version, malformed, or
whose recorded hashes no longer match the run's files (the run was resumed, extended or edited
after its audit), and then reruns the checks with the recorded parameters: the verdict it
returns is derived from those fresh checks, never read from the file, and a file whose
recorded checks disagree with the fresh ones (hand-written or edited) is refused too, and so is
one whose recorded ``--identity-tol`` is out of range (:func:`~kvaudit.audit.checks.check_identity_tol`).
A caller that has read the run already passes its manifest and pairs, so they are not parsed twice.

``simulation.json`` is not judged by the audit: its recorded sha256 only binds it to the run, and
the gate's simulated hit-rate row checks it (:class:`VerifiedAudit` carries the recorded inputs
and parameters for that, and for the gate's audit row to show the tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.audit.checks import (
    CheckResult,
    LoadedRun,
    check_identity_tol,
    load_for_audit,
    run_checks,
)
from kvaudit.core.audit_format import (
    AUDIT_FORMAT,
    VERDICTS,
    AuditInputs,
    AuditParameters,
    AuditRecord,
)
from kvaudit.core.errors import USER_ERRORS, KvauditError
from kvaudit.core.jsonio import file_sha256
from kvaudit.core.manifest import Manifest, RunFileError
from kvaudit.core.run_dir import RunDir
from kvaudit.core.run_format import MANIFEST_FILE, PAIRS_FILE, SIMULATION_FILE, PairRecord
from kvaudit.core.vocabulary import AuditVerdict

__all__ = ["AUDIT_FORMAT", "VERDICTS", "VerifiedAudit", "build_audit", "file_sha256", "verdict_of", "verify"]


def verdict_of(checks: list[CheckResult]) -> AuditVerdict:
    """``failed`` if a required check failed, else ``cannot_judge`` if one lacked its evidence,
    else ``passed``."""
    required = [c for c in checks if c.required]
    if any(not c.passed and not c.cannot_judge for c in required):
        return "failed"
    if any(c.cannot_judge for c in required):
        return "cannot_judge"
    return "passed"


def _kvaudit_version() -> str:
    from kvaudit import __version__

    return __version__


def _audit_of(run: LoadedRun, identity_tol: float | None, dataset_dir: str | Path | None,
              hashes: dict[str, str]) -> AuditRecord:
    checks = run_checks(run, identity_tol)
    verdict = verdict_of(checks)
    return AuditRecord(
        kvaudit_version=_kvaudit_version(),
        inputs=AuditInputs(pairs_sha256=hashes[PAIRS_FILE], manifest_sha256=hashes[MANIFEST_FILE],
                           dataset=run.dataset.card.content_hash if run.dataset is not None else None,
                           simulation_sha256=hashes.get(SIMULATION_FILE)),
        parameters=AuditParameters(identity_tol=identity_tol,
                                   dataset_dir=None if dataset_dir is None else str(dataset_dir)),
        verdict=verdict, passed=verdict == "passed", checks=checks)


def build_audit(run_dir: str | Path, *, identity_tol: float | None = None,
                dataset_dir: str | Path | None = None) -> AuditRecord:
    """Run every check on ``run_dir`` and return its :class:`AuditRecord` (not written: see
    :func:`kvaudit.core.audit_format.write_audit`)."""
    if identity_tol is not None:
        try:
            check_identity_tol(identity_tol)
        except ValueError as e:
            raise KvauditError(f"--identity-tol {e}") from None
    run = load_for_audit(run_dir, dataset_dir)
    files = run.files
    hashes = {PAIRS_FILE: file_sha256(files.pairs_file), MANIFEST_FILE: file_sha256(files.manifest_file)}
    if files.simulation_file.is_file():
        hashes[SIMULATION_FILE] = file_sha256(files.simulation_file)
    return _audit_of(run, identity_tol, dataset_dir, hashes)


@dataclass
class VerifiedAudit:
    """The state of a run's audit: ``state`` is ``verified`` (``verdict`` and ``checks`` are the
    fresh ones), ``missing``, or ``refused`` (``reason`` says why: stale, foreign, hand-written).
    ``run`` is the run as the fresh audit read it, ``inputs`` and ``parameters`` what
    ``audit.json`` records (``None`` unless verified)."""

    state: str
    reason: str = ""
    verdict: str | None = None
    checks: list[CheckResult] = field(default_factory=list)
    run: LoadedRun | None = field(default=None, repr=False, compare=False)
    inputs: AuditInputs | None = None
    parameters: AuditParameters | None = None

    @property
    def passed(self) -> bool | None:
        return None if self.verdict is None else self.verdict == "passed"


def _summary(checks: list[CheckResult]) -> list[tuple[Any, Any, Any, Any]]:
    return [(c.name, c.passed, c.required, c.cannot_judge, c.not_applicable) for c in checks]


def verify(run_dir: str | Path, *, manifest: Manifest | None = None,
           pairs: list[PairRecord] | None = None) -> VerifiedAudit:
    """Check ``RUN/audit.json`` against the run's files and a fresh audit (see module docstring).

    ``manifest`` and ``pairs`` are the run's files as the caller read them (with
    :class:`~kvaudit.core.run_dir.RunDir`);
    without them the fresh audit reads them itself.
    """
    files = RunDir(run_dir)
    path, file = files.path, files.audit_file
    if not file.exists():
        return VerifiedAudit("missing", f"{file} is missing: run `kvaudit audit {path}` first")
    rerun = f"rerun `kvaudit audit {path}`"
    try:
        recorded = files.read_audit()
    except RunFileError as e:
        return VerifiedAudit("refused", f"{e}: {rerun}")
    if recorded.kvaudit_version != _kvaudit_version():
        return VerifiedAudit("refused", f"{file}: written by kvaudit {recorded.kvaudit_version!r}, "
                                        f"this is {_kvaudit_version()} (field 'kvaudit_version'): {rerun}")
    hashes: dict[str, str] = {}
    for name, at, want in ((PAIRS_FILE, files.pairs_file, recorded.inputs.pairs_sha256),
                           (MANIFEST_FILE, files.manifest_file, recorded.inputs.manifest_sha256)):
        if not at.is_file():
            return VerifiedAudit("refused", f"{at} is missing")
        hashes[name] = file_sha256(at)
        if want != hashes[name]:
            return VerifiedAudit("refused", f"{at} changed after the audit (its sha256 differs "
                                            f"from {file}, field 'inputs.{name}'): the audit is stale; {rerun}")
    params = recorded.parameters
    if params.identity_tol is not None:
        try:
            check_identity_tol(params.identity_tol)
        except ValueError as e:
            return VerifiedAudit("refused", f"{file}: field 'parameters.identity_tol' {e}: {rerun}")
    try:
        run = load_for_audit(path, params.dataset_dir, manifest=manifest, pairs=pairs)
        fresh = _audit_of(run, params.identity_tol, params.dataset_dir, hashes)
    except (*USER_ERRORS, OSError) as e:
        return VerifiedAudit("refused", f"the audit cannot be re-checked: {e}")
    # A dataset the audit read that is no longer on disk (a run directory copied elsewhere) only
    # changes the non-required coverage check; a dataset that is there must be the same one.
    if fresh.inputs.dataset is not None and fresh.inputs.dataset != recorded.inputs.dataset:
        return VerifiedAudit("refused", f"the run's dataset changed after the audit (content hash differs "
                                        f"from {file}, field 'inputs.dataset'): {rerun}")
    if _summary(recorded.checks) != _summary(fresh.checks) \
            or recorded.verdict != fresh.verdict or recorded.passed != fresh.passed:
        return VerifiedAudit("refused", f"{file} does not match a fresh audit of the same files "
                                        f"(edited or hand-written): {rerun}")
    return VerifiedAudit("verified", "", fresh.verdict, list(fresh.checks), run=run, inputs=recorded.inputs,
                         parameters=params)
