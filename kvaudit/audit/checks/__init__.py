"""The confounder audit's checks: a registry of functions, each taking a loaded run and returning
one :class:`CheckResult`.

A run passes the audit when every *required* check passes. Checks that are not required (the
noise floors, the prefix cache control, coverage, tenant isolation) never fail the audit; they carry
a ``warning`` instead (``result(True, detail, cases, warning)``).
Every check that finds a problem names the cases it found it in (``failing_cases``).

Checks live in small modules by concern, listed in report order in :data:`CONCERNS`; each
registers itself with ``@check(name, required=...)`` (:mod:`kvaudit.audit.checks.base`), and
:func:`run_checks` runs them in that order (within a module, in order of definition). Adding a
check to a concern is one decorated function in that module (docs/audit.md). Thresholds and
tests are documented in the module that uses them: identity tolerances in
:mod:`~kvaudit.audit.checks.identity_reuse`, the noise floor's test in :mod:`~kvaudit.audit.checks.noise`,
the repair controls in :mod:`~kvaudit.audit.checks.repairs`, the leak test in
:mod:`~kvaudit.audit.checks.leaks`, coverage minimums in
:mod:`~kvaudit.audit.checks.coverage`.
"""

from __future__ import annotations

import importlib

from kvaudit.audit.checks.base import (
    ALPHA,
    MAX_LISTED,
    REGISTRY,
    CheckResult,
    CheckSpec,
    check,
    is_reuse_arm,
)
from kvaudit.audit.checks.configuration import check_configuration
from kvaudit.audit.checks.coverage import (
    MIN_NEVER_CACHED_SHARE,
    MIN_REFS_PER_SEGMENT,
    check_coverage,
)
from kvaudit.audit.checks.history import check_history_independence
from kvaudit.audit.checks.identity_reuse import (
    DEFAULT_TOL,
    EXACT_DTYPES,
    IDENTITY_NOISE_SLACK,
    IDENTITY_TOL,
    MAX_IDENTITY_TOL,
    check_identity,
    check_identity_tol,
    check_reuse_happened,
    deterministic_backend,
    identity_tolerance,
    run_dtype,
)
from kvaudit.audit.checks.inputs import check_records, check_same_inputs
from kvaudit.audit.checks.leaks import check_leak_probes
from kvaudit.audit.checks.loading import LoadedRun, load_for_audit
from kvaudit.audit.checks.noise import check_noise_floor, check_prefix_cache_control, noise_floor
from kvaudit.core.arms import NOISE_ARM

# Concern modules in report order; importing one registers its checks.
CONCERNS = ("inputs", "configuration", "serving_change", "server", "identity_reuse", "repairs", "history", "noise", "coverage",
            "leaks")
for _module in CONCERNS:
    importlib.import_module(f"{__name__}.{_module}")


def registered() -> list[CheckSpec]:
    """Every registered check, in report order."""
    rank = {f"{__name__}.{m}": i for i, m in enumerate(CONCERNS)}
    seq = {name: i for i, name in enumerate(REGISTRY)}
    return sorted(REGISTRY.values(),
                  key=lambda s: (rank.get(s.fn.__module__, len(rank)), seq[s.name]))


def run_checks(run: LoadedRun, identity_tol: float | None = None) -> list[CheckResult]:
    """Every registered check, in report order."""
    options = {"identity_tol": identity_tol}
    return [spec.fn(run, **{o: options[o] for o in spec.options}) for spec in registered()]


__all__ = [
    "ALPHA", "CONCERNS", "DEFAULT_TOL", "EXACT_DTYPES", "IDENTITY_NOISE_SLACK", "IDENTITY_TOL",
    "MAX_IDENTITY_TOL", "MAX_LISTED", "MIN_NEVER_CACHED_SHARE", "MIN_REFS_PER_SEGMENT", "NOISE_ARM", "REGISTRY",
    "CheckResult", "CheckSpec", "LoadedRun", "check", "check_configuration", "check_coverage",
    "check_history_independence", "check_identity", "check_identity_tol", "check_leak_probes", "check_noise_floor",
    "check_prefix_cache_control", "check_records", "check_reuse_happened", "check_same_inputs",
    "deterministic_backend", "identity_tolerance", "is_reuse_arm", "load_for_audit", "noise_floor",
    "registered", "run_checks", "run_dtype",
]
