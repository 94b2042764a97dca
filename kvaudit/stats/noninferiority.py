"""The paired bound every verdict uses: a score interval for a mean score difference, corrected
for cases that share documents.

Inputs are per-case differences ``d_i = arm_i - reference_i`` of scores in [0, 1] (so each
``d_i`` lies in [-1, 1]) and, per case, the documents it rests on.

**Score interval.** For a hypothesised mean difference ``δ0`` the variance of ``d`` is taken
under the null, not from the sample: the restricted maximum-likelihood distribution of ``d``
with mean ``δ0``, supported on the observed values plus the extremes -1 and +1 (which may carry
mass no case showed). For 0/±1 differences (paired binary scores) this is exactly Tango's
score interval for a difference of paired proportions; for F1-like scores it is the same
construction on the empirical support (empirical likelihood). The statistic is
``Z(δ0) = (mean - δ0) / sqrt(deff * var0(δ0) / n)`` and a bound is the ``δ0`` where ``Z``
equals the quantile. A Wald or percentile-bootstrap interval uses the sample's own spread,
which shrinks exactly when few losses happened to be drawn, so it passes too often at the
margin when losses are rare; the null variance does not.

**Documents.** Cases that share a document are dependent (a document the model reads badly
hurts every question on it); a case on documents {A, B} shares with the cases on A and those
on B. The design effect is the network-robust (multiway) sandwich variance over the plain one,
``deff = max(1, [G/(G-1)] Σ_{i~j} e_i e_j / [n/(n-1)] Σ e_i²)`` with ``e`` the centred
differences, ``i~j`` when cases i and j share at least one document (i~i included) and ``G``
the number of distinct documents. The quantile is Student's t with ``G - 1`` degrees of
freedom. The effective sample size is ``n / deff``.

**Concentrated fragility is the limit.** When a handful of documents carries almost all the
losses (in the benchmark: 10% of 20-30 documents at 190 times the others' rate), a sample often
holds none of them and looks clean, and no bound computed from the sample alone can know better:
false passes then reach 13-16% (the old bootstrap did the same or worse). More documents fix it
(the same concentration over 200 documents is calibrated); ``min_icc`` (a policy field) floors
the design effect at ``1 + (m - 1) * min_icc`` for teams that know their documents differ that
much, at a large cost in power.

**When no decision is possible.** Fewer than :data:`MIN_CLUSTERS` documents, or an effective
sample size below :data:`MIN_EFFECTIVE_N`, give no bound (``decidable`` False, with the reason):
200 unchanged cases on 2 documents are two observations, not 200.

The bounds' operating characteristic (false-pass rate at the margin, coverage, power) is
simulated by ``benchmarks/gate_calibration.py``; a slice of it runs in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

DEFAULT_CONFIDENCE = 0.95  # two-sided; each bound is one-sided at (1 + confidence) / 2
MIN_CLUSTERS = 10
MIN_EFFECTIVE_N = 10.0
DEFAULT_MIN_ICC = 0.0  # no assumed intra-document correlation beyond what the sample shows
_EPS = 1e-12


@dataclass(frozen=True)
class PairedBound:
    """A paired mean difference on the [-1, 1] scale with its two one-sided bounds.

    ``lower``/``upper`` are each one-sided at ``(1 + confidence) / 2``: together the two-sided
    ``confidence`` interval, so what a report plots is what a gate uses.
    """

    n: int
    n_clusters: int
    mean: float | None
    lower: float | None
    upper: float | None
    confidence: float
    var: float  # per-case variance of the differences (ddof 0)
    deff: float
    n_eff: float
    df: int
    decidable: bool
    reason: str

    @property
    def one_sided_level(self) -> float:
        return (1 + self.confidence) / 2


def check_confidence(confidence: float, where: str = "confidence") -> float:
    """``confidence`` must be a two-sided level in [0.8, 0.999]: below that a 'bound' is close
    to the point estimate and a gate built on it passes about half the runs at its margin."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) \
            or not 0.8 <= float(confidence) <= 0.999:
        raise ValueError(f"{where} must be a two-sided confidence level in [0.8, 0.999], got {confidence!r}")
    return float(confidence)


