"""Paired statistics for arm-vs-recompute comparisons (statsmodels and scipy do the maths).

Conventions used throughout the report and the gate:

* A *delta* is ``mean(arm score) - mean(recompute score)`` over the same cases, in points
  (scores in [0, 1] times 100), so -2 means "two points worse than recompute".
* Intervals come from a paired **cluster bootstrap**: the per-case differences are grouped by
  cluster (cases resting on the same evidence documents, see
  :func:`kvaudit.reports.scoring.cluster_key`) and whole clusters are resampled with
  replacement; the statistic is the case-weighted mean difference. ``ci`` is the two-sided
  percentile interval at ``confidence``; ``lower_bound`` / ``upper_bound`` are the one-sided
  bounds at ``confidence`` (what non-inferiority uses). Fewer than two clusters gives no interval.
  Every bound lies at least ``z * SE_floor`` from the mean, where ``SE_floor`` is the SE that 3
  discordant cases in n would give (rule of three): a bootstrap of pairs that never differ has
  no spread, yet 30 unchanged cases cannot rule out a 10% change.
* The paired test is McNemar (exact binomial when fewer than 25 discordant pairs) when both
  arms' scores are 0/1, else the Wilcoxon signed-rank test. These tests treat cases as
  independent; the clustered interval is the primary evidence. Holm adjusts p-values across
  the strata of one comparison.
* The **minimum detectable delta** is ``(z[confidence] + z[power]) * SE``, with SE the bootstrap
  standard error, floored at ``SE_floor``, so a run in which nothing changed still says how
  small a change it could have missed; it is capped at 100 points (cannot detect any).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOT = 2000
DEFAULT_POWER = 0.80
SCALE = 100.0  # scores are in [0, 1]; deltas are reported in points
_EXACT_MCNEMAR_BELOW = 25


def cluster_bootstrap_means(diffs: Sequence[float], clusters: Sequence[Any], *,
                            n_boot: int = DEFAULT_BOOT, seed: int = 0) -> np.ndarray:
    """Bootstrap distribution of the mean of ``diffs``, resampling whole clusters."""
    d = np.asarray(diffs, dtype=float)
    _, inverse = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    sums = np.bincount(inverse, weights=d)
    counts = np.bincount(inverse).astype(float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(sums), size=(n_boot, len(sums)))
    return sums[idx].sum(axis=1) / counts[idx].sum(axis=1)


def is_binary(*arrays: Sequence[float]) -> bool:
    return all(np.isin(np.asarray(a, dtype=float), (0.0, 1.0)).all() for a in arrays)


def mcnemar_p(ref: Sequence[float], arm: Sequence[float]) -> float:
    """McNemar p-value for paired 0/1 outcomes (exact when fewer than 25 discordant pairs)."""
    from statsmodels.stats.contingency_tables import mcnemar

    r, a = np.asarray(ref, dtype=bool), np.asarray(arm, dtype=bool)
    b, c = int((r & ~a).sum()), int((~r & a).sum())
    if b + c == 0:
        return 1.0
    table = [[int((r & a).sum()), b], [c, int((~r & ~a).sum())]]
    return float(mcnemar(table, exact=b + c < _EXACT_MCNEMAR_BELOW, correction=True).pvalue)


def wilcoxon_p(diffs: Sequence[float]) -> float:
    """Wilcoxon signed-rank p-value of paired differences (1.0 when none differ)."""
    from scipy.stats import wilcoxon

    d = np.asarray(diffs, dtype=float)
    if not np.any(d != 0):
        return 1.0
    return float(wilcoxon(d, zero_method="wilcox").pvalue)


def paired_test(ref: Sequence[float], arm: Sequence[float]) -> tuple[str, float]:
    """``("mcnemar", p)`` for 0/1 scores, else ``("wilcoxon", p)``."""
    if is_binary(ref, arm):
        return "mcnemar", mcnemar_p(ref, arm)
    return "wilcoxon", wilcoxon_p(np.asarray(arm, dtype=float) - np.asarray(ref, dtype=float))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values; ``None``/NaN entries stay ``None`` and do not count."""
    from statsmodels.stats.multitest import multipletests

    keep = [i for i, p in enumerate(pvalues) if p is not None and not np.isnan(p)]
    out: list[float | None] = [None] * len(pvalues)
    if keep:
        adjusted = multipletests([pvalues[i] for i in keep], method="holm")[1]
        for i, p in zip(keep, adjusted, strict=True):
            out[i] = float(p)
    return out


