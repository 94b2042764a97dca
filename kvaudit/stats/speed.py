"""Paired speed: the median of per-case time ratios (arm over its reference) with a distribution-free
interval, and the gate's decision on it.

A speed threshold ("candidate TTFT p50 no worse than 1.05x the baseline's", "decode at least 1.3x
faster") is judged on the cases both arms ran: each case's ratio ``t_arm / t_ref`` of time to first
token or time per output token. Latencies have heavy tails and stalls (a page fault, a scheduler
hiccup) that a mean or a t-interval on log ratios takes for effect, so the statistic is the
**median ratio**, and its interval is the order-statistic (sign-test) interval: for ``n`` ratios
the ``k``-th smallest and ``k``-th largest, ``k`` the largest with ``P(Binomial(n, 1/2) < k) <=
alpha/2``. It covers the true median ratio with probability at least ``1 - alpha`` for any
continuous distribution, whatever its tails: no normality, no symmetry. With too few cases no
such ``k`` exists (under 6 at 95%) and the row cannot be judged.

:func:`speed_decision`: ``max_ratio`` passes when the upper end is at most the threshold (the arm is
no slower than that with confidence); ``min_speedup`` s passes when ``1 / upper >= s``. At a true
median ratio exactly at the threshold this passes at most ``alpha/2`` of the time
(benchmarks/speed_calibration.py measures it; tests/test_speed.py holds a fast slice).

Cases run several at a time (``--concurrent-cases N``) are not independent: an arm runs for a batch
of N cases together, so every case of the batch meets the same batch conditions under that arm and
their ratios move together (on in-process vLLM each one's TTFT is the batch's). The sign-test
interval on the cases is then too narrow: at a true median ratio on the threshold it passed up to
20% of runs in batches of 8 where alpha/2 is 2.5% (``speed_calibration.py --batches``). So where
cases ran in batches, :func:`median_ratio_by_batch` takes each batch's median ratio as one value and
the interval over batches: the median over batches of a batch's median ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvaudit.core.vocabulary import Decision

METRICS = {
    "ttft": "time to first token",
    "time_per_output_token": "time per output token after the first (decode)",
}


@dataclass(frozen=True)
class RatioInterval:
    """The median of per-case ratios ``arm / reference`` and its two-sided interval."""

    n: int
    median: float
    lower: float | None  # None: too few cases (or batches) for an interval at this confidence
    upper: float | None
    confidence: float
    unit: str = "cases"  # what n counts, each one independent value: "cases", or "batches" of cases run together
    unjudged: str | None = None  # why there is no interval though n would allow one


def order_statistic_rank(n: int, confidence: float) -> int | None:
    """The rank ``k`` (1-based) of the distribution-free interval ``[x_(k), x_(n-k+1)]`` for the
    median at two-sided ``confidence``; None when ``n`` is too small for any."""
    from scipy.stats import binom

    alpha = 1.0 - confidence
    # the largest k with P(B < k) = P(B <= k-1) <= alpha/2
    k = int(binom.ppf(alpha / 2, n, 0.5))
    while k >= 1 and binom.cdf(k - 1, n, 0.5) > alpha / 2:
        k -= 1
    while binom.cdf(k, n, 0.5) <= alpha / 2:
        k += 1
    return k if k >= 1 and k <= n - k + 1 else None


def median_ratio(arm: list[float], reference: list[float], confidence: float = 0.95) -> RatioInterval | None:
    """The median of ``arm[i] / reference[i]`` over cases with both times positive and finite, with
    its order-statistic interval; None without such a case."""
    r = np.array([a / b for a, b in zip(arm, reference)
                  if a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)], dtype=float)
    if r.size == 0:
        return None
    r.sort()
    k = order_statistic_rank(int(r.size), confidence)
    lo, hi = (None, None) if k is None else (float(r[k - 1]), float(r[r.size - k]))
    return RatioInterval(int(r.size), float(np.median(r)), lo, hi, confidence)


def median_ratio_by_batch(arm: list[float], reference: list[float], batches: list[str],
                          confidence: float = 0.95) -> RatioInterval | None:
    """Cases run in batches: each batch's median of ``arm[i] / reference[i]`` (cases with both
    times positive and finite) as one value, and the median over batches with its order-statistic
    interval (``n`` counts batches); None without such a case."""
    by: dict[str, list[float]] = {}
    for a, b, k in zip(arm, reference, batches, strict=True):
        if a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b):
            by.setdefault(k, []).append(a / b)
    if not by:
        return None
    per_batch = [float(np.median(v)) for v in by.values()]
    iv = median_ratio(per_batch, [1.0] * len(per_batch), confidence)
    assert iv is not None
    return RatioInterval(iv.n, iv.median, iv.lower, iv.upper, confidence, unit="batches")


def speed_decision(interval: RatioInterval | None, max_ratio: float) -> Decision:
    """``pass`` when the interval's upper end is at most ``max_ratio`` (arm time over reference time),
    ``fail`` when it is above, ``undecided`` without an interval."""
    if interval is None or interval.upper is None:
        return "undecided"
    return "pass" if interval.upper <= max_ratio else "fail"


def false_pass_rate(scenario: str, n: int, max_ratio: float, *, runs: int, confidence: float = 0.95,
                    seed: int = 0, batch: int = 1, batch_sd: float = 0.0, by_batch: bool = True) -> float:
    """The share of ``runs`` simulated paired runs of ``n`` cases that pass a ``max_ratio`` threshold
    when the true median ratio is exactly ``max_ratio`` (the worst case a pass must guard against).
    ``scenario``: ``lognormal`` (log ratios normal, sd 0.1), ``heavy`` (log ratios Student-t, 2
    degrees of freedom), ``stalls`` (lognormal, then a tenth of either arm's times multiplied by
    5-50, the stall landing on the arm or its reference at random, so the median ratio is kept).
    ``batch``: cases run ``batch`` at a time, each batch's log ratios shifted together by a normal
    of sd ``batch_sd`` (median zero: the median ratio is kept); judged by batch
    (:func:`median_ratio_by_batch`) unless ``by_batch`` is False (each case as independent)."""
    rng = np.random.default_rng(seed)
    passed = 0
    log_m = math.log(max_ratio)
    for _ in range(runs):
        base = rng.lognormal(math.log(0.05), 0.3, n)
        if scenario == "lognormal":
            lr = rng.normal(0.0, 0.1, n)
        elif scenario == "heavy":
            lr = 0.05 * rng.standard_t(2, n)
        elif scenario == "stalls":
            lr = rng.normal(0.0, 0.1, n)
            hit = rng.random(n) < 0.1
            factor = np.exp(rng.uniform(math.log(5), math.log(50), n))
            sign = np.where(rng.random(n) < 0.5, 1.0, -1.0)
            lr = np.where(hit, lr + sign * np.log(factor), lr)
        else:
            raise ValueError(f"unknown scenario {scenario!r}")
        keys = [str(i // batch) for i in range(n)]
        if batch > 1:
            lr = lr + np.repeat(rng.normal(0.0, batch_sd, -(-n // batch)), batch)[:n]
        arm = base * np.exp(lr + log_m)
        iv = (median_ratio_by_batch(list(arm), list(base), keys, confidence) if batch > 1 and by_batch
              else median_ratio(list(arm), list(base), confidence))
        if speed_decision(iv, max_ratio) == "pass":
            passed += 1
    return passed / runs
