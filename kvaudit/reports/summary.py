"""``RUN/summary.json``: every number of the report, machine-readable.

Top-level keys:

``run``          path, number of cases, arms (with the reason each exists), manifest scalars
``audit``        ``{"ran", "state", "reason", "verdict", "passed", "checks"}``: ``audit.json``
                 verified against the run's files and re-derived (kvaudit.audit.trust)
``gate``         policy source, verdict (pass / fail / error) and one entry per threshold
``comparisons``  per compared arm, one row per group (overall, ``task:*``, strata): n, clusters,
                 mean per arm and delta (points), CI, one-sided bounds, test, p, Holm p, MDD
``flips``        per compared arm: flip rate with Wilson CI, near-tie flips, logit differences
``noise_floor``  the ``recompute_again`` flips entry (None when the arm was not run)
``flip_excess``  per compared arm: its flip rate minus the noise floor's on the same cases
                 (points) with the paired interval (empty when recompute_again did not run)
``flips_by_group`` per compared arm (``recompute_again`` included: the noise floor), one row per
                 group (overall, task families, strata): n, flips, rate, Wilson CI
``leaks``        :func:`kvaudit.stats.leaks.leak_summary`
``security``     :func:`kvaudit.reports.security.security_summary` (tenant isolation, timing, cold/flushed/warm)
``hit_rate``     per arm measured token hit rate; ``simulated`` entries from simulation.json
``ttft``         per arm seconds (n, mean, p50, p90, p99); ``speedup`` per arm vs recompute;
                 ``ttft_parts`` per arm, where recorded, the medians of the head's own request,
                 the engine's own first-token time and the client's rest
``coverage``     reuse-dynamics coverage from the manifest's ``dataset.coverage`` or None
``routing``      per task family: safe / unsafe / undecided for the policy's arm, with the reason
``frontier``     the repairs' quality-for-speed frontier per task family, with the cheapest
                 non-inferior arm, and the oracle's split of reuse's loss (:mod:`kvaudit.reports.frontier`)
``serving_change`` a serving-change run's change, declared keys, engines as given, every recorded
                 configuration key where an engine differs from the baseline (declared or not), and per
                 engine arm the median per-case TTFT and decode-time ratios with their intervals
                 (None for a run of one engine)
``cross_backend`` (``kvaudit report --compare``) this run against each other run of the same cases
``cases_needed`` each delta threshold that did not pass and each undecided task family, with the
                 cases the run has and about how many a decision needs (policy.cases_needed)
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, NotRequired, TypedDict

import numpy as np

from kvaudit.core.arms import NOISE_ARM, REFERENCE_ARM, reference_of
from kvaudit.reports.analysis import Analysis, arm_reason
from kvaudit.reports.frontier import build_frontier
from kvaudit.reports.policy import Policy, evaluate, verdict
from kvaudit.stats.paired import PairedDelta


def route(delta: PairedDelta, margin: float, *, confidence: float = 0.95) -> tuple[str, str]:
    """Routing recommendation for one task family from its paired delta and margin (points).

    safe: the interval's lower end clears the margin (non-inferior);
    unsafe: even its upper end is below the margin (worse than the margin with confidence);
    undecided otherwise, saying whether the run was too small to tell and, then, about how many
    cases a decision would need (``kvaudit plan`` simulates it).
    """
    from kvaudit.reports.policy import cases_needed

    lb, ub, mdd = delta.lower_bound, delta.upper_bound, delta.mdd
    need = cases_needed(delta, margin, confidence=confidence)
    needs = f"; about {need} cases needed (`kvaudit plan`)" if need and need > delta.n else ""
    if lb is None or ub is None:  # both or neither: no interval
        return "undecided", f"{delta.reason or 'too few cases to bound'}{needs}"
    if lb >= margin:
        return "safe", f"lower bound {lb:+.1f} ≥ margin {margin:+.1f}"
    if ub < margin:
        return "unsafe", f"upper bound {ub:+.1f} < margin {margin:+.1f}"
    if mdd is not None and mdd > abs(margin):
        return "undecided", (f"too few cases: the smallest detectable delta ({mdd:.1f} pts) "
                             f"is larger than the margin ({abs(margin):.1f}){needs}")
    return "undecided", f"interval [{lb:+.1f}, {ub:+.1f}] straddles margin {margin:+.1f}{needs}"


def routing(an: Analysis, policy: Policy) -> list[dict[str, Any]]:
    out = []
    for task in an.tasks:
        margin = policy.margin_for_task(task)
        d = an.delta(policy.arm, f"task:{task}")
        if margin is None or d.n == 0:
            rec, why = "undecided", ("no margin in the policy" if margin is None
                                     else f"no cases with arm '{policy.arm}'")
        else:
            rec, why = route(d, margin, confidence=an.confidence)
        out.append({"task": task, "recommendation": rec, "reason": why, "margin": margin,
                    "delta": d.delta, "lower_bound": d.lower_bound, "n": d.n})
    return out


def cases_needed_rows(an: Analysis, policy: Policy, gate: list[Any],
                      routes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Open decisions and about how many cases each needs (80% power to pass at a true delta
    of 0; :func:`kvaudit.reports.policy.cases_needed`, which ``kvaudit plan`` simulates exactly):
    one row per delta threshold whose gate row did not pass while its interval still reaches the
    margin (or has no interval), one per noise-floor control that did not pass (recompute against
    itself must clear the same margin), one per undecided task family."""
    from kvaudit.reports.policy import cases_needed

    status = {r.name: r.status for r in gate}
    out = []
    for c in policy.checks:
        if c.kind != "delta" or status.get(c.name) == "pass":
            continue
        d = an.delta(policy.arm, c.params["group"])
        if d.decidable and d.upper_bound < c.params["min_lower_bound"]:
            continue  # decided: even the upper end misses the margin, more cases will not pass it
        need = cases_needed(d, c.params["min_lower_bound"], confidence=an.confidence) if d.n else None
        out.append({"kind": "threshold", "name": c.name, "group": c.params["group"],
                    "margin": c.params["min_lower_bound"], "status": status.get(c.name), "n": d.n,
                    "needed": need if need and need > d.n else None})
    noise = {r.name: r for r in gate if r.kind == "noise_control" and r.status != "pass"}
    for c in policy.checks:
        name = f"{c.name}: noise floor ({NOISE_ARM})"
        if c.kind != "delta" or name not in noise:
            continue
        d = an.delta(NOISE_ARM, c.params["group"])
        need = cases_needed(d, c.params["min_lower_bound"], confidence=an.confidence) if d.n else None
        out.append({"kind": "noise floor", "name": name, "group": c.params["group"],
                    "margin": c.params["min_lower_bound"], "status": noise[name].status, "n": d.n,
                    "needed": need if need and need > d.n else None})
    for r in routes:
        if r["recommendation"] != "undecided" or r["margin"] is None or not r["n"]:
            continue
        d = an.delta(policy.arm, f"task:{r['task']}")
        need = cases_needed(d, r["margin"], confidence=an.confidence)
        out.append({"kind": "routing", "name": r["task"], "group": f"task:{r['task']}",
                    "margin": r["margin"], "status": "undecided", "n": d.n,
                    "needed": need if need and need > d.n else None})
    return out


