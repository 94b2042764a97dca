"""The audit's check registry, the result type, and what the checks share.

A check is a function of a :class:`~kvaudit.audit.checks.loading.LoadedRun` registered with
:func:`check` under its name and whether it is required; it returns a :class:`CheckResult`
(built with :func:`result` or :func:`from_problems`, which leave the name and the required
flag to the registry). :func:`kvaudit.audit.checks.run_checks` runs the registry in report
order: the order of the concern modules in :data:`kvaudit.audit.checks.CONCERNS`, then the
order of definition within a module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvaudit.core.arms import REFERENCE_ARM, evidence_only, get_arm, known_arm, repair_count
from kvaudit.core.audit_format import CheckResult
from kvaudit.core.registry import Registry
from kvaudit.core.run_format import PairRecord, flipped

ALPHA = 0.05
# The roles of a pure serving-change run's arms: full prefills on either engine and noise floors.
SERVING_CHANGE_ROLES = ("reference", "noise_floor", "candidate", "candidate_noise_floor", "candidate_control")
MAX_LISTED = 5  # problems spelled out in a detail string; the rest are counted


# What a check is about (``scope``): every run, the reuse of cached KV (its arms, caches, leaks and
# coverage), a serving change (two engine configurations, ``kvaudit run --engines``), or what a
# serving engine reported over HTTP (a server run).
SCOPES = ("all", "reuse", "serving_change", "server")


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: ``options`` are the :func:`run_checks` keyword arguments it takes;
    ``scope`` (:data:`SCOPES`) the runs it applies to (:func:`applies`)."""

    name: str
    required: bool
    fn: Callable[..., CheckResult]
    options: tuple[str, ...] = ()
    scope: str = "all"


REGISTRY: Registry[CheckSpec] = Registry("audit check")


def check(name: str, *, required: bool, options: tuple[str, ...] = (), scope: str = "all") -> Callable:
    """Register a check under ``name``; the returned function fills in its results' name and
    required flag, so a check never spells them itself. On a run outside its ``scope`` the check
    is not called: its result says it does not apply (:func:`applies`)."""
    if scope not in SCOPES:
        raise ValueError(f"check {name!r}: scope {scope!r} is not one of {SCOPES}")

    def register(fn: Callable[..., CheckResult]) -> Callable[..., CheckResult]:
        @functools.wraps(fn)
        def run(loaded, *args, **kwargs) -> CheckResult:
            why = applies(scope, loaded)
            if why is not None:
                return CheckResult(name, True, required, f"does not apply: {why}", not_applicable=True)
            return replace(fn(loaded, *args, **kwargs), name=name, required=required)

        REGISTRY.register(CheckSpec(name, required, run, options, scope))
        return run

    return register


def applies(scope: str, run) -> str | None:
    """Why a check of ``scope`` does not apply to ``run`` (``None``: it applies). Reuse checks
    apply to every run but a serving-change run whose arms are only the two engines' full prefills
    and their noise floors; serving-change checks only to serving-change runs."""
    change = getattr(run.manifest, "serving_change", None)
    if scope == "server" and not any(r.engine is not None for p in run.pairs for r in p.arms.values()):
        return "not a server run (no arm recorded what a serving engine reported)"
    if scope == "serving_change" and change is None:
        return "not a serving-change run (no --engines)"
    if scope == "reuse" and change is not None:
        arms = set(run.manifest.arms or ()) | {a for p in run.pairs for a in p.arms}
        if all(known_arm(a) and get_arm(a).role in SERVING_CHANGE_ROLES for a in arms):
            return f"a serving-change run ({change.change}): no arm reuses cached KV"
    return None


def not_run(what: str, warning: str | None = None) -> CheckResult:
    """The result of a check whose arms or probes this run did not have: shown as "not run", never
    as "pass"; like a check that does not apply, it neither passes nor fails the audit."""
    return CheckResult("", True, False, f"not run: {what}", [], warning, not_applicable=True)


