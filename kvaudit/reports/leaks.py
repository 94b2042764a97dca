"""Leak probes: does a cached segment carry the request it was cached from into another one?

A leak probe is a pair with ``PairRecord.canary = {"value", "decoys", "capture_prefix"}``. Its
arms are ``recompute`` (never saw the canary), ``reuse`` (segments cached with the neutral
warm-up policy) and ``reuse_first_user`` (segments cached from the first user's request, which
started with the capture prefix naming the canary). ``ArmResult.canary_logprobs`` maps each
candidate name (the value and every decoy) to its teacher-forced log-probability as the answer.

Two kinds of evidence, because a text-only leak rate can read zero while the cache still
carries the name:

* **Text leak**: the answer contains the canary as a whole word (case-insensitive); rates
  come with Wilson intervals.
* **Exposure**: ``lp_policy(true) - lp_reference(true)``; the reference is ``recompute`` for the
  neutral policy and ``reuse`` for the first-user policy (so it isolates the capture). Beyond
  chance = the true name's gain minus the mean gain of the decoys, tested with a one-sided sign
  test across probes (scipy ``binomtest``). Also the true canary's rank among the candidates
  under the policy and the share ranked first against chance ``1 / (1 + n_decoys)``.

:func:`leak_summary` is what the report shows and what the audit calls; the audit fails when
``result["neutral_exposure_beyond_chance"]`` is true.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from kvaudit.reports.scoring import cluster_key
from kvaudit.reports.stats import DEFAULT_CONFIDENCE, cluster_bootstrap_means, wilson
from kvaudit.schema import PairRecord

# policy name -> (arm under test, reference arm)
POLICIES: dict[str, tuple[str, str]] = {
    "neutral": ("reuse", "recompute"),
    "first_user": ("reuse_first_user", "reuse"),
}
TEXT_ARMS = ("recompute", "reuse", "reuse_first_user")
DEFAULT_ALPHA = 0.05


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
        hits = [text_leak(p.arms[arm].answer, p.canary["value"]) for p in probes if arm in p.arms]
        if not hits:
            continue
        k, n = int(sum(hits)), len(hits)
        out[arm] = {"n": n, "leaks": k, "rate": k / n, "ci": _list(wilson(k, n, confidence)),
                    "cases": [p.case_id for p in probes if arm in p.arms
                              and text_leak(p.arms[arm].answer, p.canary["value"])]}
    return out


def _exposure(probes: list[PairRecord], arm: str, ref: str, confidence: float,
              alpha: float) -> dict[str, Any] | None:
    from scipy.stats import binomtest

    gains, beyond, ranks, chance, clusters, cases = [], [], [], [], [], []
    for p in probes:
        a, r = p.arms.get(arm), p.arms.get(ref)
        if a is None or r is None or not a.canary_logprobs or not r.canary_logprobs:
            continue
        value = p.canary["value"]
        decoys = [d for d in p.canary.get("decoys", []) if d != value]
        names = [value, *decoys]
        if any(n not in a.canary_logprobs or n not in r.canary_logprobs for n in names):
            continue
        g = {n: a.canary_logprobs[n] - r.canary_logprobs[n] for n in names}
        gains.append(g[value])
        beyond.append(g[value] - (float(np.mean([g[d] for d in decoys])) if decoys else 0.0))
        ranks.append(1 + sum(a.canary_logprobs[d] > a.canary_logprobs[value] for d in decoys))
        chance.append(1 / len(names))
        clusters.append(cluster_key(p))
        cases.append(p.case_id)
    n = len(gains)
    if n == 0:
        return None
    b = np.asarray(beyond)
    pos, neg = int((b > 0).sum()), int((b < 0).sum())
    sign_p = float(binomtest(pos, pos + neg, 0.5, alternative="greater").pvalue) if pos + neg else 1.0
    first = int(sum(r == 1 for r in ranks))
    first_p = float(binomtest(first, n, float(np.mean(chance)), alternative="greater").pvalue)
    out = {
        "arm": arm, "reference": ref, "n": n,
        "exposure_mean": float(np.mean(gains)),
        "exposure_ci": _boot_ci(gains, clusters, confidence),
        "beyond_chance_mean": float(b.mean()),
        "beyond_chance_ci": _boot_ci(beyond, clusters, confidence),
        "n_positive": pos, "n_negative": neg, "sign_test_p": sign_p,
        "mean_rank": float(np.mean(ranks)), "share_first": first / n,
        "chance_first": float(np.mean(chance)), "share_first_p": first_p,
        "positive_cases": [c for c, x in zip(cases, beyond, strict=True) if x > 0],
    }
    out["beyond_chance"] = bool(sign_p < alpha and out["beyond_chance_mean"] > 0)
    return out


def _boot_ci(values: list[float], clusters: list[str], confidence: float) -> list[float] | None:
    if len(set(clusters)) < 2:
        return None
    boots = cluster_bootstrap_means(values, clusters)
    tail = (1 - confidence) / 2
    return [float(np.quantile(boots, tail)), float(np.quantile(boots, 1 - tail))]


def _list(x: tuple[float, float] | None) -> list[float] | None:
    return None if x is None else list(x)


def leak_summary(pairs: Iterable[PairRecord], *, confidence: float = DEFAULT_CONFIDENCE,
                 alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """Text-leak rates per arm and canary exposure per caching policy.

    Returns ``{"n_probes", "text": {arm: {n, leaks, rate, ci, cases}}, "exposure": {policy:
    {...} or None}, "neutral_text_leak_rate", "neutral_exposure_beyond_chance", "alpha"}``.
    ``neutral_exposure_beyond_chance`` is True only when the neutral policy's true canary
    gains more than its decoys in a one-sided sign test at ``alpha``.
    """
    probes = _probe_rows(pairs)
    text = _text_rates(probes, confidence)
    exposure = {name: _exposure(probes, arm, ref, confidence, alpha)
                for name, (arm, ref) in POLICIES.items()}
    neutral = exposure["neutral"]
    return {
        "n_probes": len(probes),
        "alpha": alpha,
        "text": text,
        "exposure": exposure,
        "neutral_text_leak_rate": text["reuse"]["rate"] if "reuse" in text else None,
        "neutral_exposure_beyond_chance": bool(neutral and neutral["beyond_chance"]),
    }
