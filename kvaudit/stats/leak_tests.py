"""Leak-probe statistics: an exact exposure rank test with its power, and text-leak decisions.

Pure functions on numbers (numpy, scipy, statsmodels); nothing here knows about runs or records.

**Exposure rank test.** A leak probe scores K candidate names (the true canary and K - 1
decoys) under a policy arm and under its reference arm. A candidate's *gain* is its
log-probability under the policy minus under the reference. Without a leak the policy has no
information about which candidate is the canary, so the candidates are exchangeable and the true
name's gain rank (1 = largest gain) is uniform on 1..K, whatever the gains' distribution (skewed,
heavy-tailed, correlated within a probe). The rank is exactly uniform and independent across
probes when the canary is drawn uniformly from its candidates; otherwise it rests on the
candidates being exchangeable. :func:`gain_rank` counts a decoy whose gain is within
:data:`TIE_TOL` of the true name's (or above it) as beating it, so ties only ever make the
rank worse and the test conservative.

The statistic is ``S = sum_i (K_i - rank_i)``: each term is uniform on 0..K_i - 1 under the
null, so the null distribution of S is the convolution of independent discrete uniforms (probes
may have different K_i) and :func:`rank_test_p` is the exact one-sided p-value P(S >= s). All
probes ranked first with K candidates each gives (1/K)^n. Convolutions are exact up to about
500 probes of 20 candidates; beyond that they go through the FFT, whose absolute error (about
1e-15) only touches p-values far below any alpha.

**Alternative for power.** A normal location shift: within a probe every candidate's gain has
the same spread sigma; the decoys' gains are N(0, sigma^2) and the true name's gain is
N(shift * sigma, sigma^2). ``shift`` is in units of the decoy-gain spread. The reference effect
is the SmolLM2 measurement (DESIGN.md): first-user caching raised the true name's log-probability
about 1.2 nats over neutral caching for 38 of 40 names (under the model, P(gain > 0) =
Phi(shift) = 0.95 gives shift 1.645) and ranked it first of 20 candidates for 13 of 20 caches
(P(rank 1 | K = 20) = 0.65 gives shift 2.27). :data:`REFERENCE_SHIFT` takes the smaller, 1.645:
the test must be able to see at least that. :func:`rank_test_power` is the non-randomised
test's (reject when p <= alpha) power under that model, exact up to Gauss-Hermite quadrature;
:func:`min_probes` is the fewest probes with power 0.8. ``benchmarks/leak_calibration.py``
measures the false-alarm rate under skewed and correlated nulls and the power by simulation.

**Text leaks.** Wilson intervals (statsmodels ``proportion_confint``), two-sided at
``confidence``: the upper end is a one-sided (1 + confidence) / 2 bound, the same end the report
shows. :func:`text_leak_decision` passes when the upper bound is at most the allowed rate, fails
when the lower bound exceeds it, and is otherwise undecided, saying how many probes with 0 leaks
would pass (none exist when the allowed rate is 0: an upper bound is never 0).

The gate calls :func:`text_leak_decision` (text leaks) and :func:`exposure_verdict` with
:func:`rank_test_p` and :func:`min_probes` (exposure; ``kvaudit.stats.leaks.leak_summary``
already returns its ``verdict``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kvaudit.core.vocabulary import Decision
from kvaudit.stats.noninferiority import DEFAULT_CONFIDENCE

DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8
TIE_TOL = 1e-6  # nats: a decoy gaining within this of the true name counts as beating it

# The SmolLM2 first-user capture measurement (DESIGN.md, leak probe facts).
REFERENCE_K = 20
REFERENCE_FIRST_RATE = 13 / 20
REFERENCE_POSITIVE_RATE = 38 / 40
REFERENCE_GAIN_NATS = 1.2
# min(shift with Phi(shift) = 38/40, shift with P(rank 1 | K = 20) = 13/20); tested against both.
REFERENCE_SHIFT = 1.6449
REFERENCE_EFFECT = (f"normal shift of the true name's gain by {REFERENCE_SHIFT:.2f} decoy-gain "
                    f"SDs (SmolLM2 first-user capture: +{REFERENCE_GAIN_NATS} nats for 38 of 40 "
                    f"names; ranked first of 20 for 13 of 20)")

_GH_NODES = 96  # Gauss-Hermite nodes for the shift model's rank distribution


# --------------------------------------------------------------------------- exposure rank test

def gain_rank(true_gain: float, decoy_gains: Sequence[float], tol: float = TIE_TOL) -> int:
    """Rank of the true name's gain among all candidates (1 = largest); ties count against it."""
    d = np.asarray(decoy_gains, dtype=float)
    return 1 + int(np.sum(d >= true_gain - tol))


