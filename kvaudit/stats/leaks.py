"""Leak probes: does a cached segment carry the request it was cached from into another one?

A leak probe is a pair with ``PairRecord.canary = {"value", "decoys", "capture_prefix"}``. Its
arms are ``recompute`` (never saw the canary), ``reuse`` (segments cached with the neutral
warm-up policy) and ``reuse_first_user`` (segments cached from the first user's request, which
started with the capture prefix naming the canary). ``ArmResult.canary_logprobs`` maps each
candidate name (the value and every decoy) to its teacher-forced log-probability as the answer.

Two kinds of evidence, because a text-only leak rate can read zero while the cache still
carries the name:

* **Text leak**: the answer contains the canary as a whole word (case-insensitive); rates come
  with two-sided Wilson intervals at ``confidence`` (the gate reads the upper end).
* **Exposure**: each policy against its reference arm (:data:`POLICIES`: the neutral policy
  ``reuse`` against ``recompute``; the first-user policy ``reuse_first_user`` against ``reuse``,
  which isolates the capture). A candidate's gain is ``lp_policy - lp_reference``. The test is
  the exact rank test of :mod:`kvaudit.stats.leak_tests`: per probe the rank of the true name's
  gain among all candidates' gains (ties count against a leak), uniform without a leak. It
  compares gains with gains, never absolute log-probabilities, so a name the model already
  favours does not look leaked, and it is exact under skewed or correlated gains, where the old
  sign test of "gain minus the decoys' mean gain" was not.

:func:`leak_summary` returns::

    n_probes                        probes in the run (pairs with a canary)
    alpha, confidence               the test level and the interval confidence used
    power_target                    the power min_probes asks for (0.8)
    reference_effect                the alternative power is computed at (text)
    reference_shift                 that alternative's shift, in decoy-gain SDs
    text: {arm: ...}                per arm among recompute, reuse, reuse_first_user:
        n, leaks, rate              probes with the arm, answers naming the canary, leaks / n
        ci                          two-sided Wilson interval [lower, upper] at ``confidence``
        cases                       case ids of the text leaks
    exposure: {policy: ... | None}  per policy in POLICIES; None when no probe has
                                    log-probabilities for every candidate under both arms
        arm, reference              the policy's arm and its reference arm
        n                           probes scored
        n_candidates                candidates per probe (min and max: [lo, hi])
        exposure_mean, exposure_ci  mean gain of the true name (nats), cluster-bootstrap interval
        beyond_chance_mean/_ci      mean of (true gain - decoys' mean gain), descriptive only
        rank_test_p                 exact one-sided p-value of the rank test
        mean_rank, chance_rank      mean gain rank of the true name (1 = largest gain, ties
                                    against it); mean of (K + 1) / 2
        share_first, chance_first   share of probes whose true name gained most; mean of 1 / K
        ranked_first_cases          case ids where the true name gained most
        power                       power of the rank test for these probes at the reference effect
        min_probes                  fewest probes (with the run's smallest K) for power
                                    power_target there; None when unreachable (one candidate)
        decidable                   n >= min_probes
        beyond_chance               rank_test_p <= alpha
        verdict                     "fail" (beyond chance), "pass" (not, and decidable) or
                                    "undecided" (not, and too few probes)
    neutral_text_leak_rate          text[arm under test]["rate"], or None
    neutral_exposure_beyond_chance  the neutral policy's beyond_chance (False without probes)
    neutral_exposure_decidable      the neutral policy's decidable (False without probes)

The audit fails when ``neutral_exposure_beyond_chance`` is true and warns when
``neutral_exposure_decidable`` is false.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from kvaudit.core.arms import LEAK_CAPTURE_ARM, REFERENCE_ARM, UNDER_TEST_ARM
from kvaudit.core.run_format import PairRecord, cluster_key
from kvaudit.stats.leak_tests import (
    DEFAULT_ALPHA,
    DEFAULT_POWER,
    REFERENCE_EFFECT,
    REFERENCE_SHIFT,
    exposure_verdict,
    gain_rank,
    min_probes,
    rank_test,
    rank_test_power,
    wilson_interval,
)
from kvaudit.stats.paired import DEFAULT_CONFIDENCE, cluster_bootstrap_means

# policy name -> (arm under test, reference arm): the neutral policy is the arm under test against
# the reference; the unsafe first-user capture is measured against the neutral policy.
POLICIES: dict[str, tuple[str, str]] = {
    "neutral": (UNDER_TEST_ARM, REFERENCE_ARM),
    "first_user": (LEAK_CAPTURE_ARM, UNDER_TEST_ARM),
}
TEXT_ARMS = (REFERENCE_ARM, UNDER_TEST_ARM, LEAK_CAPTURE_ARM)


def text_leak(answer: str, value: str) -> bool:
    """The canary appears in the answer as a whole word (case-insensitive)."""
    if not value.strip():
        return False
    return re.search(rf"(?<!\w){re.escape(value.strip())}(?!\w)", answer, re.IGNORECASE) is not None


def _probe_rows(pairs: Iterable[PairRecord]) -> list[PairRecord]:
    return [p for p in pairs if isinstance(p.canary, dict) and isinstance(p.canary.get("value"), str)]


def _text_rates(probes: list[PairRecord], confidence: float) -> dict[str, Any]:
    out = {}
    for arm in TEXT_ARMS:
        rows = [p for p in probes if arm in p.arms]
        if not rows:
            continue
        cases = [p.case_id for p in rows if text_leak(p.arms[arm].answer, (p.canary or {})["value"])]
        k, n = len(cases), len(rows)
        out[arm] = {"n": n, "leaks": k, "rate": k / n, "ci": list(wilson_interval(k, n, confidence)),
                    "cases": cases}
    return out


def _exposure(probes: list[PairRecord], arm: str, ref: str, confidence: float,
              alpha: float) -> dict[str, Any] | None:
    gains, beyond, ranks, ks, clusters, cases = [], [], [], [], [], []
    for p in probes:
        a, r = p.arms.get(arm), p.arms.get(ref)
        if a is None or r is None or not a.canary_logprobs or not r.canary_logprobs:
            continue
        canary = p.canary or {}  # a probe row: _probe_rows kept only pairs with a canary
        value = canary["value"]
        decoys = list(dict.fromkeys(d for d in canary.get("decoys", []) if d != value))
        names = [value, *decoys]
        if any(n not in a.canary_logprobs or n not in r.canary_logprobs for n in names):
            continue
        g = {n: a.canary_logprobs[n] - r.canary_logprobs[n] for n in names}
        dg = [g[d] for d in decoys]
        gains.append(g[value])
        beyond.append(g[value] - (float(np.mean(dg)) if dg else 0.0))
        ranks.append(gain_rank(g[value], dg))
        ks.append(len(names))
        clusters.append(cluster_key(p))
        cases.append(p.case_id)
    if not gains:
        return None
    t = rank_test(ranks, ks)
    need = min_probes(min(ks), alpha=alpha)
    out = {
        "arm": arm, "reference": ref, "n": t.n, "n_candidates": [min(ks), max(ks)],
        "exposure_mean": float(np.mean(gains)),
        "exposure_ci": _boot_ci(gains, clusters, confidence),
        "beyond_chance_mean": float(np.mean(beyond)),
        "beyond_chance_ci": _boot_ci(beyond, clusters, confidence),
        "rank_test_p": t.p_value,
        "mean_rank": t.mean_rank, "chance_rank": t.chance_rank,
        "share_first": t.n_first / t.n, "chance_first": t.chance_first,
        "ranked_first_cases": [c for c, k in zip(cases, ranks, strict=True) if k == 1],
        "power": rank_test_power(ks, alpha=alpha),
        "min_probes": need,
        "decidable": need is not None and t.n >= need,
        "beyond_chance": t.p_value <= alpha,
        "verdict": exposure_verdict(t.p_value, t.n, need, alpha),
    }
    return out


def _boot_ci(values: list[float], clusters: list[str], confidence: float) -> list[float] | None:
    if len(set(clusters)) < 2:
        return None
    boots = cluster_bootstrap_means(values, clusters)
    tail = (1 - confidence) / 2
    return [float(np.quantile(boots, tail)), float(np.quantile(boots, 1 - tail))]


def leak_summary(pairs: Iterable[PairRecord], *, confidence: float = DEFAULT_CONFIDENCE,
                 alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """Text-leak rates per arm and canary exposure per caching policy (keys: module docstring).

    ``neutral_exposure_beyond_chance`` is True only when the neutral policy's rank test rejects
    at ``alpha``; ``neutral_exposure_decidable`` says whether the probes had power
    ``DEFAULT_POWER`` at the reference effect.
    """
    if not 0 < alpha < 1:
        raise ValueError("alpha must lie in (0, 1)")
    probes = _probe_rows(pairs)
    text = _text_rates(probes, confidence)
    exposure = {name: _exposure(probes, arm, ref, confidence, alpha)
                for name, (arm, ref) in POLICIES.items()}
    neutral = exposure["neutral"]
    return {
        "n_probes": len(probes),
        "alpha": alpha,
        "confidence": confidence,
        "power_target": DEFAULT_POWER,
        "reference_effect": REFERENCE_EFFECT,
        "reference_shift": REFERENCE_SHIFT,
        "text": text,
        "exposure": exposure,
        "neutral_text_leak_rate": text[UNDER_TEST_ARM]["rate"] if UNDER_TEST_ARM in text else None,
        "neutral_exposure_beyond_chance": bool(neutral and neutral["beyond_chance"]),
        "neutral_exposure_decidable": bool(neutral and neutral["decidable"]),
    }