def _clusters_of(memberships: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    out = []
    for i, m in enumerate(memberships):
        # one label (a string or a number) is one document; a collection is a set of them
        single = isinstance(m, (str, bytes, int, float, np.integer))
        docs = (str(m),) if single else tuple(sorted({str(x) for x in m}))
        out.append(docs or (f"\x00case{i}",))  # a case on no document is its own cluster
    return out


def shared_sum(e: np.ndarray, memberships: Sequence[Sequence[str] | str]) -> tuple[float, int, float]:
    """``(Σ_{i~j} e_i e_j, G, m)``: the sum over ordered pairs of cases sharing a document (each
    case with itself included), the number of distinct documents, and the mean number of cases
    a case shares a document with (itself included: the size-weighted cluster size)."""
    from scipy import sparse

    docs = _clusters_of(memberships)
    index: dict[str, int] = {}
    rows, cols = [], []
    for i, ds in enumerate(docs):
        for d in ds:
            rows.append(i)
            cols.append(index.setdefault(d, len(index)))
    n, g = len(docs), len(index)
    if all(len(ds) == 1 for ds in docs):  # one document per case: plain cluster sums
        cols_ = np.asarray(cols)
        sums = np.bincount(cols_, weights=e, minlength=g)
        sizes = np.bincount(cols_, minlength=g).astype(float)
        return float(sums @ sums), g, float(sizes @ sizes / n)
    m = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, g))
    share = (m @ m.T).tocsr()
    share.data[:] = 1.0
    return float(e @ (share @ e)), g, share.nnz / n


def design_effect(d: np.ndarray, memberships: Sequence[Sequence[str]], *,
                  min_icc: float = 0.0) -> tuple[float, int]:
    """``(deff, G)``: network-robust over independent variance of the mean, at least 1 and at
    least ``1 + (m - 1) * min_icc`` (the design effect an intra-document correlation of
    ``min_icc`` gives clusters of size-weighted mean size ``m``)."""
    n = len(d)
    e = d - d.mean()
    plain = float(e @ e)
    shared, g, m = shared_sum(e, memberships)
    floor = max(1.0, 1.0 + (m - 1.0) * min_icc)
    if plain <= _EPS or n < 2 or g < 2:
        return floor, g
    ratio = (shared * g / (g - 1)) / (plain * n / (n - 1))
    return max(floor, ratio), g


def _restricted_variance(values: np.ndarray, counts: np.ndarray, delta0: float) -> float:
    """Variance of the maximum-likelihood distribution with mean ``delta0 < mean`` on the
    observed ``values`` (with ``counts``) plus the point -1 (count 0 unless observed)."""
    n = counts.sum()
    x = values - delta0
    has_floor = values[0] <= -1 + _EPS
    if not has_floor:
        # Mass on the unobserved -1 when the tilt that would reach delta0 on the observed
        # values alone is steeper than putting it there (KKT boundary of the zero-count point).
        p = counts * (1 + delta0) / (n * (1 + values))
        s = float(p.sum())
        if s <= 1:
            pe = 1 - s
            return float(p @ (x * x) + pe * (1 + delta0) ** 2)
    # Interior solution: p_k = c_k / (n (1 + lam x_k)), sum_k p_k x_k = 0, lam > 0.
    from scipy.optimize import brentq

    hi = 1 / (-x.min()) if x.min() < 0 else np.inf
    if not has_floor:
        hi = min(hi, 1 / (1 + delta0))
    lam_hi = hi if np.isfinite(hi) else 1.0
    while not np.isfinite(hi) and _g(lam_hi, x, counts) > 0:
        lam_hi *= 2
    lam_hi *= 1 - 1e-12
    lam = float(brentq(_g, 0.0, lam_hi, args=(x, counts), xtol=1e-14, rtol=1e-12))
    p = counts / (n * (1 + lam * x))
    p = p / p.sum()
    return float(p @ (x * x))