def wilson(k: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float] | None:
    """Wilson score interval for k successes in n trials (None when n == 0)."""
    from statsmodels.stats.proportion import proportion_confint

    if n <= 0:
        return None
    lo, hi = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    return float(lo), float(hi)


def min_detectable_delta(se: float, n: int, *, confidence: float = DEFAULT_CONFIDENCE,
                         power: float = DEFAULT_POWER) -> float | None:
    """Smallest true delta (same units as ``se``, on the [0, 1] score scale) the run would
    detect one-sided at ``confidence`` with ``power``."""
    from scipy.stats import norm

    if n <= 0:
        return None
    # Scores live in [0, 1], so no delta beyond 1 can exist: cap there ("cannot detect any").
    return min(1.0, float((norm.ppf(confidence) + norm.ppf(power)) * max(se, _se_floor(n))))


def _points(x: float) -> float:
    """A delta on the [0, 1] score scale in points, clipped to the possible [-100, 100]."""
    return SCALE * min(1.0, max(-1.0, x))


def _se_floor(n: int) -> float:
    """SE of a mean of n paired 0/±1 differences if 3 in n differed (rule of three)."""
    return float(np.sqrt(min(1.0, 3.0 / n) / n))


def non_inferior(lower_bound: float | None, margin: float) -> bool:
    """True when the one-sided lower bound of the delta clears the (negative) margin."""
    return lower_bound is not None and lower_bound >= margin


def paired_delta(ref: Sequence[float], arm: Sequence[float], clusters: Sequence[Any], *,
                 confidence: float = DEFAULT_CONFIDENCE, n_boot: int = DEFAULT_BOOT,
                 seed: int = 0) -> dict[str, Any]:
    """Everything the report says about one paired comparison, deltas in points.

    Keys: n, n_clusters, mean_ref, mean_arm, delta, ci [lo, hi] or None, lower_bound,
    upper_bound, se, test, p, mdd, binary.
    """
    r, a = np.asarray(ref, dtype=float), np.asarray(arm, dtype=float)
    if r.shape != a.shape or len(r) != len(clusters):
        raise ValueError("ref, arm and clusters must have the same length")
    n = len(r)
    out: dict[str, Any] = {"n": n, "n_clusters": len(set(map(str, clusters))), "binary": None,
                           "mean_ref": None, "mean_arm": None, "delta": None, "ci": None,
                           "lower_bound": None, "upper_bound": None, "se": None, "test": None,
                           "p": None, "mdd": None}
    if n == 0:
        return out
    d = a - r
    out.update(mean_ref=SCALE * r.mean(), mean_arm=SCALE * a.mean(), delta=SCALE * d.mean(),
               binary=is_binary(r, a))
    out["test"], out["p"] = paired_test(r, a)
    se = 0.0
    if out["n_clusters"] >= 2:
        from scipy.stats import norm

        boots = cluster_bootstrap_means(d, clusters, n_boot=n_boot, seed=seed)
        tail = (1 - confidence) / 2
        # A bootstrap of pairs that (almost) never differ has (almost) no spread; widen each
        # bound to at least the rule-of-three SE so "nothing changed in 30 cases" is not "safe".
        mean, floor = float(d.mean()), _se_floor(n)
        two, one = norm.ppf(1 - tail) * floor, norm.ppf(confidence) * floor
        out["ci"] = [_points(min(float(np.quantile(boots, tail)), mean - two)),
                     _points(max(float(np.quantile(boots, 1 - tail)), mean + two))]
        out["lower_bound"] = _points(min(float(np.quantile(boots, 1 - confidence)), mean - one))
        out["upper_bound"] = _points(max(float(np.quantile(boots, confidence)), mean + one))
        se = float(boots.std(ddof=1))
        out["se"] = SCALE * se
    mdd = min_detectable_delta(se, n, confidence=confidence)
    out["mdd"] = None if mdd is None else SCALE * mdd
    return out
