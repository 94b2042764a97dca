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

Every section may set its own ``missing``. A check's status is pass, fail, error (could not be
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
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.core.arms import (
    NOISE_ARM,
    REFERENCE_ARM,
    ROLES,
    UNDER_TEST_ARM,
    gated_arms,
    get_arm,
    is_gated,
    reference_of,
)
from kvaudit.core.attestation import attestation_key, verify_attestation
from kvaudit.core.errors import DatasetError, KvauditError, cut
from kvaudit.core.run_dir import RunDir
from kvaudit.core.run_format import SIMULATION_FILE
from kvaudit.core.toml_file import read_toml
from kvaudit.core.vocabulary import CheckKind, GateStatus
from kvaudit.reports.analysis import Analysis
from kvaudit.stats.leak_tests import text_leak_decision
from kvaudit.stats.noninferiority import DEFAULT_CONFIDENCE, check_confidence
from kvaudit.stats.speed import METRICS as SPEED_METRICS
from kvaudit.stats.speed import speed_decision

DEFAULT_POLICY = Path(__file__).with_name("policy_default.toml")
# The shipped policy for a serving-change run (kvaudit run --engines): arm = "candidate".
SERVING_CHANGE_POLICY = Path(__file__).with_name("policy_serving_change.toml")
MISSING = ("error", "fail", "skip")
_TOP = {"arm", "confidence", "min_icc", "missing", "delta", "speed", "flips", "audit", "hit_rate", "leak",
        "security", "provenance"}
_SECTIONS = {
    "delta": {"name", "group", "min_lower_bound", "missing"},
    "speed": {"name", "metric", "max_ratio", "min_speedup", "missing"},
    "flips": {"max_rate", "missing"},
    "audit": {"require_passed", "accept_cannot_judge", "max_identity_tol", "missing"},
    "hit_rate": {"min", "source", "key", "missing"},
    "leak": {"max_neutral_text_leak_rate", "forbid_neutral_exposure", "missing"},
    "security": {"require_tenant_isolation", "max_timing_auc", "missing"},
    "provenance": {"require_attestation"},
}
# The kinds of row that judge answer quality: a gate passes only when one of them was decided
# (a score delta, or how often answers change). Every other row (audit, hit rate, leaks, security,
# provenance, completeness, the noise floor) is a precondition or a further check beside quality,
# never instead of it.
QUALITY_KINDS = ("delta", "flips")


@dataclass
class Check:
    name: str
    kind: CheckKind
    params: dict[str, Any]
    missing: str = "error"


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


@dataclass
class ThresholdResult:
    name: str
    kind: CheckKind
    status: GateStatus  # error: cannot judge
    observed: str
    threshold: str
    detail: str = ""


