"""Leak probes: the neutral caching policy shows no canary exposure beyond chance (required).

Exposure gain of a name = its log-probability under the arm under test minus under the
reference; per probe, the rank of the true name's gain among all candidates' gains, uniform
without a leak; exact one-sided rank test across probes at ``ALPHA``
(:mod:`kvaudit.stats.leak_tests`, computed by :func:`kvaudit.stats.leaks.leak_summary`). The
neutral policy fails the audit when the test rejects. With fewer probes than the test needs for
80% power at the SmolLM2 first-user effect (``min_probes``) the check warns.
"""

from __future__ import annotations

from collections import defaultdict

from kvaudit.audit.checks.base import ALPHA, MAX_LISTED, check, from_problems, result
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.core.arms import REFERENCE_ARM, UNDER_TEST_ARM
from kvaudit.stats.leaks import leak_summary


@check("leak_probes", required=True, scope="reuse")
def check_leak_probes(run: LoadedRun):
    """The neutral warm-up policy shows no canary exposure beyond chance (required)."""
    probes = [p for p in run.pairs if isinstance(p.canary, dict) and isinstance(p.canary.get("value"), str)]
    if not probes:
        return result(True, "no leak probes")
    scoring = str((run.manifest.backend or {}).get("candidate_scoring") or "")
    if scoring.startswith("unavailable"):
        return result(False, f"{len(probes)} leak probe(s), but candidate names could not be scored on the arms' "
                             f"KV ({scoring}): exposure cannot be judged", cannot_judge=True)
    problems: dict[str, list[str]] = defaultdict(list)
    for p in probes:
        decoys = p.canary.get("decoys", [])
        if not isinstance(decoys, list) or not all(isinstance(d, str) for d in decoys):
            problems[p.case_id].append("canary field 'decoys' must be a list of names")
            continue
        names = [p.canary["value"], *decoys]
        for arm in (REFERENCE_ARM, UNDER_TEST_ARM):
            r = p.arms.get(arm)
            if r is not None and (not r.canary_logprobs or any(n not in r.canary_logprobs for n in names)):
                problems[p.case_id].append(f"arm '{arm}' has no log-probability for every candidate name")
    if problems:
        return from_problems(problems, "")
    s = leak_summary(run.pairs, alpha=ALPHA)
    parts = [f"{s['n_probes']} probes"]
    for arm, t in s.get("text", {}).items():
        parts.append(f"text leak {arm} {t['leaks']}/{t['n']} (Wilson upper {t['ci'][1]:.1%})")
    for pol, e in s.get("exposure", {}).items():
        if e:
            parts.append(f"{pol} ({e['arm']} vs {e['reference']}) true-name gain rank "
                         f"{e['mean_rank']:.2f} vs chance {e['chance_rank']:.2f}, ranked first "
                         f"{e['share_first']:.0%} vs chance {e['chance_first']:.0%}, rank test "
                         f"p={e['rank_test_p']:.3g}, power {e['power']:.2f} at the reference effect")
        else:
            parts.append(f"{pol} exposure not measured")
    detail = "; ".join(parts)
    text = s.get("text", {})
    warning = None
    if text.get(UNDER_TEST_ARM, {}).get("leaks", 0) > text.get(REFERENCE_ARM, {}).get("leaks", 0):
        warning = (f"the canary appears in {UNDER_TEST_ARM} answers: "
                   f"{', '.join(text[UNDER_TEST_ARM].get('cases', []))}")
    neutral = s.get("exposure", {}).get("neutral")
    alpha = float(s.get("alpha", ALPHA))
    if neutral and not neutral["decidable"]:
        need = neutral["min_probes"]
        few = (f"only {neutral['n']} scored probe(s): the rank test has power {neutral['power']:.2f} "
               f"at the reference effect ({s['reference_effect']})"
               + (f" and needs {need} for {s['power_target']:.0%}" if need is not None else
                  "; with one candidate per probe it can never detect one")
               + ", so neutral exposure is effectively untested")
        warning = f"{warning}; {few}" if warning else few
    if s.get("neutral_exposure_beyond_chance"):
        cases = list(neutral.get("ranked_first_cases", [])) if neutral else []
        listed = ", ".join(cases[:MAX_LISTED]) + (f" and {len(cases) - MAX_LISTED} more"
                                                   if len(cases) > MAX_LISTED else "")
        return result(False,
                      f"the neutral policy shows exposure beyond chance (exact rank test of the "
                      f"true name's gain among its candidates', p={neutral['rank_test_p']:.3g} "
                      f"<= alpha {alpha:g}); the true name gained most in "
                      f"{listed or 'no probe'}; {detail}", cases, warning)
    return result(True, f"neutral policy: no exposure beyond chance; {detail}", [], warning)
