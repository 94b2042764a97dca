"""The leak rows (``[leak]``): the neutral policy's text-leak rate (its Wilson upper bound
against a maximum; too few probes: cannot judge) and canary exposure (the exact rank test; fail
when the true name gains more than its decoys beyond chance, cannot judge below the power the
test needs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvaudit.core.arms import REFERENCE_ARM, UNDER_TEST_ARM
from kvaudit.reports.gate_checks.base import (
    Check,
    Table,
    ThresholdResult,
    evaluates,
    missing_result,
    number,
    pct,
    section,
    switch,
)
from kvaudit.stats.leak_tests import text_leak_decision

if TYPE_CHECKING:
    from kvaudit.reports.analysis import Analysis


@section("leak", {"max_neutral_text_leak_rate", "forbid_neutral_exposure", "missing"})
def parse_leak(sec: dict[str, Any], t: Table) -> list[Check]:
    out = []
    if "max_neutral_text_leak_rate" in sec:
        mx = number(t.field("max_neutral_text_leak_rate"), sec["max_neutral_text_leak_rate"], 0.0, 1.0)
        out.append(Check("neutral-policy text leak rate", "leak_text", {"max": mx}, t.missing))
    if switch(t.field("forbid_neutral_exposure"), sec.get("forbid_neutral_exposure", False)):
        out.append(Check("neutral-policy canary exposure", "leak_exposure", {}, t.missing))
    return out


@evaluates("leak_text")
def text_leak_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    k, p = check.kind, check.params
    thr = f"Wilson upper bound ≤ {pct(p['max'])}"
    t = an.leaks["text"].get(UNDER_TEST_ARM)
    if t is None:
        return missing_result(check, "no probes", thr, f"the run has no leak probes with a '{UNDER_TEST_ARM}' arm")
    dec = text_leak_decision(t["leaks"], t["n"], p["max"], confidence=an.confidence)
    obs = f"{t['leaks']} of {t['n']} ({pct(dec.rate)}, upper bound {pct(dec.upper)})"
    detail = ", ".join(t["cases"][:5])
    if dec.verdict == "undecided":
        need = (f"; {dec.probes_to_pass} probes without a leak would be needed"
                if dec.probes_to_pass else "")
        return ThresholdResult(check.name, k, "error", obs, thr,
                               f"cannot judge: too few probes for the bound to reach {pct(p['max'])}{need}"
                               + (f"; leaks in {detail}" if detail else ""))
    return ThresholdResult(check.name, k, dec.verdict, obs, thr, detail)


@evaluates("leak_exposure")
def exposure_result(check: Check, an: Analysis, arm: str) -> ThresholdResult:
    k = check.kind
    e = an.leaks["exposure"].get("neutral")
    thr = f"rank test p > {an.leaks['alpha']:g} with enough probes"
    if e is None:
        return missing_result(check, "no probes", thr,
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