def _g(lam: float, x: np.ndarray, counts: np.ndarray) -> float:
    return float((counts * x / (1 + lam * x)).sum())


def _score_lower(d: np.ndarray, q: float, deff: float) -> float:
    """Lower one-sided score bound of the mean of ``d`` at quantile ``q``."""
    from scipy.optimize import brentq

    n = len(d)
    mean = float(d.mean())
    if mean <= -1 + _EPS:
        return -1.0
    values, counts = np.unique(d, return_counts=True)
    counts = counts.astype(float)

    def excess(delta0: float) -> float:
        var0 = _restricted_variance(values, counts, delta0)
        return (mean - delta0) - q * np.sqrt(max(deff * var0, 0.0) / n)

    lo = -1 + 1e-12
    if excess(lo) <= 0:
        return -1.0
    hi = mean - 1e-15
    if excess(hi) >= 0:  # cannot happen for q > 0 unless var0 vanishes
        return mean
    return float(brentq(excess, lo, hi, xtol=1e-10))


def paired_bound(diffs: npt.ArrayLike, memberships: Sequence[Sequence[str]], *,
                 confidence: float = DEFAULT_CONFIDENCE, min_clusters: int = MIN_CLUSTERS,
                 min_effective_n: float = MIN_EFFECTIVE_N, min_icc: float = DEFAULT_MIN_ICC) -> PairedBound:
    """Score bounds of ``mean(diffs)`` with a document design effect (see module docstring)."""
    from scipy.stats import t as student_t

    confidence = check_confidence(confidence)
    d = np.clip(np.asarray(diffs, dtype=float), -1.0, 1.0)
    if len(d) != len(memberships):
        raise ValueError("diffs and memberships must have the same length")
    n = len(d)
    if n == 0:
        return PairedBound(0, 0, None, None, None, confidence, 0.0, 1.0, 0.0, 0, False, "no cases")
    if not 0 <= min_icc < 1:
        raise ValueError(f"min_icc must be in [0, 1), got {min_icc!r}")
    deff, g = design_effect(d, memberships, min_icc=min_icc)
    n_eff = n / deff
    mean, var = float(d.mean()), float(d.var())
    df = max(g - 1, 1)
    if g < min_clusters:
        return PairedBound(n, g, mean, None, None, confidence, var, deff, n_eff, df, False,
                           f"{n} case(s) on {g} document(s): at least {min_clusters} documents are "
                           "needed for a decision")
    if n_eff < min_effective_n:
        return PairedBound(n, g, mean, None, None, confidence, var, deff, n_eff, df, False,
                           f"effective sample size {n_eff:.1f} (n={n}, design effect {deff:.2f}) is "
                           f"below {min_effective_n:g}")
    q = float(student_t.ppf((1 + confidence) / 2, df))
    lower = _score_lower(d, q, deff)
    upper = -_score_lower(-d, q, deff)
    return PairedBound(n, g, mean, lower, upper, confidence, var, deff, n_eff, df, True, "")


def detectable_delta(bound: PairedBound, *, power: float = 0.80) -> float | None:
    """Smallest loss (on the [-1, 1] scale) the design would detect with ``power``: the
    standard error at the observed spread, floored at what 3 discordant cases in ``n_eff``
    would give (so a run in which nothing changed still says how small a change it could
    miss). Capped at 1 (cannot detect any)."""
    from scipy.stats import norm
    from scipy.stats import t as student_t

    if bound.n == 0:
        return None
    n_eff = max(bound.n_eff, 1.0)
    spread_floor = min(1.0, 3.0 / n_eff)
    var = max(bound.var, spread_floor) / n_eff
    q = float(student_t.ppf(bound.one_sided_level, bound.df)) + float(norm.ppf(power))
    return min(1.0, q * float(np.sqrt(var)))