def _num(where: str, v: Any, lo: float | None = None, hi: float | None = None) -> float:
    """A finite number (within [lo, hi] when given); NaN and infinities are refused: a NaN bound
    compares false both ways and an infinite one can never (or always) be met."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise KvauditError(f"{where} must be a number")
    try:
        x = float(v)
    except OverflowError:  # an integer too large for a float
        x = math.inf
    if not math.isfinite(x):
        shown = "an integer too large for a float" if isinstance(v, int) else str(v)
        raise KvauditError(f"{where} must be a finite number, not {shown}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        span = f"[{lo:g}, {hi:g}]" if lo is not None and hi is not None else (
            f"at least {lo:g}" if lo is not None else f"at most {hi:g}")
        raise KvauditError(f"{where} must be {'in ' if span[0] == '[' else ''}{span}, not {x:g}")
    return x


def _accepted_unjudged(source: str, v: Any) -> list[str]:
    """``audit.accept_cannot_judge``: required audit checks a team accepts without their evidence
    (a server that cannot show it, e.g. ``server_consumed_ids`` on llama.cpp), each a check name."""
    from kvaudit.audit.checks import registered

    where = f"{source}: field 'audit.accept_cannot_judge'"
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise KvauditError(f"{where} must be a list of audit check names")
    known = {c.name for c in registered()}
    unknown = [x for x in v if x not in known]
    if unknown:
        raise KvauditError(f"{where}: no audit check named {', '.join(map(repr, unknown))} "
                           f"(checks: {', '.join(sorted(known))})")
    return list(v)


def _bool(where: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise KvauditError(f"{where} must be true or false")
    return v


def _short(v: Any, n: int = 60) -> str:
    """``v`` as text for an error message: control characters escaped, cut to ``n`` characters."""
    return cut(str(v).encode("unicode_escape").decode("ascii"), n)


def _missing(source: str, label: str, section: dict[str, Any], default: str) -> str:
    m = section.get("missing", default)
    if m not in MISSING:
        field_ = f"{label}.missing" if label else "missing"
        raise KvauditError(f"{source}: field '{field_}' must be one of {', '.join(MISSING)}")
    return m


def _unknown(where: str, obj: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise KvauditError(f"{where}: unknown field '{_short(extra[0])}'")


def parse_policy(raw: dict[str, Any], source: str) -> Policy:
    """Validate a policy dict (from TOML); errors name the file and field."""
    _unknown(source, raw, _TOP)
    arm = raw.get("arm", UNDER_TEST_ARM)
    if not isinstance(arm, str) or not arm:
        raise KvauditError(f"{source}: field 'arm' must be a non-empty string")
    try:
        spec = get_arm(arm)  # a registry arm or a parameterised repair (blend@0.15, epic@16)
    except KvauditError as e:
        raise KvauditError(f"{source}: field 'arm': {cut(e, 200)}") from None
    if spec.compared_with == spec.name:
        raise KvauditError(f"{source}: field 'arm': '{_short(arm)}' is the reference every arm is compared with; "
                           f"the arm under test cannot be its own reference (e.g. arm = \"{UNDER_TEST_ARM}\")")
    if not is_gated(spec):
        what = ("recomputes every segment token: it equals the reference by construction" if spec.repair
                else f"is the {spec.role.replace('_', ' ')} arm ({ROLES[spec.role]})")
        raise KvauditError(f"{source}: field 'arm': '{_short(arm)}' {what}, not an arm under test: its verdict "
                           "says nothing about the reuse a deployment runs (a control equal to the reference "
                           "passes whatever reuse does). Allowed arms: " + ", ".join(gated_arms()))
    conf = _num(f"{source}: field 'confidence'", raw.get("confidence", DEFAULT_CONFIDENCE))
    try:
        check_confidence(conf)
    except ValueError as e:
        raise KvauditError(f"{source}: field 'confidence': {e}") from None
    icc = _num(f"{source}: field 'min_icc'", raw.get("min_icc", 0.0))
    if not 0 <= icc < 1:
        raise KvauditError(f"{source}: field 'min_icc' must be in [0, 1)")
    default_missing = _missing(source, "", raw, "error")
    pol = Policy(source=source, arm=arm, confidence=conf, min_icc=icc)

    for i, d, where in _array_of_tables(source, raw, "delta"):
        group = d.get("group")
        if not isinstance(group, str) or not (group == "overall" or ":" in group):
            raise KvauditError(f"{where}.group' must be 'overall', 'task:<glob>' or '<stratum>:<glob>'")
        bound = _num(f"{where}.min_lower_bound' (points)", d.get("min_lower_bound"), -100.0, 100.0)
        name = d.get("name", group)
        if not isinstance(name, str):
            raise KvauditError(f"{where}.name' must be a string")
        pol.checks.append(Check(name, "delta", {"group": group, "min_lower_bound": bound},
                                _missing(source, f"delta[{i}]", d, default_missing)))

    for i, d, where in _array_of_tables(source, raw, "speed"):
        metric = d.get("metric")
        if not isinstance(metric, str) or metric not in SPEED_METRICS:
            raise KvauditError(f"{where}.metric' must be one of {', '.join(SPEED_METRICS)}")
        if ("max_ratio" in d) == ("min_speedup" in d):
            raise KvauditError(f"{where}' needs exactly one of max_ratio (arm time / reference time at most) and "
                               "min_speedup (reference time / arm time at least)")
        if "max_ratio" in d:
            max_ratio = _num(f"{where}.max_ratio'", d["max_ratio"], 0.01, 100.0)
            shown = f"{SPEED_METRICS[metric]} ratio ≤ {max_ratio:g}x"
        else:
            speedup = _num(f"{where}.min_speedup'", d["min_speedup"], 0.01, 100.0)
            max_ratio = 1.0 / speedup
            shown = f"{SPEED_METRICS[metric]} speed-up ≥ {speedup:g}x"
        name = d.get("name", shown)
        if not isinstance(name, str):
            raise KvauditError(f"{where}.name' must be a string")
        pol.checks.append(Check(name, "speed", {"metric": metric, "max_ratio": max_ratio,
                                                "speedup": "min_speedup" in d},
                                _missing(source, f"speed[{i}]", d, default_missing)))

    for key in ("flips", "audit", "hit_rate", "leak", "security", "provenance"):
        sec = raw.get(key)
        if sec is None:
            continue
        if not isinstance(sec, dict):
            raise KvauditError(f"{source}: field '{key}' must be a table ([{key}])")
        _unknown(f"{source}: [{key}]", sec, _SECTIONS[key])
        missing = _missing(source, key, sec, default_missing)
        if key == "flips":
            mx = _num(f"{source}: field 'flips.max_rate'", sec.get("max_rate"), 0.0, 1.0)
            pol.checks.append(Check("answers changed vs recompute", "flips", {"max_rate": mx}, missing))
        elif key == "audit":
            max_tol = sec.get("max_identity_tol")
            if max_tol is not None:
                from kvaudit.audit.checks import MAX_IDENTITY_TOL

                max_tol = _num(f"{source}: field 'audit.max_identity_tol' (logits)", max_tol, 0.0, MAX_IDENTITY_TOL)
            if _bool(f"{source}: field 'audit.require_passed'", sec.get("require_passed", True)):
                pol.checks.append(Check("audit passed", "audit",
                                        {"accept": _accepted_unjudged(source, sec.get("accept_cannot_judge", [])),
                                         "max_identity_tol": max_tol},
                                        missing))
        elif key == "hit_rate":
            lo = _num(f"{source}: field 'hit_rate.min'", sec.get("min"), 0.0, 1.0)
            src = sec.get("source", "measured")
            if src not in ("measured", "segment", "simulated"):
                raise KvauditError(f"{source}: field 'hit_rate.source' must be 'measured', 'segment' or 'simulated'")
            if (src == "simulated" or "key" in sec) and not isinstance(sec.get("key"), str):
                raise KvauditError(f"{source}: field 'hit_rate.key' must name a simulation.json entry")
            # one name per quantity, as the report names it (docs/reports.md, "Hit rates")
            what = {"measured": "token hit rate", "segment": "chunk-aligned hit rate",
                    "simulated": "simulated token hit rate"}[src]
            pol.checks.append(Check(f"{arm} {what}", "hit_rate",
                                    {"min": lo, "source": src, "key": sec.get("key")}, missing))
        elif key == "leak":
            if "max_neutral_text_leak_rate" in sec:
                mx = _num(f"{source}: field 'leak.max_neutral_text_leak_rate'", sec["max_neutral_text_leak_rate"],
                          0.0, 1.0)
                pol.checks.append(Check("neutral-policy text leak rate", "leak_text", {"max": mx}, missing))
            if _bool(f"{source}: field 'leak.forbid_neutral_exposure'", sec.get("forbid_neutral_exposure", False)):
                pol.checks.append(Check("neutral-policy canary exposure", "leak_exposure", {}, missing))
        elif key == "security":
            if _bool(f"{source}: field 'security.require_tenant_isolation'",
                     sec.get("require_tenant_isolation", False)):
                pol.checks.append(Check("tenant isolation", "tenant_isolation", {}, missing))
            if "max_timing_auc" in sec:
                mx = _num(f"{source}: field 'security.max_timing_auc'", sec["max_timing_auc"])
                if not 0.5 <= mx < 1:
                    raise KvauditError(f"{source}: field 'security.max_timing_auc' must be in [0.5, 1)")
                pol.checks.append(Check("timing side channel", "timing", {"max": mx}, missing))
        elif key == "provenance":
            if _bool(f"{source}: field 'provenance.require_attestation'", sec.get("require_attestation", False)):
                pol.checks.append(Check("run attested by kvaudit run", "provenance", {}, "error"))
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


def _array_of_tables(source: str, raw: dict[str, Any], key: str) -> list[tuple[int, dict[str, Any], str]]:
    """``(i, table, where)`` for each ``[[key]]`` table of a policy, each checked to be a table of
    known fields; ``where`` is the message prefix naming the file and ``key[i]``."""
    tables = raw.get(key, [])
    if not isinstance(tables, list):
        raise KvauditError(f"{source}: field '{key}' must be an array of tables ([[{key}]])")
    out = []
    for i, d in enumerate(tables):
        where = f"{source}: field '{key}[{i}]"
        if not isinstance(d, dict):
            raise KvauditError(f"{where}' must be a table")
        _unknown(f"{source}: {key}[{i}]", d, _SECTIONS[key])
        out.append((i, d, where))
    return out


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


def _missing_result(check: Check, observed: str, threshold: str, detail: str) -> ThresholdResult:
    status = {"error": "error", "fail": "fail", "skip": "skip"}[check.missing]
    return ThresholdResult(check.name, check.kind, status, observed, threshold, detail)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _tolerance(an: Analysis, max_tol: float | None) -> tuple[str, str | None, float]:
    """The identity tolerance the verified audit used, as ``(sentence, why it is not accepted or
    None, the loosest accepted)``: an ``--identity-tol`` looser than the run's dtype default is
    accepted only up to the policy's ``[audit] max_identity_tol``."""
    from kvaudit.audit.checks import identity_tolerance, run_dtype

    dtype = run_dtype(an.run.manifest)
    default, _ = identity_tolerance(dtype)
    named = f"the {_short(dtype, 20)} default" if dtype else "the default for an unknown dtype"
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


