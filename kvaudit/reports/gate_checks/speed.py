"""The speed rows (``[[speed]]``): the median per-case time ratio of the arm over its reference
and its distribution-free interval (:mod:`kvaudit.stats.speed`), judged against a maximum ratio
or a minimum speed-up; beside quality, never instead of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvaudit.core.arms import NOISE_ARM, get_arm, reference_of
from kvaudit.core.errors import KvauditError
from kvaudit.reports.gate_checks.base import (
    Check,
    Table,
    ThresholdResult,
    evaluates,
    missing_result,
    number,
    section,
)
from kvaudit.stats.speed import METRICS as SPEED_METRICS
from kvaudit.stats.speed import speed_decision

if TYPE_CHECKING:
    from kvaudit.reports.analysis import Analysis


@section("speed", {"name", "metric", "max_ratio", "min_speedup", "missing"}, many=True)
def parse_speed(d: dict[str, Any], t: Table) -> list[Check]:
    metric = d.get("metric")
    if not isinstance(metric, str) or metric not in SPEED_METRICS:
        raise KvauditError(f"{t.field('metric')} must be one of {', '.join(SPEED_METRICS)}")
    if ("max_ratio" in d) == ("min_speedup" in d):
        raise KvauditError(f"{t.whole} needs exactly one of max_ratio (arm time / reference time at most) and "
                           "min_speedup (reference time / arm time at least)")
    if "max_ratio" in d:
        max_ratio = number(t.field("max_ratio"), d["max_ratio"], 0.01, 100.0)
        shown = f"{SPEED_METRICS[metric]} ratio ≤ {max_ratio:g}x"
    else:
        speedup = number(t.field("min_speedup"), d["min_speedup"], 0.01, 100.0)
        max_ratio = 1.0 / speedup
        shown = f"{SPEED_METRICS[metric]} speed-up ≥ {speedup:g}x"
    name = d.get("name", shown)
    if not isinstance(name, str):
        raise KvauditError(f"{t.field('name')} must be a string")
    return [Check(name, "speed", {"metric": metric, "max_ratio": max_ratio, "speedup": "min_speedup" in d},
                  t.missing)]


@evaluates("speed")
def speed_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    """A speed row, shown as a speed-up where the row was written as one."""
    p = check.params
    metric, mx = p["metric"], p["max_ratio"]
    ref = reference_of(arm)
    thr = f"speed-up ≥ {1 / mx:.3g}x" if p["speedup"] else f"{arm}/{ref} ≤ {mx:.3g}x"
    iv = an.speed(arm, metric)
    if iv is None:
        return missing_result(check, "n/a", thr, f"no case where both '{arm}' and '{ref}' have a {SPEED_METRICS[metric]}")
    if p["speedup"]:
        obs = (f"{1 / iv.median:.3g}x" + ("" if iv.upper is None or iv.lower is None
                                          else f" [{1 / iv.upper:.3g}, {1 / iv.lower:.3g}]")
               + f" on {iv.n} {iv.unit}")
    else:
        obs = (f"{iv.median:.3g}x" + ("" if iv.upper is None else f" [{iv.lower:.3g}, {iv.upper:.3g}]")
               + f" on {iv.n} {iv.unit}")
    dec = speed_decision(iv, mx)
    if dec == "undecided":
        return ThresholdResult(check.name, check.kind, "error", obs, thr,
                               f"cannot judge: {iv.unjudged}, and cases run together are not independent; rerun "
                               "with this kvaudit, which records each case's batch" if iv.unjudged else
                               f"cannot judge: {iv.n} {iv.unit} are too few for a {iv.confidence:.0%} interval of the "
                               "median")
    noise = an.speed(NOISE_ARM, metric) if NOISE_ARM != arm else None
    detail = (f"median of per-case {SPEED_METRICS[metric]} ratios {arm}/{ref}, {iv.confidence:.0%} order-statistic "
              "interval" if iv.unit != "batches" else
              f"median over batches (cases run together) of each batch's median {SPEED_METRICS[metric]} ratio "
              f"{arm}/{ref}, {iv.confidence:.0%} order-statistic interval over batches")
    if noise is not None:
        detail += f"; timing noise: {NOISE_ARM}/{ref} {noise.median:.3g}x on {noise.n} {noise.unit}"
        if metric == "ttft" and get_arm(NOISE_ARM).perturbs_batch:
            detail += " (it runs beside a filler request: its first token waits on a busier batch)"
    return ThresholdResult(check.name, check.kind, dec, obs, thr, detail)
