"""Paired statistics for arm-vs-recompute comparisons, in points, for the report and the gate.

Conventions used throughout the report and the gate:

* A *delta* is ``mean(arm score) - mean(recompute score)`` over the same cases, in points
  (scores in [0, 1] times 100), so -2 means "two points worse than recompute".
* The interval is :func:`kvaudit.stats.noninferiority.paired_bound`: a score interval (Tango's
  for 0/1 scores, its restricted-likelihood extension for F1-like scores) widened by the design
  effect of cases sharing documents (a case on several documents shares with each), with a t
  quantile on the number of documents. ``ci`` is the two-sided interval at ``confidence``
  (default 95%); ``lower_bound``/``upper_bound`` are its ends, each a one-sided bound at
  ``(1 + confidence) / 2``: what the forest plot draws is what the gate judges. Fewer than
  :data:`~kvaudit.stats.noninferiority.MIN_CLUSTERS` documents, or too small an effective sample,
  give no interval (``decidable`` False, ``reason`` says why).
* The paired test is McNemar (exact binomial when fewer than 25 discordant pairs) when both
  arms' scores are 0/1, else the Wilcoxon signed-rank test; Holm adjusts p-values across the
  strata of one comparison. These tests are descriptive (they treat cases as independent); the
  interval is the evidence the gate uses.
* The **minimum detectable delta** (:func:`kvaudit.stats.noninferiority.detectable_delta`) is
  the smallest loss the run would detect with 80% power; it is capped at 100 points.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvaudit.stats.noninferiority import DEFAULT_CONFIDENCE, detectable_delta, paired_bound

DEFAULT_BOOT = 2000  # resamples of cluster_bootstrap_means (descriptive intervals only)
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


def is_binary(*arrays: npt.ArrayLike) -> bool:
    return all(np.isin(np.asarray(a, dtype=float), (0.0, 1.0)).all() for a in arrays)


def mcnemar_p(ref: npt.ArrayLike, arm: npt.ArrayLike) -> float:
    """McNemar p-value for paired 0/1 outcomes (exact when fewer than 25 discordant pairs)."""
    from statsmodels.stats.contingency_tables import mcnemar

    r, a = np.asarray(ref, dtype=bool), np.asarray(arm, dtype=bool)
    b, c = int((r & ~a).sum()), int((~r & a).sum())
    if b + c == 0:
        return 1.0
    table = [[int((r & a).sum()), b], [c, int((~r & ~a).sum())]]
    return float(mcnemar(table, exact=b + c < _EXACT_MCNEMAR_BELOW, correction=True).pvalue)


def wilcoxon_p(diffs: npt.ArrayLike) -> float:
    """Wilcoxon signed-rank p-value of paired differences (1.0 when none differ)."""
    from scipy.stats import wilcoxon

    d = np.asarray(diffs, dtype=float)
    if not np.any(d != 0):
        return 1.0
    return float(wilcoxon(d, zero_method="wilcox").pvalue)


def paired_test(ref: npt.ArrayLike, arm: npt.ArrayLike) -> tuple[str, float]:
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


def _points(x: float) -> float:
    """A delta on the [0, 1] score scale in points, clipped to the possible [-100, 100]."""
    return SCALE * min(1.0, max(-1.0, x))


def non_inferior(lower_bound: float | None, margin: float) -> bool:
    """True when the one-sided lower bound of the delta clears the (negative) margin."""
    return lower_bound is not None and lower_bound >= margin


@dataclasses.dataclass(frozen=True)
class PairedDelta:
    """One paired comparison, deltas in points (:func:`paired_delta`): ``n`` cases on
    ``n_clusters`` documents; the means, the delta, the two-sided interval ``ci`` and its ends
    (each a one-sided bound), the design effect ``deff``, the effective sample ``n_eff``, the
    per-case variance of the differences ``var``, whether the interval exists (``decidable``,
    ``reason`` when not), the descriptive paired ``test`` and its ``p``, the minimum detectable
    delta ``mdd``, and whether both arms' scores are 0/1 (``binary``). Without cases, the means,
    delta, bounds, test and MDD are None."""

    n: int
    n_clusters: int
    deff: float
    n_eff: float
    var: float
    decidable: bool
    reason: str
    binary: bool | None = None
    mean_ref: float | None = None
    mean_arm: float | None = None
    delta: float | None = None
    ci: list[float] | None = None
    lower_bound: float | None = None
    upper_bound: float | None = None
    test: str | None = None
    p: float | None = None
    mdd: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The record as summary.json and the exports write it."""
        return dataclasses.asdict(self)


def paired_delta(ref: Sequence[float], arm: Sequence[float], memberships: Sequence[Sequence[str]], *,
                 confidence: float = DEFAULT_CONFIDENCE, min_icc: float = 0.0) -> PairedDelta:
    """Everything the report says about one paired comparison (:class:`PairedDelta`).

    ``memberships``: per case, the documents it rests on (:func:`kvaudit.reports.scoring.documents`).
    """
    r, a = np.asarray(ref, dtype=float), np.asarray(arm, dtype=float)
    if r.shape != a.shape or len(r) != len(memberships):
        raise ValueError("ref, arm and memberships must have the same length")
    n = len(r)
    b = paired_bound(a - r, memberships, confidence=confidence, min_icc=min_icc)
    base = PairedDelta(n=n, n_clusters=b.n_clusters, deff=b.deff, n_eff=b.n_eff, var=b.var, decidable=b.decidable,
                       reason=b.reason)
    if n == 0:
        return base
    assert b.mean is not None  # n > 0
    test, p = paired_test(r, a)
    lower = upper = None
    if b.decidable and b.lower is not None and b.upper is not None:
        lower, upper = _points(b.lower), _points(b.upper)
    mdd = detectable_delta(b)
    return dataclasses.replace(
        base, binary=is_binary(r, a), mean_ref=SCALE * r.mean(), mean_arm=SCALE * a.mean(),
                       delta=SCALE * b.mean, ci=None if lower is None or upper is None else [lower, upper],
                       lower_bound=lower, upper_bound=upper, test=test, p=p,
                       mdd=None if mdd is None else SCALE * mdd)