def _audit_result(check: Check, an: Analysis) -> ThresholdResult:
    """The audit row: the fresh verdict of a verified audit, with the identity tolerance it used."""
    k, p = check.kind, check.params
    audit = an.run.audit
    if audit.state == "missing":
        return _missing_result(check, "not run", "passed", audit.reason)
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


def _speed_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    """A speed row: the median per-case time ratio of ``arm`` over its reference and its
    distribution-free interval (:mod:`kvaudit.stats.speed`), shown as a speed-up where the row
    was written as one."""
    p = check.params
    metric, mx = p["metric"], p["max_ratio"]
    ref = reference_of(arm)
    thr = f"speed-up ≥ {1 / mx:.3g}x" if p["speedup"] else f"{arm}/{ref} ≤ {mx:.3g}x"
    iv = an.speed(arm, metric)
    if iv is None:
        return _missing_result(check, "n/a", thr, f"no case where both '{arm}' and '{ref}' have a {SPEED_METRICS[metric]}")
    if p["speedup"]:
        obs = (f"{1 / iv.median:.3g}x" + ("" if iv.upper is None else f" [{1 / iv.upper:.3g}, {1 / iv.lower:.3g}]")
               + f" on {iv.n} cases")
    else:
        obs = (f"{iv.median:.3g}x" + ("" if iv.upper is None else f" [{iv.lower:.3g}, {iv.upper:.3g}]")
               + f" on {iv.n} cases")
    dec = speed_decision(iv, mx)
    if dec == "undecided":
        return ThresholdResult(check.name, "speed", "error", obs, thr,
                               f"cannot judge: {iv.n} cases are too few for a {iv.confidence:.0%} interval of the median")
    noise = an.speed(NOISE_ARM, metric) if NOISE_ARM != arm else None
    detail = (f"median of per-case {SPEED_METRICS[metric]} ratios {arm}/{ref}, {iv.confidence:.0%} order-statistic "
              "interval")
    if noise is not None:
        detail += f"; timing noise: {NOISE_ARM}/{ref} {noise.median:.3g}x on {noise.n} cases"
        if metric == "ttft" and get_arm(NOISE_ARM).perturbs_batch:
            detail += " (it runs beside a filler request: its first token waits on a busier batch)"
    return ThresholdResult(check.name, "speed", dec, obs, thr, detail)


