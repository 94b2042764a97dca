"""The repairs' quality-for-speed frontier, per task family, and the oracle's split of reuse's loss.

**Frontier.** For each task family (and overall), one point per arm of a frontier role
(:data:`kvaudit.core.arms.FRONTIER_ROLES`: the arm under test and every repair arm, ``blend@R``
and ``epic@K``): its paired quality delta against the reference with the interval the gate uses
(:meth:`kvaudit.reports.analysis.Analysis.delta`), the share of segment tokens it recomputed
(``1 - tokens_reused / segment tokens``, summed over the family's cases), its median time to
first token and the speed-up over the reference (ratio of the two medians on the same cases),
and, for repairs, the median seconds of its selection step (``ArmResult.repair``; inside TTFT).

**Routing line.** Per family, the cheapest arm (lowest median TTFT) among those that are
non-inferior at the policy's margin for that family (:meth:`kvaudit.reports.policy.Policy.margin_for_task`:
the interval's lower end at or above the margin), or none (route to the reference), saying why.

**Oracle split.** The ``oracle`` pair runs recompute and reuse on the prompt that keeps only the
case's evidence segments, so ``oracle`` is compared only with ``oracle_recompute`` (never with
recompute: the prompt differs). Per family: reuse's loss on the full prompt; the oracle's loss
on the evidence-only prompt, which is what is left without distractors (missing
cross-attention between the evidence segments); their difference, the part of the loss that
comes with the distractors; and ``oracle_recompute`` against recompute, what removing the
distractors does to the model itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvaudit.core.arms import (
    FRONTIER_ROLES,
    ORACLE_ARM,
    ORACLE_REFERENCE_ARM,
    REFERENCE_ARM,
    UNDER_TEST_ARM,
    get_arm,
    known_arm,
)
from kvaudit.core.repair_log import repair_accounts
from kvaudit.reports.analysis import Analysis
from kvaudit.reports.policy import Policy


def frontier_arms(an: Analysis) -> list[str]:
    """The run's arms of a frontier role, in run order."""
    return [a for a in an.compared_arms if known_arm(a) and get_arm(a).role in FRONTIER_ROLES]


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def frontier_point(an: Analysis, arm: str, group: str, repairs: dict[tuple[str, str], dict[str, Any]],
                   margin: float | None) -> dict[str, Any]:
    """One arm on one group: delta and interval, recomputed share, median TTFT, speed-up, selection cost."""
    d = an.delta(arm, group)
    ids = set(an.select(group))
    seg = recomputed = 0
    t_arm, t_ref, select = [], [], []
    for p in an.run.pairs:
        r, ref = p.arms.get(arm), p.arms.get(REFERENCE_ARM)
        if p.case_id not in ids or r is None or ref is None:
            continue
        n = sum(int(e) - int(s) for s, e in p.segment_spans)
        seg += n
        recomputed += n - r.tokens_reused
        t_arm.append(float(r.ttft_s))
        t_ref.append(float(ref.ttft_s))
        acct = repairs.get((p.case_id, arm))
        if acct is not None and isinstance(acct.get("select_s"), (int, float)):
            select.append(float(acct["select_s"]))
    med_arm, med_ref = _median(t_arm), _median(t_ref)
    lb = d.lower_bound
    return {
        "arm": arm, "group": group, "n": d.n, "n_clusters": d.n_clusters, "delta": d.delta,
        "ci": d.ci, "lower_bound": lb, "upper_bound": d.upper_bound, "decidable": d.decidable,
        "reason": d.reason, "recomputed_share": recomputed / seg if seg else None,
        "ttft_median": med_arm, "ref_ttft_median": med_ref,
        "speedup": med_ref / med_arm if med_arm and med_ref else None,
        "select_median": _median(select) if get_arm(arm).repair else None,
        "non_inferior": bool(margin is not None and lb is not None and lb >= margin),
    }


def route_cheapest(points: list[dict[str, Any]], margin: float | None) -> dict[str, Any]:
    """The cheapest non-inferior arm of one family's points (lowest median TTFT), or none."""
    if margin is None:
        return {"arm": None, "reason": "the policy sets no margin for this family"}
    ok = [p for p in points if p["non_inferior"] and p["ttft_median"] is not None]
    if not ok:
        undecided = [p["arm"] for p in points if p["lower_bound"] is None]
        why = (f"no arm's lower bound clears the margin {margin:+.1f}"
               + (f" ({len(undecided)} of {len(points)} arms have too few cases for a bound)" if undecided else ""))
        return {"arm": None, "reason": why + f": route to {REFERENCE_ARM}"}
    best = min(ok, key=lambda p: p["ttft_median"])
    speed = f", {best['speedup']:.2f}x faster than {REFERENCE_ARM}" if best["speedup"] else ""
    others = len(ok) - 1
    return {"arm": best["arm"],
            "reason": (f"lowest median TTFT ({best['ttft_median']:.3f} s{speed}) among {len(ok)} arm(s) whose "
                       f"lower bound clears the margin {margin:+.1f}" + ("" if others else " (the only one)"))}


def oracle_split(an: Analysis) -> list[dict[str, Any]]:
    """Per group (overall, then task families) where the oracle pair ran: reuse's loss, the
    oracle's (missing cross-attention), their difference (distractors) and the model's own
    distractor effect (``oracle_recompute`` vs recompute)."""
    if ORACLE_ARM not in an.arms or ORACLE_REFERENCE_ARM not in an.arms:
        return []
    out = []
    for group in ["overall"] + [f"task:{t}" for t in an.tasks]:
        full = an.delta(UNDER_TEST_ARM, group) if UNDER_TEST_ARM in an.arms else None
        oracle = an.delta(ORACLE_ARM, group)
        model = an.delta(ORACLE_REFERENCE_ARM, group)
        if oracle.n == 0:
            continue
        distractors = (full.delta - oracle.delta
                       if full is not None and full.delta is not None and oracle.delta is not None else None)
        out.append({"group": group, "n": oracle.n,
                    "reuse_delta": full.delta if full else None, "reuse_ci": full.ci if full else None,
                    "oracle_delta": oracle.delta, "oracle_ci": oracle.ci,
                    "distractor_part": distractors,
                    "model_distractor_delta": model.delta, "model_distractor_ci": model.ci})
    return out


def build_frontier(an: Analysis, policy: Policy) -> dict[str, Any]:
    """The report's ``frontier`` entry: ``arms``, one entry per group (``group``, ``task``,
    ``margin``, ``points``, ``route``), the ``oracle`` split, and what the numbers are."""
    arms = frontier_arms(an)
    repairs = repair_accounts(an.run.pairs)
    groups = []
    for group, task in [("overall", None)] + [(f"task:{t}", t) for t in an.tasks]:
        margin = policy.margin_for_task(task) if task else _overall_margin(policy)
        points = [frontier_point(an, a, group, repairs, margin) for a in arms]
        points = [p for p in points if p["n"]]
        if points:
            groups.append({"group": group, "task": task, "margin": margin, "points": points,
                           "route": route_cheapest(points, margin)})
    return {
        "arms": arms,
        "groups": groups if any(get_arm(a).repair for a in arms) else [],
        "oracle": oracle_split(an),
        "reference": REFERENCE_ARM,
        "cost": "median TTFT per arm on the group's cases, selection and recomputation included; speed-up "
                f"= median TTFT of {REFERENCE_ARM} / the arm's on the same cases",
    }


def _overall_margin(policy: Policy) -> float | None:
    for c in policy.checks:
        if c.kind == "delta" and c.params["group"] == "overall":
            return c.params["min_lower_bound"]
    return None