_DIRECT_MAX = 100_000_000  # len(a) * len(b) above which a convolution goes through the FFT


def _conv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Convolution of two pmfs: exact below _DIRECT_MAX, else by FFT (absolute error about
    1e-15, so only tail probabilities far below any alpha lose digits)."""
    if len(a) * len(b) <= _DIRECT_MAX:
        return np.convolve(a, b)
    from scipy.signal import fftconvolve

    return np.clip(fftconvolve(a, b), 0.0, None)


def _conv_power(pmf: np.ndarray, n: int) -> np.ndarray:
    """The n-fold convolution of ``pmf`` by repeated squaring."""
    out, base = np.ones(1), pmf
    while n:
        if n & 1:
            out = _conv(out, base)
        n >>= 1
        if n:
            base = _conv(base, base)
    return out


def _sum_pmf(parts: dict[int, int], pmf_of: Callable[[int], np.ndarray]) -> np.ndarray:
    """pmf of a sum of independent terms: ``parts`` maps K to how many probes have it."""
    out = np.ones(1)
    for k, count in sorted(parts.items()):
        out = _conv(out, _conv_power(pmf_of(k), count))
    return out / out.sum()


def _counts(n_candidates: Sequence[int]) -> dict[int, int]:
    ks = [int(k) for k in n_candidates]
    if any(k < 1 for k in ks):
        raise ValueError("every probe needs at least one candidate")
    return dict(Counter(ks))


@lru_cache(maxsize=256)
def _null_pmf(parts: tuple[tuple[int, int], ...]) -> np.ndarray:
    return _sum_pmf(dict(parts), lambda k: np.full(k, 1.0 / k))


def rank_sum_null_pmf(n_candidates: Sequence[int]) -> np.ndarray:
    """Null pmf of ``S = sum_i (K_i - rank_i)`` over s = 0..sum(K_i - 1)."""
    return _null_pmf(tuple(sorted(_counts(n_candidates).items()))).copy()


def _upper_tail(pmf: np.ndarray) -> np.ndarray:
    """tail[s] = P(S >= s), summed from the top so tiny tails keep their precision."""
    return np.minimum(1.0, np.cumsum(pmf[::-1])[::-1])


def rank_sum_null_tail(n_candidates: Sequence[int]) -> np.ndarray:
    """``tail[s] = P(S >= s)`` under the null; the p-value of an observed s is ``tail[s]``."""
    return _upper_tail(rank_sum_null_pmf(n_candidates))


def rank_statistic(ranks: Sequence[int], n_candidates: Sequence[int]) -> int:
    """``S = sum_i (K_i - rank_i)``: large when the true names gain more than their decoys."""
    r, k = np.asarray(ranks, dtype=int), np.asarray(n_candidates, dtype=int)
    if r.shape != k.shape:
        raise ValueError("ranks and n_candidates must have one entry per probe")
    if np.any(r < 1) or np.any(r > k):
        raise ValueError("every rank must lie in 1..K")
    return int(np.sum(k - r))


def rank_test_p(ranks: Sequence[int], n_candidates: Sequence[int]) -> float:
    """Exact one-sided p-value of the rank test (1.0 for no probes)."""
    if len(ranks) == 0:
        return 1.0
    s = rank_statistic(ranks, n_candidates)
    return float(rank_sum_null_tail(n_candidates)[s])


@dataclass(frozen=True)
class RankTest:
    """The rank test on a set of probes; ``p_value`` is exact under exchangeability."""

    n: int
    statistic: int
    p_value: float
    mean_rank: float | None
    chance_rank: float | None  # mean of (K_i + 1) / 2
    n_first: int
    chance_first: float | None  # mean of 1 / K_i


def rank_test(ranks: Sequence[int], n_candidates: Sequence[int]) -> RankTest:
    """:func:`rank_test_p` with the descriptive numbers the report shows."""
    n = len(ranks)
    if n == 0:
        return RankTest(0, 0, 1.0, None, None, 0, None)
    k = np.asarray(n_candidates, dtype=float)
    r = np.asarray(ranks, dtype=float)
    return RankTest(n, rank_statistic(ranks, n_candidates), rank_test_p(ranks, n_candidates),
                    float(r.mean()), float(((k + 1) / 2).mean()), int(np.sum(r == 1)),
                    float((1 / k).mean()))


# --------------------------------------------------------------------------- power

@lru_cache(maxsize=1024)
def _shift_pmf(k: int, shift: float) -> np.ndarray:
    """pmf of K - rank (0..K-1) for the true name under the normal shift model."""
    from scipy.stats import binom, norm

    x, w = np.polynomial.hermite_e.hermegauss(_GH_NODES)
    w = w / w.sum()
    q = norm.sf(x + shift)  # P(one decoy beats the true name | its standard noise x)
    m = np.arange(k)  # decoys beating the true name
    pm = (binom.pmf(m[:, None], k - 1, q[None, :]) * w[None, :]).sum(axis=1)
    pmf = pm[::-1]  # K - rank = K - 1 - m
    return pmf / pmf.sum()


def rank_pmf_under_shift(n_candidates: int, shift: float) -> np.ndarray:
    """pmf of ``K - rank`` (index 0..K-1) when the true gain is shifted by ``shift`` SDs."""
    if n_candidates < 1:
        raise ValueError("a probe needs at least one candidate")
    return _shift_pmf(int(n_candidates), float(shift)).copy()


def first_rate(n_candidates: int, shift: float) -> float:
    """P(the true name's gain ranks first of ``n_candidates``) under the shift model."""
    return float(rank_pmf_under_shift(n_candidates, shift)[-1])


def shift_for_first_rate(rate: float, n_candidates: int) -> float:
    """The shift at which the true name ranks first with probability ``rate``."""
    from scipy.optimize import brentq

    if not 1 / n_candidates < rate < 1:
        raise ValueError(f"rate must lie strictly between chance 1/{n_candidates} and 1")
    return float(brentq(lambda s: first_rate(n_candidates, s) - rate, 0.0, 20.0, xtol=1e-6))


def rank_test_power(n_candidates: Sequence[int], *, shift: float = REFERENCE_SHIFT,
                    alpha: float = DEFAULT_ALPHA) -> float:
    """Power of the rank test (reject when p <= alpha) for probes with these candidate counts."""
    if not 0 < alpha < 1:
        raise ValueError("alpha must lie in (0, 1)")
    parts = _counts(n_candidates)
    if not parts:
        return 0.0
    tail = rank_sum_null_tail(n_candidates)
    reject = np.nonzero(tail <= alpha)[0]
    if reject.size == 0:
        return 0.0
    alt = _sum_pmf(parts, lambda k: rank_pmf_under_shift(k, shift))
    return float(min(1.0, alt[int(reject[0]):].sum()))


def min_probes(n_candidates: int, *, shift: float = REFERENCE_SHIFT, alpha: float = DEFAULT_ALPHA,
               power: float = DEFAULT_POWER, max_probes: int = 2000) -> int | None:
    """Fewest probes of ``n_candidates`` candidates each with at least ``power`` at ``shift``.

    None when ``max_probes`` do not reach it (e.g. one candidate per probe).
    """
    if n_candidates < 2:
        return None
    lo, hi = 1, 1
    while rank_test_power([n_candidates] * hi, shift=shift, alpha=alpha) < power:
        if hi >= max_probes:
            return None
        lo, hi = hi + 1, min(max_probes, hi * 2)
    # the discrete test's power is not strictly monotone in n; scan the last bracket upwards
    for n in range(lo, hi + 1):
        if rank_test_power([n_candidates] * n, shift=shift, alpha=alpha) >= power:
            return n
    return hi


def exposure_verdict(p_value: float, n_probes: int, needed_probes: int | None,
                     alpha: float = DEFAULT_ALPHA) -> str:
    """``"fail"`` when the rank test rejects at ``alpha`` (an exact test: valid at any n),
    ``"pass"`` when it does not and there were at least ``needed_probes`` (:func:`min_probes`),
    otherwise ``"undecided"`` (too few probes to have seen the reference effect)."""
    if p_value <= alpha:
        return "fail"
    if needed_probes is not None and n_probes >= needed_probes:
        return "pass"
    return "undecided"


# --------------------------------------------------------------------------- text leaks

def wilson_interval(k: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Two-sided Wilson interval for ``k`` leaks in ``n`` probes (statsmodels)."""
    from statsmodels.stats.proportion import proportion_confint

    if n <= 0 or not 0 <= k <= n:
        raise ValueError("need 0 <= k <= n and n > 0")
    if not 0.5 <= confidence < 1:
        raise ValueError("confidence must lie in [0.5, 1)")
    lo, hi = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    return float(max(0.0, lo)), float(min(1.0, hi))


def wilson_upper(k: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """Upper end of :func:`wilson_interval` (a one-sided (1 + confidence) / 2 bound)."""
    return wilson_interval(k, n, confidence)[1]


def probes_to_pass(max_rate: float, confidence: float = DEFAULT_CONFIDENCE,
                   limit: int = 10**7) -> int | None:
    """Fewest probes whose 0 text leaks give a Wilson upper bound <= ``max_rate``.

    None when no number does (``max_rate`` 0: an upper bound is never 0).
    """
    from scipy.stats import norm

    if max_rate <= 0:
        return None
    if max_rate >= 1:
        return 1
    z = float(norm.ppf(1 - (1 - confidence) / 2))
    # for k = 0 the Wilson upper bound is z^2 / (n + z^2); step from just below the closed form
    n = max(1, math.floor(z * z * (1 - max_rate) / max_rate) - 2)
    while wilson_upper(0, n, confidence) > max_rate:
        n += 1
        if n > limit:
            return None
    return n


@dataclass(frozen=True)
class TextLeakDecision:
    """``verdict`` is ``"pass"``, ``"fail"`` or ``"undecided"``; ``probes_to_pass`` is how many
    probes with 0 leaks would pass (None when none would)."""

    verdict: Decision
    leaks: int
    n: int
    rate: float | None
    lower: float | None
    upper: float | None
    max_rate: float
    probes_to_pass: int | None


def text_leak_decision(leaks: int, n: int, max_rate: float, *,
                       confidence: float = DEFAULT_CONFIDENCE) -> TextLeakDecision:
    """Pass when the Wilson upper bound <= ``max_rate``, fail when the lower bound > ``max_rate``,
    otherwise undecided. No probes is undecided."""
    if not 0 <= max_rate <= 1:
        raise ValueError("max_rate must lie in [0, 1]")
    need = probes_to_pass(max_rate, confidence)
    if n <= 0:
        return TextLeakDecision("undecided", 0, 0, None, None, None, max_rate, need)
    lo, hi = wilson_interval(leaks, n, confidence)
    verdict: Decision = "pass" if hi <= max_rate else "fail" if lo > max_rate else "undecided"
    return TextLeakDecision(verdict, leaks, n, leaks / n, lo, hi, max_rate, need)
