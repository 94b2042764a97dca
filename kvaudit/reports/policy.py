"""Gate policies: thresholds read from TOML, checked against an :class:`Analysis`.

A policy file (see ``policy_default.toml`` for the shipped one and ``docs/reports.md``)::

    arm = "reuse"            # the arm the thresholds judge
    confidence = 0.95        # two-sided level of the plotted interval; its lower end (a one-sided
                             # 97.5% bound) is what a delta threshold judges
    min_icc = 0.0            # optional floor on the documents' design effect: 1 + (m - 1) * min_icc
    missing = "error"        # when a check's data is absent: "error" (exit 2), "fail" or "skip"

    [[delta]]                # one table per quality threshold
    name = "overall quality"
    group = "overall"        # or "task:<glob>", or "<stratum key>:<glob>"
    min_lower_bound = -2.0   # points; the one-sided lower bound must be at least this

    [[speed]]                # optional: one table per speed threshold, beside quality (never instead)
    name = "TTFT no worse"
    metric = "ttft"          # or "time_per_output_token" (decode)
    max_ratio = 1.05         # arm time / its reference's, the median of per-case ratios: the upper end
                             # of its distribution-free interval must be at most this
    # min_speedup = 1.3      # instead: reference time / arm time, the interval's lower end at least this

    [flips]                  # optional: how often the arm's answer differs from recompute's
    max_rate = 0.10          # the flip rate's upper bound (the same paired bound, with the documents'
                             # design effect) must be at most this; above its lower bound: fail

    [audit]
    require_passed = true
    accept_cannot_judge = []  # required checks accepted without their evidence, by name: the gate
                              # passes the audit row saying which (e.g. server_consumed_ids on a
                              # server that echoes no prompt ids); a failed check is never accepted
    max_identity_tol = 0.5    # optional: the loosest `kvaudit audit --identity-tol` accepted above
                              # the dtype's default (logits, in [0, 2]); without it an audit run
                              # with a looser tolerance than the default cannot pass

    [hit_rate]
    min = 0.80               # hit rate of `arm`
    source = "segment"       # "segment": chunk-aligned (loaded / segment tokens); "measured": tokens
                             # already cached / prompt tokens (the simulator's definition);
                             # "simulated" with key = "<entry of simulation.json>": the file must
                             # be bound by the audit (and signed, under [provenance]), its rates in [0, 1]

    [leak]
    max_neutral_text_leak_rate = 0.05   # the Wilson upper bound of the text-leak rate must be at most this
    forbid_neutral_exposure = true      # fail when the exact rank test finds exposure; cannot judge with
                                        # fewer probes than the test needs for 80% power

    [security]                          # server runs with the tenant probes (docs/engines.md)
    require_tenant_isolation = true     # another tenant's identical request is never served from the cache
    max_timing_auc = 0.75               # hit vs miss TTFT: the AUC's interval must lie in [1 - max, max]

    [provenance]
    require_attestation = true          # the run's attestation.json verifies under KVAUDIT_ATTESTATION_KEY
                                        # (docs/audit.md, "Provenance"); missing or broken: cannot judge

Each section is parsed and judged by its module in :mod:`kvaudit.reports.gate_checks` (a registry,
as the audit's checks are); this module reads the top-level fields, applies the rules across
sections, and decides the verdict. Every section may set its own ``missing``. A check's status is pass, fail, error (could not be
judged) or skip. The gate's verdict (:func:`verdict`) is fail if any check failed (a threshold
that failed is a decision, whatever else could not be judged; those rows stay listed), else error
(cannot judge) if any check could not be judged, else error if no *quality* threshold (a
``[[delta]]`` or ``[flips]`` row, :data:`QUALITY_KINDS`) reached pass or fail (every one skipped: a
gate that did not check quality must not pass; :func:`evaluate` adds a "quality checked" row saying
so), else pass. Every policy checks quality: one without a ``[[delta]]`` or ``[flips]`` is an error. The other sections
(``[audit]``, ``[hit_rate]``, ``[leak]``, ``[security]``, ``[provenance]``) are preconditions and
further checks beside quality, never instead of it: a policy of ``[provenance]`` alone passed any
signed run, however much quality its reuse lost.

Every field is validated: numbers must be finite and within their range (``hit_rate.min`` and
``leak.max_neutral_text_leak_rate`` in [0, 1], ``min_lower_bound`` in [-100, 100] points,
``audit.max_identity_tol`` in [0, :data:`~kvaudit.audit.checks.MAX_IDENTITY_TOL`] logits),
switches (``require_passed``, ``forbid_neutral_exposure``, ``require_tenant_isolation``) must be
true or false, and ``arm`` must be an arm under test (:func:`kvaudit.core.arms.is_gated`: ``reuse``,
a repair, the engine's prefix cache): never the reference it is compared with, nor a control that
equals the reference by construction (``identity``, ``recompute_again``, ``blend@1``), a probe or
a diagnostic, which would pass whatever reuse does.

The audit row shows the identity tolerance the audit used (``kvaudit audit --identity-tol``,
recorded in ``audit.json``) and cannot pass an audit whose tolerance is looser than the run's
dtype default unless ``[audit] max_identity_tol`` allows it. The simulated hit-rate row judges a
``simulation.json`` only when the audit's hashes bind it to the run (and, under
``[provenance]``, the attestation signs it); otherwise it cannot judge.

Where the run has ``recompute_again`` (the noise floor), every delta threshold is also applied to
it as a negative control: recompute against itself must clear the margin, or the run cannot be
judged (its noise, or its size, is as large as the effect the gate is asked to rule out).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvaudit.core.arms import NOISE_ARM, ROLES, UNDER_TEST_ARM, gated_arms, get_arm, is_gated
from kvaudit.core.errors import KvauditError, cut
from kvaudit.core.run_dir import RunDir
from kvaudit.core.toml_file import read_toml
from kvaudit.core.vocabulary import MissingMode, Verdict
from kvaudit.reports.analysis import Analysis
from kvaudit.reports.gate_checks import (
    MISSING,
    QUALITY_KINDS,
    Check,
    Table,
    ThresholdResult,
    evaluator,
    sections,
)
from kvaudit.reports.gate_checks.base import number, short
from kvaudit.reports.gate_checks.hit_rate import simulation_unbound
from kvaudit.reports.gate_checks.quality import cases_needed
from kvaudit.stats.noninferiority import DEFAULT_CONFIDENCE, check_confidence

DEFAULT_POLICY = Path(__file__).with_name("policy_default.toml")
# The shipped policy for a serving-change run (kvaudit run --engines): arm = "candidate".
SERVING_CHANGE_POLICY = Path(__file__).with_name("policy_serving_change.toml")
_TOP_FIELDS = {"arm", "confidence", "min_icc", "missing"}

__all__ = ["DEFAULT_POLICY", "MISSING", "QUALITY_KINDS", "SERVING_CHANGE_POLICY", "Check", "Policy", "ThresholdResult",
           "cases_needed", "default_policy", "evaluate", "evaluate_check", "load_policy", "parse_policy",
           "simulation_unbound", "verdict"]


@dataclass
class Policy:
    source: str
    arm: str = UNDER_TEST_ARM
    confidence: float = DEFAULT_CONFIDENCE
    min_icc: float = 0.0
    checks: list[Check] = field(default_factory=list)

    def margin_for_task(self, task: str) -> float | None:
        """Margin for a task family: the most specific delta check naming it, else overall."""
        best: tuple[int, float] | None = None
        for c in self.checks:
            if c.kind != "delta":
                continue
            group, bound = c.params["group"], c.params["min_lower_bound"]
            if group == "overall":
                rank = 0
            elif group.startswith("task:") and fnmatch.fnmatchcase(task, group[5:]):
                rank = 2 if group[5:] == task else 1
            else:
                continue
            if best is None or rank > best[0]:
                best = (rank, bound)
        return None if best is None else best[1]


def _missing(source: str, label: str, section: dict[str, Any], default: MissingMode) -> MissingMode:
    m = section.get("missing", default)
    if m not in MISSING:
        field_ = f"{label}.missing" if label else "missing"
        raise KvauditError(f"{source}: field '{field_}' must be one of {', '.join(MISSING)}")
    return m


def _unknown(where: str, obj: dict[str, Any], allowed: set[str] | frozenset[str]) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise KvauditError(f"{where}: unknown field '{short(extra[0])}'")


def _gated_arm(raw: dict[str, Any], source: str) -> str:
    """The policy's ``arm``: an arm under test, never the reference or a control equal to it."""
    arm = raw.get("arm", UNDER_TEST_ARM)
    if not isinstance(arm, str) or not arm:
        raise KvauditError(f"{source}: field 'arm' must be a non-empty string")
    try:
        spec = get_arm(arm)  # a registry arm or a parameterised repair (blend@0.15, epic@16)
    except KvauditError as e:
        raise KvauditError(f"{source}: field 'arm': {cut(e, 200)}") from None
    if spec.compared_with == spec.name:
        raise KvauditError(f"{source}: field 'arm': '{short(arm)}' is the reference every arm is compared with; "
                           f"the arm under test cannot be its own reference (e.g. arm = \"{UNDER_TEST_ARM}\")")
    if not is_gated(spec):
        what = ("recomputes every segment token: it equals the reference by construction" if spec.repair
                else f"is the {spec.role.replace('_', ' ')} arm ({ROLES[spec.role]})")
        raise KvauditError(f"{source}: field 'arm': '{short(arm)}' {what}, not an arm under test: its verdict "
                           "says nothing about the reuse a deployment runs (a control equal to the reference "
                           "passes whatever reuse does). Allowed arms: " + ", ".join(gated_arms()))
    return arm


