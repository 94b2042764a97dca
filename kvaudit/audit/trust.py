"""The audit's chain of trust: ``audit.json`` binds its verdict to the exact files it judged.

``kvaudit audit RUN`` writes (format :data:`AUDIT_FORMAT`)::

    {"format": 2, "kvaudit_version": "...",
     "inputs": {"pairs.jsonl": sha256, "manifest.json": sha256, "dataset": content hash or null},
     "parameters": {"identity_tol": float or null, "dataset_dir": str or null},
     "verdict": "passed" | "failed" | "cannot_judge", "passed": bool, "checks": [...]}

:func:`verify` is what every reader that acts on the audit (the gate, the report) calls. It
refuses an ``audit.json`` that is missing, of another format or kvaudit version, or whose
recorded hashes no longer match the run's files (the run was resumed, extended or edited
after its audit), and then reruns the checks with the recorded parameters: the verdict it
returns is derived from those fresh checks, never read from the file, and a file whose
recorded checks disagree with the fresh ones (hand-written or edited) is refused too.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.audit.checks import CheckResult, load_run, run_checks
from kvaudit.core.errors import USER_ERRORS
from kvaudit.core.records import AUDIT_FILE, MANIFEST_FILE, PAIRS_FILE, DatasetError, read_json

AUDIT_FORMAT = 2
VERDICTS = ("passed", "failed", "cannot_judge")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verdict_of(checks: list[CheckResult]) -> str:
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


def build_audit(run_dir: str | Path, *, identity_tol: float | None = None,
                dataset_dir: str | Path | None = None) -> dict[str, Any]:
    """Run every check on ``run_dir`` and return the ``audit.json`` content (not written)."""
    run = load_run(run_dir, dataset_dir)
    checks = run_checks(run, identity_tol)
    verdict = verdict_of(checks)
    return {
        "format": AUDIT_FORMAT,
        "kvaudit_version": _kvaudit_version(),
        "inputs": {PAIRS_FILE: file_sha256(run.path / PAIRS_FILE),
                   MANIFEST_FILE: file_sha256(run.path / MANIFEST_FILE),
                   "dataset": run.dataset.card.content_hash if run.dataset is not None else None},
        "parameters": {"identity_tol": identity_tol,
                       "dataset_dir": None if dataset_dir is None else str(dataset_dir)},
        "verdict": verdict,
        "passed": verdict == "passed",
        "checks": [asdict(c) for c in checks],
    }


@dataclass
class VerifiedAudit:
    """The state of a run's audit: ``state`` is ``verified`` (``verdict`` and ``checks`` are the
    fresh ones), ``missing``, or ``refused`` (``reason`` says why: stale, foreign, hand-written)."""

    state: str
    reason: str = ""
    verdict: str | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool | None:
        return None if self.verdict is None else self.verdict == "passed"


def _summary(checks: list[dict[str, Any]]) -> list[tuple[Any, Any, Any, Any]]:
    return [(c.get("name"), c.get("passed"), c.get("required"), c.get("cannot_judge", False))
            for c in checks if isinstance(c, dict)]


def verify(run_dir: str | Path) -> VerifiedAudit:
    """Check ``RUN/audit.json`` against the run's files and a fresh audit (see module docstring)."""
    path = Path(run_dir)
    file = path / AUDIT_FILE
    if not file.exists():
        return VerifiedAudit("missing", f"{file} is missing: run `kvaudit audit {path}` first")
    rerun = f"rerun `kvaudit audit {path}`"
    try:
        recorded = read_json(file)
    except DatasetError as e:
        return VerifiedAudit("refused", f"{e}; {rerun}")
    if not isinstance(recorded, dict) or recorded.get("format") != AUDIT_FORMAT:
        return VerifiedAudit("refused", f"{file}: not an audit of format {AUDIT_FORMAT} (field 'format'); "
                                        f"it was not written by this kvaudit: {rerun}")
    if recorded.get("kvaudit_version") != _kvaudit_version():
        return VerifiedAudit("refused", f"{file}: written by kvaudit {recorded.get('kvaudit_version')!r}, "
                                        f"this is {_kvaudit_version()} (field 'kvaudit_version'): {rerun}")
    inputs = recorded.get("inputs")
    params = recorded.get("parameters")
    if not isinstance(inputs, dict) or not isinstance(params, dict):
        return VerifiedAudit("refused", f"{file}: fields 'inputs' and 'parameters' must be objects: {rerun}")
    for name in (PAIRS_FILE, MANIFEST_FILE):
        if not (path / name).is_file():
            return VerifiedAudit("refused", f"{path / name} is missing")
        if inputs.get(name) != file_sha256(path / name):
            return VerifiedAudit("refused", f"{path / name} changed after the audit (its sha256 differs "
                                            f"from {file}, field 'inputs.{name}'): the audit is stale; {rerun}")
    tol = params.get("identity_tol")
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float))):
        return VerifiedAudit("refused", f"{file}: field 'parameters.identity_tol' must be a number or null")
    try:
        fresh = build_audit(path, identity_tol=tol, dataset_dir=params.get("dataset_dir"))
    except (*USER_ERRORS, OSError) as e:
        return VerifiedAudit("refused", f"the audit cannot be re-checked: {e}")
    # A dataset the audit read that is no longer on disk (a run directory copied elsewhere) only
    # changes the non-required coverage check; a dataset that is there must be the same one.
    if fresh["inputs"]["dataset"] is not None and fresh["inputs"]["dataset"] != inputs.get("dataset"):
        return VerifiedAudit("refused", f"the run's dataset changed after the audit (content hash differs "
                                        f"from {file}, field 'inputs.dataset'): {rerun}")
    if _summary(recorded.get("checks") or []) != _summary(fresh["checks"]) \
            or recorded.get("verdict") != fresh["verdict"] or recorded.get("passed") is not fresh["passed"]:
        return VerifiedAudit("refused", f"{file} does not match a fresh audit of the same files "
                                        f"(edited or hand-written): {rerun}")
    return VerifiedAudit("verified", "", fresh["verdict"], fresh["checks"])