def evaluate_check(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    k, p = check.kind, check.params
    if k == "delta":
        return _delta_result(check, an, arm)
    if k == "audit":
        return _audit_result(check, an)
    if k == "flips":
        return _flip_result(check, an, arm)
    if k == "speed":
        return _speed_result(check, an, arm)
    if k == "hit_rate":
        thr = f"≥ {_pct(p['min'])}"
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
            where = f"{SIMULATION_FILE} has no entry '{_short(p['key'])}'"
        if rate is None:
            return _missing_result(check, "n/a", thr, where)
        return ThresholdResult(check.name, k, "pass" if rate >= p["min"] else "fail", _pct(rate), thr)
    if k == "leak_text":
        thr = f"Wilson upper bound ≤ {_pct(p['max'])}"
        t = an.leaks["text"].get(UNDER_TEST_ARM)
        if t is None:
            return _missing_result(check, "no probes", thr, f"the run has no leak probes with a '{UNDER_TEST_ARM}' arm")
        dec = text_leak_decision(t["leaks"], t["n"], p["max"], confidence=an.confidence)
        obs = f"{t['leaks']} of {t['n']} ({_pct(dec.rate)}, upper bound {_pct(dec.upper)})"
        detail = ", ".join(t["cases"][:5])
        if dec.verdict == "undecided":
            need = (f"; {dec.probes_to_pass} probes without a leak would be needed"
                    if dec.probes_to_pass else "")
            return ThresholdResult(check.name, k, "error", obs, thr,
                                   f"cannot judge: too few probes for the bound to reach {_pct(p['max'])}{need}"
                               + (f"; leaks in {detail}" if detail else ""))
        return ThresholdResult(check.name, k, dec.verdict, obs, thr, detail)
    if k == "leak_exposure":
        e = an.leaks["exposure"].get("neutral")
        thr = f"rank test p > {an.leaks['alpha']:g} with enough probes"
        if e is None:
            return _missing_result(check, "no probes", thr,
                                   f"no leak probes with candidate log-probs under '{UNDER_TEST_ARM}' and '{REFERENCE_ARM}'")
        obs = (f"rank test p={e['rank_test_p']:.3g}, mean rank {e['mean_rank']:.2f} vs chance "
               f"{e['chance_rank']:.2f}, {e['n']} probes")
        power = f"power {e['power']:.0%} at the reference effect; {e['min_probes']} probes needed"
        if e["verdict"] == "fail":
            return ThresholdResult(check.name, k, "fail", obs, thr,
                                   "the true name gains more than its decoys beyond chance: "
                               + ", ".join(e["ranked_first_cases"][:5]))
        if e["verdict"] == "undecided":
            return ThresholdResult(check.name, k, "error", obs, thr, f"cannot judge: too few probes ({power})")
        return ThresholdResult(check.name, k, "pass", obs, thr, power)
    if k == "tenant_isolation":
        rows = an.security["isolation"]
        if not rows:
            return _missing_result(check, "no probes", "no other tenant served from the cache",
                                   "the run has no tenant-probe arm (prefix_cache_other_tenant, reuse_other_tenant)")
        status = ("fail" if any(r["verdict"] == "fail" for r in rows) else
                  "error" if any(r["verdict"] != "pass" for r in rows) else "pass")
        obs = "; ".join(f"{r['what']}: {r['verdict'].replace('_', ' ')}" for r in rows)
        return ThresholdResult(check.name, k, status, obs, "no other tenant served from the cache",
                               "; ".join(r["reason"] for r in rows))
    if k == "timing":
        from kvaudit.stats.timing import timing_decision

        thr = f"AUC interval within [{1 - p['max']:.2f}, {p['max']:.2f}]"
        if not an.timing:
            return _missing_result(check, "no probes", thr, "the run has no tenant-probe arm to time hits against")
        statuses, parts = [], []
        for what, t in an.timing.items():
            dec = timing_decision(t, p["max"])
            statuses.append({"pass": "pass", "fail": "fail"}.get(dec, "error"))
            need = f", {t.requests_needed} request pair(s) to tell apart" if t.requests_needed else ""
            parts.append(f"{what}: AUC {t.auc:.3f} [{t.lower:.3f}, {t.upper:.3f}] on {t.n} cases{need}")
        status = "fail" if "fail" in statuses else "error" if "error" in statuses else "pass"
        return ThresholdResult(check.name, k, status, "; ".join(parts), thr,
                               "cannot judge: the interval straddles the threshold (more cases needed)"
                           if status == "error" else "")
    if k == "provenance":
        found = verify_attestation(an.run.path, attestation_key())
        status = "pass" if found.state == "verified" else "error"
        return ThresholdResult(check.name, k, status, found.state.replace("_", " "), "verified",
                               found.reason if status == "pass" else f"cannot judge: {found.reason}")
    raise ValueError(f"unknown check kind {k!r}")



def _delta_result(check: Check, an: Analysis, arm: str, *, label: str | None = None) -> ThresholdResult:
    p = check.params
    name = label or check.name
    thr = f"lower bound ≥ {p['min_lower_bound']:+.1f} pts"
    d = an.delta(arm, p["group"])
    if d["n"] == 0:
        return _missing_result(Check(name, "delta", p, check.missing), "no cases", thr,
                               f"no answer-quality cases with arm '{arm}' match group '{p['group']}'")
    if not d["decidable"]:
        need = cases_needed(d, p["min_lower_bound"], confidence=an.confidence)
        return ThresholdResult(name, "delta", "error", f"delta {d['delta']:+.1f} pts, no bound", thr,
                               f"cannot judge: {d['reason']}" + (f"; about {need} cases needed "
                                                             "(`kvaudit plan` simulates it)" if need else ""))
    sequential = an.run.manifest.extra.get("sequential")
    if sequential is not None:
        return _sequential_delta_result(check, an, arm, sequential, name, thr, d)
    # Three outcomes: pass when the whole interval clears the margin; fail when the whole interval
    # lies below it (a loss beyond the margin, confirmed); cannot judge when it straddles the
    # margin (the run is too small to tell), so that a fail is a decision the gate can rank first.
    margin = p["min_lower_bound"]
    status = ("pass" if d["lower_bound"] >= margin else
              "fail" if d["upper_bound"] < margin else "error")
    detail = (f"delta {d['delta']:+.1f} pts, {an.confidence:.0%} interval [{d['lower_bound']:+.1f}, "
              f"{d['upper_bound']:+.1f}], n={d['n']} on {d['n_clusters']} documents "
              f"(design effect {d['deff']:.2f}), MDD {d['mdd']:.1f} pts")
    if status == "error":
        need = cases_needed(d, margin, confidence=an.confidence)
        detail = ("cannot judge: the interval straddles the margin; " + detail
                  + (f"; about {need} cases would be needed to pass a true delta of 0" if need and need > d["n"]
                     else ""))
    return ThresholdResult(name, "delta", status, f"lower bound {d['lower_bound']:+.1f} pts", thr, detail)


def _flip_result(check: Check, an: Analysis, arm: str, *, label: str | None = None) -> ThresholdResult:
    """The arm's flip rate against ``max_rate``, three outcomes as a delta has: pass when the
    interval's upper end is within it, fail when its lower end is above it, else cannot judge."""
    mx = check.params["max_rate"]
    name = label or check.name
    thr = f"upper bound ≤ {_pct(mx)}"
    b = an.flip_bound(arm)
    if b is None:
        return _missing_result(Check(name, "flips", check.params, check.missing), "no cases", thr,
                               f"arm '{arm}' has no answers compared with recompute's")
    k = round(b.mean * b.n)
    obs = f"{k} of {b.n} ({_pct(b.mean)})"
    if not b.decidable:
        return ThresholdResult(name, "flips", "error", obs + ", no bound", thr, f"cannot judge: {b.reason}")
    assert b.lower is not None and b.upper is not None
    status = "pass" if b.upper <= mx else "fail" if b.lower > mx else "error"
    detail = (f"{an.confidence:.0%} interval [{_pct(max(0.0, b.lower))}, {_pct(b.upper)}] on {b.n_clusters} documents "
              f"(design effect {b.deff:.2f})")
    if status == "error":
        detail = "cannot judge: the interval straddles the threshold; " + detail
    return ThresholdResult(name, "flips", status, f"{obs}, upper bound {_pct(b.upper)}", thr, detail)


def _sequential_delta_result(check: Check, an: Analysis, arm: str, recorded: Any, name: str, thr: str,
                             d: dict[str, Any]) -> ThresholdResult:
    """A run made with ``kvaudit run --until-decided`` is judged by the boundary of the look it
    stopped at, never by the fixed-sample bound (that would spend alpha at every look and inflate
    the false-pass rate); a run whose case count is not one of its planned looks (extended past its
    design, or cut short between looks) cannot pass."""
    from kvaudit.stats.sequential import design_from_dict

    try:
        if not isinstance(recorded, dict):
            raise ValueError("the manifest's 'sequential' entry is not an object")
        plan = design_from_dict(recorded)
        if abs(plan.alpha - (1 - an.confidence) / 2) > 1e-9:
            raise ValueError(f"the run was designed at one-sided alpha {plan.alpha:g}, the policy asks for "
                             f"{(1 - an.confidence) / 2:g} (confidence {an.confidence:g})")
    except ValueError as e:
        return ThresholdResult(name, "delta", "error", "sequential design unreadable", thr, f"cannot judge: {e}")
    n = len(an.run.pairs)
    look = plan.look_of(n)
    if look is None:
        why = (f"{n} cases, past the design's maximum of {plan.max_cases}" if n > plan.max_cases
               else f"{n} cases is not one of the design's looks ({', '.join(map(str, plan.looks))})")
        return ThresholdResult(name, "delta", "error", f"delta {d['delta']:+.1f} pts at no planned look", thr,
                               f"cannot judge: a sequential run is judged only at a planned look: {why}")
    margin = check.params["min_lower_bound"]
    res = an.sequential_decision(arm, check.params["group"], margin, plan, look)
    status = {"pass": "pass", "fail": "fail"}.get(res.decision, "error")
    lo = "–" if res.lower is None else f"{100 * res.lower:+.1f}"
    hi = "–" if res.upper is None else f"{100 * res.upper:+.1f}"
    detail = (f"sequential design, look {look + 1} of {len(plan.looks)} at {n} cases: delta {d['delta']:+.1f} pts, "
              f"lower bound {lo} pts at one-sided {res.nominal_alpha:.2g}, upper {hi} pts (fail rule)"
              + (f"; {res.reason}" if res.reason else "")
              + ("; not decided at this look: run on to the next" if res.decision == "continue" else ""))
    return ThresholdResult(name, "delta", status, f"lower bound {lo} pts (look {look + 1})", thr, detail)


def cases_needed(delta: dict[str, Any], margin_points: float, *,
                 confidence: float = DEFAULT_CONFIDENCE) -> int | None:
    """Approximate cases needed for 80% power at a true delta of 0 against ``margin_points``
    (normal approximation with the run's design effect and spread, floored at the spread a
    loss rate equal to the margin would give); ``kvaudit plan`` simulates it exactly."""
    from scipy.stats import norm

    m = abs(margin_points) / 100
    if m <= 0 or delta["n"] == 0:
        return None
    var = max(delta.get("var") or 0.0, m * (1 - m))
    z = norm.ppf((1 + confidence) / 2) + norm.ppf(0.80)
    return int(math.ceil(max(delta.get("deff") or 1.0, 1.0) * var * (z / m) ** 2))


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
        r = _delta_result(c, an, NOISE_ARM, label=label) if c.kind == "delta" else _flip_result(c, an, NOISE_ARM,
                                                                                                  label=label)
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


def verdict(results: list[ThresholdResult]) -> str:
    """``fail`` if any check failed (a failed threshold is a decision even where other rows could
    not be judged), else ``error`` (cannot judge) if any check could not be judged or no quality
    threshold (:data:`QUALITY_KINDS`) reached pass or fail (all skipped, or no rows), else ``pass``."""
    statuses = {r.status for r in results}
    if "fail" in statuses:
        return "fail"
    if "error" in statuses or not _judged(results):
        return "error"
    return "pass"