def result(passed: bool, detail: str, failing_cases: list[str] | None = None,
           warning: str | None = None, *, cannot_judge: bool = False) -> CheckResult:
    """A result whose name and required flag the registry fills in."""
    return CheckResult("", passed, False, detail, list(failing_cases or []), warning, cannot_judge)


def from_problems(problems: dict[str, list[str]], ok: str, warning: str | None = None,
                  extra: str = "") -> CheckResult:
    """A result from per-case problems (case id -> messages); no problems means passed."""
    if not problems:
        return result(True, ok + extra, [], warning)
    msgs = [f"{cid}: {m}" for cid, ms in problems.items() for m in ms]
    more = f"; and {len(msgs) - MAX_LISTED} more" if len(msgs) > MAX_LISTED else ""
    detail = f"{len(problems)} case(s) fail: " + "; ".join(msgs[:MAX_LISTED]) + more + extra
    return result(False, detail, list(problems), warning)


# --------------------------------------------------------------------------- shared helpers


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def short(v: object, n: int = 60) -> str:
    s = str(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def is_reuse_arm(name: str) -> bool | None:
    """True for arms whose segment KV comes from a cache, False for recomputes, None if unknown."""
    if known_arm(name):
        return get_arm(name).source is not None
    return None


def source(name: str) -> str | None:
    return get_arm(name).source if known_arm(name) else None


def arm_segments(p: PairRecord, name: str) -> list[str]:
    """The segment ids in the prompt arm ``name`` consumed: the pair's, or for an evidence-prompt
    arm (the oracle pair) its kept evidence segments (:func:`kvaudit.core.arms.evidence_only`)."""
    if known_arm(name) and get_arm(name).prompt == "evidence":
        return evidence_only(p.segment_ids, p.evidence, bool(p.canary))
    return list(p.segment_ids)


def arm_spans(p: PairRecord, name: str) -> list[tuple[int, int]]:
    """The pair's spans of the segments arm ``name`` consumed (a unit has the same length
    wherever it sits, so an evidence prompt's segment lengths are these spans' lengths)."""
    keep = set(arm_segments(p, name))
    return [(int(s), int(e)) for sid, (s, e) in zip(p.segment_ids, p.segment_spans) if sid in keep]


def recomputed_expected(p: PairRecord, name: str) -> int:
    """Segment tokens a repair arm must recompute on this pair (0 for every other arm)."""
    return repair_count(get_arm(name), arm_spans(p, name)) if known_arm(name) else 0


def flips_vs_reference(run, arm: str) -> dict[str, bool]:
    """Per case holding ``arm`` and the reference: whether ``arm``'s answer flipped."""
    return {p.case_id: flipped(p.arms[arm], p.arms[REFERENCE_ARM])
            for p in run.pairs if arm in p.arms and REFERENCE_ARM in p.arms}


def logit_diffs(run, arm: str) -> list[float]:
    """``arm``'s recorded, finite first-token differences against the reference."""
    out = []
    for p in run.pairs:
        r = p.arms.get(arm)
        if r is not None and r.logit_diff_vs_recompute is not None and math.isfinite(r.logit_diff_vs_recompute):
            out.append(float(r.logit_diff_vs_recompute))
    return out


def reused_expected(p: PairRecord, name: str | None = None) -> int:
    """Segment tokens an arm must reuse: every segment token of its prompt (the pair's, or the
    oracle's evidence segments), less what a repair arm recomputes."""
    if name is None:
        return sum(int(e) - int(s) for s, e in p.segment_spans)
    return sum(e - s for s, e in arm_spans(p, name)) - recomputed_expected(p, name)


def server_decides_reuse(run) -> bool:
    """The run's reuse arms ran on a server's own reuse path (``--reuse-protocol server``): what
    they reuse is the server's to decide and report, and no in-context KV can be fed to it."""
    return (run.manifest.backend or {}).get("reuse_protocol") == "server"


def probe_role(name: str) -> bool:
    """A tenant probe: a request that must find nothing cached (the server checks judge it)."""
    return known_arm(name) and get_arm(name).role in ("tenant_probe", "segment_tenant_probe")