def _tables(source: str, raw: dict[str, Any], key: str, many: bool) -> list[tuple[str, dict[str, Any]]]:
    """``(label, table)`` for each table of section ``key`` (none when absent): ``key`` itself, or
    ``key[i]`` for each table of an array of tables (``[[key]]``)."""
    if key not in raw:
        return []
    value = raw[key]
    if not many:
        if not isinstance(value, dict):
            raise KvauditError(f"{source}: field '{key}' must be a table ([{key}])")
        return [(key, value)]
    if not isinstance(value, list):
        raise KvauditError(f"{source}: field '{key}' must be an array of tables ([[{key}]])")
    for i, d in enumerate(value):
        if not isinstance(d, dict):
            raise KvauditError(f"{source}: field '{key}[{i}]' must be a table")
    return [(f"{key}[{i}]", d) for i, d in enumerate(value)]


def parse_policy(raw: dict[str, Any], source: str) -> Policy:
    """Validate a policy dict (from TOML); errors name the file and field."""
    known = sections()
    _unknown(source, raw, _TOP_FIELDS | {s.name for s in known})
    arm = _gated_arm(raw, source)
    conf = number(f"{source}: field 'confidence'", raw.get("confidence", DEFAULT_CONFIDENCE))
    try:
        check_confidence(conf)
    except ValueError as e:
        raise KvauditError(f"{source}: field 'confidence': {e}") from None
    icc = number(f"{source}: field 'min_icc'", raw.get("min_icc", 0.0))
    if not 0 <= icc < 1:
        raise KvauditError(f"{source}: field 'min_icc' must be in [0, 1)")
    default_missing = _missing(source, "", raw, "error")
    pol = Policy(source=source, arm=arm, confidence=conf, min_icc=icc)
    for sec in known:
        for label, table in _tables(source, raw, sec.name, sec.many):
            _unknown(f"{source}: {label}" if sec.many else f"{source}: [{label}]", table, sec.fields)
            t = Table(source, label, arm, _missing(source, label, table, default_missing))
            pol.checks += sec.parse(table, t)
    if not any(c.kind in QUALITY_KINDS for c in pol.checks):
        raise KvauditError(f"{source}: the policy sets no threshold on quality (no [[delta]] thresholds, no "
                           "[flips]): every policy must check quality; [audit], [hit_rate], [leak], [security] and [provenance] "
                           "are checks beside it, never instead (add e.g. [[delta]] group = \"overall\" "
                           "min_lower_bound = -2.0)")
    if any(c.kind == "provenance" for c in pol.checks):  # a simulated rate must be signed too
        for c in pol.checks:
            if c.kind == "hit_rate" and c.params["source"] == "simulated":
                c.params["attested"] = True
    return pol


