"""The quality rows: ``[[delta]]`` (a score delta's one-sided bound against a margin, or a
sequential run's boundary at the look it stopped at) and ``[flips]`` (how often the arm's answer
differs from recompute's, against a maximum rate). Both have three outcomes: pass when the whole
interval clears the threshold, fail when the whole interval is beyond it (a confirmed loss), cannot
judge when it straddles it (the run is too small to tell), so that a fail is a decision the gate can
rank first.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kvaudit.core.errors import KvauditError
from kvaudit.core.vocabulary import GateStatus
from kvaudit.reports.gate_checks.base import (
    Check,
    Table,
    ThresholdResult,
    evaluates,
    missing_result,
    number,
    pct,
    section,
)
from kvaudit.stats.noninferiority import DEFAULT_CONFIDENCE
from kvaudit.stats.paired import PairedDelta

if TYPE_CHECKING:
    from kvaudit.reports.analysis import Analysis


@section("delta", {"name", "group", "min_lower_bound", "missing"}, many=True)
def parse_delta(table: dict[str, Any], t: Table) -> list[Check]:
    group = table.get("group")
    if not isinstance(group, str) or not (group == "overall" or ":" in group):
        raise KvauditError(f"{t.field('group')} must be 'overall', 'task:<glob>' or '<stratum>:<glob>'")
    bound = number(f"{t.field('min_lower_bound')} (points)", table.get("min_lower_bound"), -100.0, 100.0)
    name = table.get("name", group)
    if not isinstance(name, str):
        raise KvauditError(f"{t.field('name')} must be a string")
    return [Check(name, "delta", {"group": group, "min_lower_bound": bound}, t.missing)]


@section("flips", {"max_rate", "missing"})
def parse_flips(sec: dict[str, Any], t: Table) -> list[Check]:
    mx = number(t.field("max_rate"), sec.get("max_rate"), 0.0, 1.0)
    return [Check("answers changed vs recompute", "flips", {"max_rate": mx}, t.missing)]


@evaluates("delta")
def delta_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    p, name = check.params, check.name
    thr = f"lower bound ≥ {p['min_lower_bound']:+.1f} pts"
    d = an.delta(arm, p["group"])
    if d.n == 0:
        return missing_result(check, "no cases", thr,
                              f"no answer-quality cases with arm '{arm}' match group '{p['group']}'")
    if not d.decidable:
        need = cases_needed(d, p["min_lower_bound"], confidence=an.confidence)
        return ThresholdResult(name, "delta", "error", f"delta {d.delta:+.1f} pts, no bound", thr,
                               f"cannot judge: {d.reason}" + (f"; about {need} cases needed "
                                                             "(`kvaudit plan` simulates it)" if need else ""))
    sequential = an.run.manifest.extra.get("sequential")
    if sequential is not None:
        return _sequential_delta_result(check, an, arm, sequential, thr, d)
    margin = p["min_lower_bound"]
    status: GateStatus = ("pass" if d.lower_bound >= margin else
              "fail" if d.upper_bound < margin else "error")
    detail = (f"delta {d.delta:+.1f} pts, {an.confidence:.0%} interval [{d.lower_bound:+.1f}, "
              f"{d.upper_bound:+.1f}], n={d.n} on {d.n_clusters} documents "
              f"(design effect {d.deff:.2f}), MDD {d.mdd:.1f} pts")
    if status == "error":
        need = cases_needed(d, margin, confidence=an.confidence)
        detail = ("cannot judge: the interval straddles the margin; " + detail
                  + (f"; about {need} cases would be needed to pass a true delta of 0" if need and need > d.n
                     else ""))
    return ThresholdResult(name, "delta", status, f"lower bound {d.lower_bound:+.1f} pts", thr, detail)


@evaluates("flips")
def flip_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    """The arm's flip rate against ``max_rate``: pass when the interval's upper end is within it,
    fail when its lower end is above it, else cannot judge."""
    mx, name = check.params["max_rate"], check.name
    thr = f"upper bound ≤ {pct(mx)}"
    b = an.flip_bound(arm)
    if b is None:
        return missing_result(check, "no cases", thr, f"arm '{arm}' has no answers compared with recompute's")
    assert b.mean is not None  # b.n > 0
    k = round(b.mean * b.n)
    obs = f"{k} of {b.n} ({pct(b.mean)})"
    if not b.decidable:
        return ThresholdResult(name, "flips", "error", obs + ", no bound", thr, f"cannot judge: {b.reason}")
    assert b.lower is not None and b.upper is not None
    status: GateStatus = "pass" if b.upper <= mx else "fail" if b.lower > mx else "error"
    detail = (f"{an.confidence:.0%} interval [{pct(max(0.0, b.lower))}, {pct(b.upper)}] on {b.n_clusters} documents "
              f"(design effect {b.deff:.2f})")
    if status == "error":
        detail = "cannot judge: the interval straddles the threshold; " + detail
    return ThresholdResult(name, "flips", status, f"{obs}, upper bound {pct(b.upper)}", thr, detail)


def _sequential_delta_result(check: Check, an: Analysis, arm: str, recorded: Any, thr: str,
                             d: PairedDelta) -> ThresholdResult:
    """A run made with ``kvaudit run --until-decided`` is judged by the boundary of the look it
    stopped at, never by the fixed-sample bound (that would spend alpha at every look and inflate
    the false-pass rate); a run whose case count is not one of its planned looks (extended past its
    design, or cut short between looks) cannot pass."""
    from kvaudit.stats.sequential import design_from_dict

    name = check.name
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
        return ThresholdResult(name, "delta", "error", f"delta {d.delta:+.1f} pts at no planned look", thr,
                               f"cannot judge: a sequential run is judged only at a planned look: {why}")
    margin = check.params["min_lower_bound"]
    res = an.sequential_decision(arm, check.params["group"], margin, plan, look)
    status: GateStatus = "pass" if res.decision == "pass" else "fail" if res.decision == "fail" else "error"
    lo = "–" if res.lower is None else f"{100 * res.lower:+.1f}"
    hi = "–" if res.upper is None else f"{100 * res.upper:+.1f}"
    detail = (f"sequential design, look {look + 1} of {len(plan.looks)} at {n} cases: delta {d.delta:+.1f} pts, "
              f"lower bound {lo} pts at one-sided {res.nominal_alpha:.2g}, upper {hi} pts (fail rule)"
              + (f"; {res.reason}" if res.reason else "")
              + ("; not decided at this look: run on to the next" if res.decision == "continue" else ""))
    return ThresholdResult(name, "delta", status, f"lower bound {lo} pts (look {look + 1})", thr, detail)


def cases_needed(delta: PairedDelta, margin_points: float, *,
                 confidence: float = DEFAULT_CONFIDENCE) -> int | None:
    """Approximate cases needed for 80% power at a true delta of 0 against ``margin_points``
    (normal approximation with the run's design effect and spread, floored at the spread a
    loss rate equal to the margin would give); ``kvaudit plan`` simulates it exactly."""
    from scipy.stats import norm

    m = abs(margin_points) / 100
    if m <= 0 or delta.n == 0:
        return None
    var = max(delta.var or 0.0, m * (1 - m))
    z = norm.ppf((1 + confidence) / 2) + norm.ppf(0.80)
    return int(math.ceil(max(delta.deff or 1.0, 1.0) * var * (z / m) ** 2))