def _scalar(v: Any) -> Any:
    return v if isinstance(v, (str, int, float)) else None


def _scalars(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, (str, int, float, bool)) or v is None}


def jsonable(obj: Any) -> Any:
    """numpy scalars to Python, NaN/inf to None, tuples to lists, recursively."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


class RunSummary(TypedDict):
    """summary.json's record: its top-level keys (the module docstring says what each holds), so a
    key misspelled where the summary is built is a type error, not a report section gone blank."""

    run: dict[str, Any]
    audit: dict[str, Any]
    gate: dict[str, Any]
    comparisons: dict[str, list[dict[str, Any]]]
    flips: dict[str, dict[str, Any] | None]
    noise_floor: dict[str, Any] | None
    flip_excess: dict[str, dict[str, Any] | None]
    flips_by_group: dict[str, list[dict[str, Any]]]
    leaks: dict[str, Any]
    security: dict[str, Any]
    hit_rate: dict[str, Any]
    ttft: dict[str, Any]
    ttft_parts: dict[str, dict[str, Any]]
    speedup: dict[str, Any]
    coverage: dict[str, Any] | None
    routing: list[dict[str, Any]]
    frontier: dict[str, Any]
    cases_needed: list[dict[str, Any]]
    serving_change: dict[str, Any] | None
    cross_backend: NotRequired[list[dict[str, Any]]]  # added by `kvaudit report --compare`


def build_summary(an: Analysis, policy: Policy) -> RunSummary:
    run = an.run
    gate = evaluate(policy, an)
    audit = run.audit
    m = run.manifest
    as_written = m.to_dict()
    reasons = m.arm_reasons or {}
    routes = routing(an, policy)
    summary: RunSummary = {
        "run": {
            "path": str(run.path),
            "n_cases": len(run.pairs),
            "n_quality_cases": int(len(an.select("overall"))),
            "arms": [{"name": a, "reason": reasons.get(a) or arm_reason(a)} for a in an.arms],
            "backend": _scalar((m.backend or {}).get("backend")),
            # cases run N at a time (--concurrent-cases): what TTFT means there
            "batching": jsonable((m.backend or {}).get("batching")),
            # new heads for segment reuse: prefilled in the loading request's engine step, or one before
            "head_steps": jsonable((m.backend or {}).get("head_steps")),
            # a top-level dtype is what synthetic runs recorded before the manifest had a format
            "dtype": _scalar(m.extra.get("dtype")) or (m.model.dtype if m.model else None),
            "manifest": _scalars(as_written),
            "model": _scalars(as_written["model"]) if m.model else None,
            "near_tie_threshold": an.near_tie,
            "confidence": an.confidence,
            "interval": "score interval (Tango for 0/1 scores) with a network-robust document design "
                        "effect; two-sided at confidence, each end a one-sided bound at (1 + confidence) / 2",
            "cluster_key": "the documents a case rests on (evidence segment ids, else all its segment "
                           "ids); cases sharing any document are dependent",
            "n_expected_cases": run.n_expected,
            "missing_cases": run.missing_cases,
        },
        "audit": {"ran": audit.state != "missing", "state": audit.state, "reason": audit.reason,
                  "verdict": audit.verdict, "passed": audit.passed,
                  "checks": [asdict(c) for c in audit.checks]},
        "gate": {"policy": policy.source, "arm": policy.arm, "verdict": verdict(gate),
                 "checks": [asdict(r) for r in gate]},
        "comparisons": {arm: [r.as_dict() for r in an.comparisons(arm)] for arm in an.compared_arms},
        "flips": {arm: (f.as_dict() if (f := an.flips(arm)) else None) for arm in an.compared_arms},
        "noise_floor": (f.as_dict() if NOISE_ARM in an.arms and (f := an.flips(NOISE_ARM)) else None),
        "flip_excess": {arm: (fe.as_dict() if (fe := an.flip_excess(arm)) else None) for arm in an.compared_arms
                        if arm != NOISE_ARM}
        if NOISE_ARM in an.arms else {},
        "flips_by_group": {arm: an.flips_by_group(arm) for arm in an.compared_arms},
        "leaks": an.leaks,
        "security": an.security,
        "hit_rate": {"measured": {a: an.hit_rate(a) for a in an.arms},
                     "segment": {a: an.hit_rate(a, "segment") for a in an.arms},
                     "simulated": an.simulated_hit_rates() or None},
        "ttft": {a: an.ttft(a) for a in an.arms},
        "ttft_parts": {a: parts for a in an.arms if (parts := an.ttft_parts(a))},
        "speedup": {a: an.speedup(a) for a in an.compared_arms},
        "coverage": an.coverage,
        "routing": routes,
        "frontier": build_frontier(an, policy),
        "cases_needed": cases_needed_rows(an, policy, gate, routes),
        "serving_change": serving_change_summary(an),
    }
    return jsonable(summary)


def serving_change_summary(an: Analysis) -> dict[str, Any] | None:
    """The serving change side by side (see the module docstring); None for one engine."""
    from kvaudit.runners.serving_change import undeclared
    from kvaudit.stats.speed import METRICS

    sc = an.run.manifest.serving_change
    if sc is None:
        return None
    configs = sc.configurations
    base = configs.get("baseline", {})
    roles = [r for r in ("baseline", "candidate", "candidate_off") if r in configs]
    keys = sorted({k for r in roles for k in configs[r]} - {k for k in base if all(
        configs[r].get(k) == base[k] for r in roles)})
    bad = {k for r in roles for k in undeclared(base, configs[r], sc.declares)}
    differences = [{"key": k, "values": {r: configs[r].get(k) for r in roles}, "declared": k not in bad}
                   for k in keys]
    speed = []
    for arm in an.arms:
        if arm == REFERENCE_ARM:
            continue
        for metric in METRICS:
            iv = an.speed(arm, metric)
            if iv is not None:
                a, b = an.times(arm, metric)
                speed.append({"arm": arm, "reference": reference_of(arm), "metric": metric, **asdict(iv),
                              "arm_p50": float(np.median(a)), "reference_p50": float(np.median(b))})
    return {"change": sc.change, "declares": list(sc.declares), "specs": sc.specs, "roles": roles,
            "differences": differences, "speed": speed}