def default_policy(run_dir: str | Path | None = None) -> Path:
    """The shipped policy for the run in ``run_dir``: :data:`SERVING_CHANGE_POLICY` for a
    serving-change run (its manifest records engines), else :data:`DEFAULT_POLICY` (also when the
    manifest cannot be read: reading the run says why, later)."""
    if run_dir is not None:
        try:
            if RunDir(run_dir).read_manifest().serving_change is not None:
                return SERVING_CHANGE_POLICY
        except (KvauditError, OSError):
            pass
    return DEFAULT_POLICY


def load_policy(path: str | Path | None = None, run_dir: str | Path | None = None) -> Policy:
    """Read a policy file (the shipped default for the run in ``run_dir`` when ``path`` is None:
    :func:`default_policy`)."""
    p = Path(path) if path is not None else default_policy(run_dir)
    return parse_policy(read_toml(p, "policy file"), str(p))


def evaluate_check(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    """The row of one check, judged by its kind's evaluator (:mod:`kvaudit.reports.gate_checks`)."""
    return evaluator(check.kind)(check, an, arm)


def noise_control(policy: Policy, an: Analysis) -> list[ThresholdResult]:
    """Every quality threshold (delta, flips) applied to ``recompute_again`` (when it ran): it must
    pass, or the run cannot be judged (the engine's own noise is as large as what is ruled out)."""
    if NOISE_ARM not in an.arms or policy.arm == NOISE_ARM:
        return []
    out = []
    for c in policy.checks:
        if c.kind not in QUALITY_KINDS:
            continue
        label = f"{c.name}: noise floor ({NOISE_ARM})"
        r = evaluator(c.kind)(replace(c, name=label), an, NOISE_ARM)
        if r.status in ("fail", "error"):
            r = ThresholdResult(r.name, "noise_control", "error", r.observed, r.threshold,
                                f"cannot judge: recompute against itself does not clear the threshold ({r.detail})")
        else:
            r = ThresholdResult(r.name, "noise_control", r.status, r.observed, r.threshold, r.detail)
        out.append(r)
    return out


def _judged(results: list[ThresholdResult]) -> bool:
    """Whether any quality threshold (a row of :data:`QUALITY_KINDS`: not the audit, hit rate,
    leak, security, provenance, completeness or noise-floor rows) reached a decision, pass or fail."""
    return any(r.status in ("pass", "fail") for r in results if r.kind in QUALITY_KINDS)


def nothing_checked(results: list[ThresholdResult]) -> ThresholdResult | None:
    """A "cannot judge" row when no quality threshold was decided and none says why (every one
    skipped: ``missing = "skip"`` on data the run lacks): a gate that did not check quality must
    not pass, whatever else passed. None when a quality threshold was decided, or when one could
    not be judged (that row already says why)."""
    quality = [r for r in results if r.kind in QUALITY_KINDS]
    if _judged(results) or any(r.status == "error" for r in quality):
        return None
    skipped = sum(r.status == "skip" for r in quality)
    return ThresholdResult("quality checked", "coverage", "error",
                           f"0 of {len(quality)} quality thresholds decided ({skipped} skipped)",
                           "at least one [[delta]] or [flips] threshold passes or fails",
                           "cannot judge: no quality threshold was decided (every [[delta]] and [flips] was skipped: "
                           "missing = \"skip\" on data this run lacks), so the gate did not check quality; "
                           "the other rows are checks beside quality, never instead of it")


def evaluate(policy: Policy, an: Analysis) -> list[ThresholdResult]:
    """One row per check of the policy, then the noise-floor controls, then a "quality checked"
    row when no quality threshold was decided (:func:`nothing_checked`)."""
    results = [evaluate_check(c, an, policy.arm) for c in policy.checks] + noise_control(policy, an)
    row = nothing_checked(results)
    return results + ([row] if row else [])


def verdict(results: list[ThresholdResult]) -> Verdict:
    """``fail`` if any check failed (a failed threshold is a decision even where other rows could
    not be judged), else ``error`` (cannot judge) if any check could not be judged or no quality
    threshold (:data:`QUALITY_KINDS`) reached pass or fail (all skipped, or no rows), else ``pass``."""
    statuses = {r.status for r in results}
    if "fail" in statuses:
        return "fail"
    if "error" in statuses or not _judged(results):
        return "error"
    return "pass"
