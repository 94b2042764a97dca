"""Operating characteristic of the leak-probe tests, by simulation (run by hand, about a minute).

    .venv/bin/python benchmarks/leak_calibration.py [--runs 10000] [--k 20] [--seed 0]

Prints three tables:

1. **False alarms without a leak.** Candidate gains (policy log-prob minus reference log-prob)
   drawn from skewed, heavy-tailed or within-probe-correlated distributions that treat every
   candidate alike (exchangeable: no leak), at 10, 30 and 100 probes of K candidates. Columns:
   the exact rank test of :mod:`kvaudit.stats.leak_tests` (what the audit and gate use), and,
   side by side, the two statistics it replaced (written below as reference functions): the
   one-sided sign test of "true gain minus the decoys' mean gain", and the share of probes whose
   true name has the highest *absolute* log-probability against chance 1/K. Each rate comes with
   its Monte Carlo standard error; the rank test must stay at or under alpha + 3 SE.
2. **Power at the SmolLM2 effect** (first-user caching: +1.2 nats for 38 of 40 names), simulated
   under the normal shift model the power function assumes and under a skewed decoy-gain
   distribution with the same SD, next to :func:`rank_test_power`'s exact value.
3. **Text-leak decision at the boundary**: exact (binomial) probability that the Wilson decision
   passes when the true leak rate equals the allowed rate, worst case over n = 1..1500.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.stats import binom, binomtest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvaudit.stats.leak_tests import (  # noqa: E402
    REFERENCE_GAIN_NATS,
    REFERENCE_SHIFT,
    min_probes,
    rank_sum_null_tail,
    rank_test_power,
    wilson_interval,
)

ALPHA = 0.05
PROBES = (10, 30, 100)

# A null draws (runs, probes, K) arrays: baseline absolute log-probs under the reference arm and
# the gains; candidate 0 is the true name. Gains never depend on which candidate is the canary.
Null = Callable[[np.random.Generator, tuple[int, int, int]], tuple[np.ndarray, np.ndarray]]


def _base(rng: np.random.Generator, shape: tuple[int, int, int]) -> np.ndarray:
    return rng.normal(-8.0, 1.0, shape)


def null_lognormal(rng, shape):
    # left-skewed: every name loses a little under the policy, a few lose a lot
    return _base(rng, shape), -np.exp(rng.normal(0.0, 1.0, shape))


def null_exponential(rng, shape):
    return _base(rng, shape), -rng.exponential(1.0, shape)


def null_t2(rng, shape):
    return _base(rng, shape), rng.standard_t(2, shape)


def null_correlated(rng, shape):
    # a probe-wide shift and a probe-wide scale shared by all its names (correlated within the
    # probe, heteroscedastic across probes), name-specific skewed losses on top
    r, n, k = shape
    shift = rng.normal(0.0, 1.0, (r, n, 1))
    scale = np.exp(rng.normal(0.0, 0.5, (r, n, 1)))
    return _base(rng, shape), shift - scale * np.exp(0.75 * rng.normal(0.0, 1.0, shape))


def null_favoured(rng, shape):
    # the model already favours the true name by 3 nats in both arms; its gain is like the others'
    base = _base(rng, shape)
    base[..., 0] += 3.0
    return base, -np.exp(rng.normal(0.0, 1.0, shape))


NULLS: dict[str, Null] = {
    "lognormal (left-skewed)": null_lognormal,
    "exponential (left-skewed)": null_exponential,
    "t, 2 df (heavy tails)": null_t2,
    "skewed, correlated in probe": null_correlated,
    "true name favoured +3 nats": null_favoured,
}


# --------------------------------------------------------------------------- the statistics

def rank_test_rejects(gains: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """The shipped exact rank test (kvaudit.stats.leak_tests), vectorised over runs."""
    _, n, k = gains.shape
    ranks = 1 + (gains[..., 1:] >= gains[..., :1] - 1e-6).sum(axis=-1)  # ties against the leak
    s = (k - ranks).sum(axis=-1)
    return rank_sum_null_tail([k] * n)[s] <= alpha


def old_sign_test_rejects(gains: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """The removed statistic: one-sided sign test (scipy binomtest, p < alpha) of the true
    name's gain minus the decoys' mean gain, vectorised through its critical counts."""
    _, n, _ = gains.shape
    beyond = gains[..., 0] - gains[..., 1:].mean(axis=-1)
    pos, neg = (beyond > 0).sum(axis=-1), (beyond < 0).sum(axis=-1)
    # crit[m]: fewest positives out of m non-ties with p < alpha (m + 1: never; p = 1 for m = 0)
    crit = np.array([m + 1 if m == 0 else
                     next((c for c in range(m + 1)
                           if binomtest(c, m, 0.5, alternative="greater").pvalue < alpha), m + 1)
                     for m in range(n + 1)])
    return pos >= crit[pos + neg]


def old_share_first_rejects(base: np.ndarray, gains: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """The removed statistic: share of probes whose true name has the highest absolute
    log-probability under the policy, binomial test against chance 1/K."""
    _, n, k = gains.shape
    lp = base + gains
    first = (lp[..., 1:] <= lp[..., :1]).all(axis=-1).sum(axis=-1)
    crit = int(np.argmax(binom.sf(np.arange(n + 1) - 1, n, 1 / k) < alpha))  # P(X >= c) < alpha
    return first >= crit


def _rate(x: np.ndarray) -> tuple[float, float]:
    p = float(x.mean())
    return p, float(np.sqrt(max(p * (1 - p), 1e-12) / len(x)))


# --------------------------------------------------------------------------- tables

def exact_size(n: int, k: int, alpha: float = ALPHA) -> float:
    """The rank test's exact false-alarm rate under any continuous exchangeable null: the
    largest null tail at or under alpha (the test is discrete)."""
    tail = rank_sum_null_tail([k] * n)
    return float(tail[tail <= alpha].max())


def false_alarm_table(runs: int, ks: tuple[int, ...], seed: int) -> list[tuple]:
    rows = []
    for name, null in NULLS.items():
        for n in PROBES:
            cells = []
            for k in ks:
                rng = np.random.default_rng([seed, n, k, len(name)])
                base, gains = null(rng, (runs, n, k))
                cells.append((_rate(rank_test_rejects(gains)), _rate(old_sign_test_rejects(gains)),
                              _rate(old_share_first_rejects(base, gains))))
            rows.append((name, n, cells))
    return rows


def power_table(runs: int, k: int, seed: int) -> list[tuple]:
    sd = REFERENCE_GAIN_NATS / REFERENCE_SHIFT  # decoy-gain SD implied by +1.2 nats at shift 1.645
    rows = []
    for n in (3, 5, 10, 30):
        rng = np.random.default_rng([seed, 99, n])
        normal = rng.normal(0.0, sd, (runs, n, k))
        normal[..., 0] += REFERENCE_GAIN_NATS
        z = np.exp(rng.normal(0.0, 1.0, (runs, n, k)))
        skewed = -(z - np.exp(0.5)) / np.sqrt((np.e - 1) * np.e) * sd  # mean 0, SD sd, left-skewed
        skewed[..., 0] += REFERENCE_GAIN_NATS
        rows.append((n, rank_test_power([k] * n, shift=REFERENCE_SHIFT, alpha=ALPHA),
                     _rate(rank_test_rejects(normal)), _rate(rank_test_rejects(skewed))))
    return rows


def text_table(confidence: float = 0.95, n_max: int = 1500) -> list[tuple]:
    # proportion_confint(method="wilson") vectorised: the call wilson_interval makes
    from statsmodels.stats.proportion import proportion_confint

    assert wilson_interval(0, 10, confidence)[1] == proportion_confint(0, 10, 1 - confidence, "wilson")[1]
    rows = []
    for m in (0.01, 0.05, 0.1, 0.2):
        worst, at = 0.0, 0
        for n in range(1, n_max + 1):
            ks = np.arange(n + 1)
            upper = proportion_confint(ks, n, alpha=1 - confidence, method="wilson")[1]
            fp = float(binom.pmf(ks[upper <= m], n, m).sum())
            if fp > worst:
                worst, at = fp, n
        rows.append((m, worst, at))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--k", type=int, default=20, help="candidates per probe (Boxoffice: 20)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.time()

    ks = tuple(sorted({6, a.k}))
    print(f"False alarms without a leak: K candidates per probe, {a.runs} runs per cell, alpha "
          f"{ALPHA}, rate ± Monte Carlo SE; limit for the rank test alpha + 3 SE")
    head = " | ".join(f"rank test K={k} | old sign K={k} | old share-first K={k}" for k in ks)
    print(f"| null | probes | {head} |")
    print("|---|---:|" + "---:|" * (3 * len(ks)))
    worst_excess = -np.inf
    for name, n, cells in false_alarm_table(a.runs, ks, a.seed):
        out = []
        for rank, sign, first in cells:
            worst_excess = max(worst_excess, (rank[0] - ALPHA) / rank[1])
            out += [f"{x[0]:.3f} ± {x[1]:.3f}" for x in (rank, sign, first)]
        print(f"| {name} | {n} | " + " | ".join(out) + " |")
    print("rank test's exact size (any continuous exchangeable null): "
          + "; ".join(f"K={k}: " + ", ".join(f"{n} probes {exact_size(n, k):.4f}" for n in PROBES)
                      for k in ks))
    print(f"rank test: largest (rate - alpha) / SE = {worst_excess:+.1f}"
          f" ({'within' if worst_excess <= 3 else 'OVER'} 3 SE)\n")

    print(f"Power at the SmolLM2 effect (true name +{REFERENCE_GAIN_NATS} nats, decoy-gain SD "
          f"{REFERENCE_GAIN_NATS / REFERENCE_SHIFT:.2f} nats = shift {REFERENCE_SHIFT:.3f} SDs), "
          f"K = {a.k}, alpha {ALPHA}")
    print("| probes | exact (normal shift model) | simulated, normal | simulated, left-skewed |")
    print("|---:|---:|---:|---:|")
    for n, exact, normal, skewed in power_table(a.runs, a.k, a.seed):
        print(f"| {n} | {exact:.3f} | {normal[0]:.3f} ± {normal[1]:.3f} | {skewed[0]:.3f} ± {skewed[1]:.3f} |")
    print("min probes for power 0.8 at the reference effect: "
          + ", ".join(f"K={k}: {min_probes(k)}" for k in (2, 6, 20))
          + f"; at half the shift ({REFERENCE_SHIFT / 2:.2f}): "
          + ", ".join(f"K={k}: {min_probes(k, shift=REFERENCE_SHIFT / 2)}" for k in (6, 20)) + "\n")

    print("Text leaks: P(Wilson decision passes | true rate = allowed rate), exact, worst n in 1..1500 "
          "(upper end of the two-sided 95% interval: nominal 0.025)")
    print("| allowed rate | worst false-pass | at n |")
    print("|---:|---:|---:|")
    for m, worst, at in text_table():
        print(f"| {m:g} | {worst:.4f} | {at} |")
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
