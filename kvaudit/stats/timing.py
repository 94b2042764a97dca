"""Timing side channel and tenant isolation: how well time-to-first-token (TTFT) tells a prefix
cache hit from a miss, with a calibrated interval and gate, and the deterministic isolation
verdict on cached-token counts.

Pure functions on numbers (numpy, scipy, statsmodels); nothing here knows about runs or records.

**Data.** Per case i (a prompt) one request that hit the prefix cache and one that missed it,
``hit_i`` and ``miss_i`` (TTFT, any unit). Cases differ in prompt length, so TTFTs vary across
cases much more than within one; the two requests of a case share that case effect (and the
load of the moment), so they are positively correlated.

**Estimand.** ``AUC = P(M > H) + 0.5 P(M = H)`` for the miss TTFT M of one random prompt and the
hit TTFT H of another, independent one: what an observer achieves with a threshold on TTFT,
not knowing the prompt's own baseline (ties are a coin flip). The estimate is the U-statistic
over the n(n - 1) cross-case pairs, ``sum_{i != j} psi(miss_i, hit_j) / (n (n - 1))``. The own
case's pair is left out: it estimates another quantity (the paired accuracy, below), and
including it biases the AUC by (paired accuracy - AUC) / n, up to 0.05 at n = 10.

**Variance.** Obuchowski's (1997) clustered DeLong variance with one cluster per case: the
structural components ``V10_i`` (share of the other cases' hits below ``miss_i``) and ``V01_i``
(share of the other cases' misses above ``hit_i``) are summed per case, and
``var = sum_i (V10_i + V01_i - 2 AUC)^2 / (n (n - 1))``. With one hit and one miss per case this
is Sen's variance of a one-sample U-statistic whose observations are the cases. The naive
two-sample DeLong variance drops the within-case covariance term
``2 sum_i (V10_i - AUC)(V01_i - AUC)``; their ratio is the pairing's design effect ``deff``.
The case effect makes that covariance negative (a long prompt has a slow miss, ranking high, and
a slow hit, ranking low), so the naive interval is too wide: ``deff`` is below 1, often far below
(median 0.04 at a true AUC of 0.5, 0.16 at 0.75, 0.5 at 0.9 in the benchmark's main scenario,
whose naive intervals are up to 4.5 times as wide).

**Interval.** A Wald interval, on the AUC or the logit scale, collapses where the estimate
reaches 0 or 1 (every structural component equal: variance 0) and undercovers near it, which is
exactly where a strong side channel lives (the naive DeLong Wald interval covers a true AUC of
0.99 in 41% of runs of 10 cases, 65% of 20). Here the bounds are the ``theta`` with
``(AUC - theta)^2 = q^2 max(V(theta), V(AUC))`` (a score-type inversion, as Wilson's is for a
proportion; Newcombe 2006 does the same for the unpaired AUC), ``q`` Student's t quantile with
n - 1 degrees of freedom at ``(1 + confidence) / 2`` and

    V(theta) = k * V1(theta) + theta (1 - theta) / (n (n - 1)):

``V1`` is the first-order part of Hanley and McNeil's (1982) variance of an AUC of n misses and
n hits (exponential model, ``Q1 = theta / (2 - theta)``, ``Q2 = 2 theta^2 / (1 + theta)``),
used only for its shape in ``theta``; ``k = var / V1(AUC)`` sets its level to the clustered
variance at the estimate; the second term is the per-comparison (second-order) variance of the
U-statistic, which pairing does not cancel and which matters at small n when ``deff`` is small
(without it the upper end fell short up to 7.6% of the time at 10 cases). The variance is taken at
the hypothesised AUC, so it never vanishes inside (0, 1), but never below its value at the
estimate: the model's variance shrinks toward 1 faster than that of rare slow hits (stalls)
does, and without the floor the upper end fell short 8% of the time at 10 cases when a few
stalls made the AUC 0.99.

**At AUC 0 or 1** both ``var`` and ``V1`` vanish and ``k`` is 1 (Hanley and McNeil's own
variance, that of an independent design; timing data have ``deff`` below 1, so this is
conservative): the upper end is 1 and the lower end ``L(n)`` is finite and rises with n (0.742 at
n = 10, 0.884 at 20, 0.958 at 50, 0.990 at 200). No lower end exceeds ``L(n)`` (nor an upper end
falls below ``1 - L(n)``): no sample of n cases shows more than complete separation, and without
the cap a sample with one slow hit would claim more. The alternatives were worse: a continuity
adjustment (half a discordant pair) gives 0.90 at n = 10, optimistic when discordances are rare
events; the bound free of the distribution (``floor(n / 2)`` independent cross pairs all
concordant) gives 0.48, too loose to fail even a perfect channel.

**Paired accuracy.** ``P(miss_i > hit_i)`` (ties half) over cases, with a Wilson interval: what
an observer who knows the prompt's own miss TTFT achieves. It is usually far above the AUC when
the case effect is large, so the two together say how much of the channel needs a baseline.

**Requests to distinguish.** :func:`requests_to_distinguish` models each comparison of a hit
with a miss as correct with probability ``auc`` and a majority vote over m comparisons: the
smallest odd m whose binomial error is at most ``error``. :class:`TimingAUC` gives it at the
estimate and at the interval's end farthest from 0.5 (the attacker's best case: the defender's
number), each taken as a separation ``max(AUC, 1 - AUC)``: slower hits are told apart as well.

**Decision.** :func:`timing_decision` passes when the interval shows the channel weak in both
directions (upper end <= ``max_auc`` and lower end >= ``1 - max_auc``: an engine whose hits are
*slower* leaks as much), fails when the lower end > ``max_auc`` or the upper end < ``1 - max_auc``,
and otherwise, or with fewer than :data:`MIN_CASES` cases, cannot judge. At a true AUC equal to
``max_auc`` it should pass at most (1 - confidence) / 2 of the time (0.025 at 95%; the ceiling is
0.05). ``benchmarks/timing_calibration.py`` simulates coverage and false passes over true AUCs
0.5-1 and 10-500 cases, with heavy tails, stalls and timer ties, plus stress scenarios (speed-up
varying by prompt, a 10 ms timer, weak or no case effect); a slice runs in
``tests/test_timing_stats.py``. Known limit: where a true AUC near 1 comes from rare events (a
few stalled hits per hundred cases), a sample that happens to hold none looks cleaner than the
truth, and the lower end can exceed the truth (11% of runs in one stress cell). That errs
towards "fail", never towards "pass".

**Cases run together.** With ``--concurrent-cases B`` the probes of B cases run as one engine
batch, so a batch's requests share its timing (in one engine batch each first token waits for the
batch's prefill) and the cases are no longer the independent units. Given each case's batch the
AUC compares only cases of different batches (the own batch's pairs share its conditions, as the
own case's do), Obuchowski's variance sums the structural components per batch
(``K / (K - 1) * sum_c S_c^2 / n^2`` over K batches; one case per batch gives the variance above),
and the K batches are the interval's units: its shape, t quantile (K - 1 degrees of freedom),
separation cap and the gate's minimum (:data:`MIN_CASES` batches) all take n = K. The paired
accuracy's Wilson interval takes K trials (a batch's share lies in [0, 1], so its variance is at
most a Bernoulli's). ``benchmarks/timing_calibration.py --batches`` (a batch's requests each get its total, or their
own cost plus half the others' under a shared load; 80-200 cases in batches of 1-16, true AUC
0.5-1, 1,000 runs a row): coverage 0.957-1.000 and false pass at most 0.029 by batch, where the
interval clustered by case covered as little as 0.28.

**Isolation.** :func:`isolation_decision` is deterministic: per case, the cached-prompt tokens
reported for the same tenant's repeat of a prompt (must be > 0: the cache is on and reused) and
for another tenant's identical request (must be 0). It lives here beside the timing decision as
a verdict on numbers, like :func:`kvaudit.stats.leak_tests.text_leak_decision`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kvaudit.stats.noninferiority import (  # one level, one validator
    DEFAULT_CONFIDENCE,
    check_confidence,
)

DEFAULT_ERROR = 0.05  # the observer's error probability in requests_to_distinguish
MIN_CASES = 10  # fewer cases: the timing gate cannot judge
MAX_REQUESTS = 10**12  # requests_to_distinguish gives None above this
_BISECT_STEPS = 60  # 2^-60 of [0, 1]: below float resolution of an AUC

PASS, FAIL, CANNOT_JUDGE = "pass", "fail", "cannot_judge"


@dataclass(frozen=True)
class TimingAUC:
    """The timing side channel of one run: AUC with its interval and the numbers around it.

    ``lower``/``upper`` are each one-sided at ``(1 + confidence) / 2`` (together the two-sided
    ``confidence`` interval). ``se`` is the clustered standard error at the estimate and
    ``deff`` the pairing's design effect (clustered over naive two-sample DeLong variance; 1
    where both vanish). ``median_ratio`` is median miss over median hit TTFT (None when the
    median hit is 0). ``requests_needed`` is :func:`requests_to_distinguish` at the estimate's
    separation ``max(AUC, 1 - AUC)``, ``requests_needed_best_case`` at the interval end farthest
    from 0.5: an AUC below 0.5 (hits slower than misses, as SGLang's one-token extends were on the
    H200) tells hit from miss as well, to an observer who flips the threshold. None at exactly 0.5.
    """

    n: int
    auc: float
    lower: float
    upper: float
    confidence: float
    se: float
    deff: float
    paired_accuracy: float
    paired_lower: float
    paired_upper: float
    median_hit: float
    median_miss: float
    median_ratio: float | None
    error: float
    requests_needed: int | None
    requests_needed_best_case: int | None
    batches: int | None = None  # the run's cases ran in this many batches (--concurrent-cases); None: one at a time
    unjudged: str | None = None  # why the gate cannot judge this interval whatever it says

    @property
    def units(self) -> int:
        """The interval's independent units: its batches where cases ran together, else its cases."""
        return self.batches if self.batches is not None else self.n

    @property
    def one_sided_level(self) -> float:
        return (1 + self.confidence) / 2


# --------------------------------------------------------------------------- the AUC


def _pairs(hit: Sequence[float] | np.ndarray, miss: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h, m = np.asarray(hit, dtype=float), np.asarray(miss, dtype=float)
    if h.ndim != 1 or h.shape != m.shape:
        raise ValueError(f"need one hit and one miss TTFT per case, got {h.shape} hits and {m.shape} misses")
    if not (np.all(np.isfinite(h)) and np.all(np.isfinite(m))):
        raise ValueError("TTFTs must be finite (drop failed requests' cases first)")
    if len(h) < 2:
        raise ValueError("the AUC needs at least two cases (it compares different prompts)")
    return h, m


def _psi(miss: np.ndarray, hit: np.ndarray) -> np.ndarray:
    """1 where the miss is slower, 0.5 on a tie, 0 where the hit is slower."""
    return (miss > hit) + 0.5 * (miss == hit)


def cluster_index(labels: Sequence[object], n: int) -> np.ndarray:
    """Each of n cases' cluster label (its batch) as 0..K-1; ValueError unless every case has one
    and there are at least two clusters."""
    if len(labels) != n:
        raise ValueError(f"need one batch per case, got {len(labels)} for {n} cases")
    if any(c is None for c in labels):
        raise ValueError("every case needs its batch (None given)")
    _, idx = np.unique(np.asarray([str(c) for c in labels]), return_inverse=True)
    if idx.max() < 1:
        raise ValueError("the AUC needs at least two batches (it compares cases of different batches)")
    return idx


def structural_components(hit: Sequence[float] | np.ndarray, miss: Sequence[float] | np.ndarray,
                          clusters: np.ndarray | None = None) -> tuple[float, np.ndarray, np.ndarray]:
    """``(auc, V10, V01)`` over pairs of cases in different clusters (each case its own cluster by
    default; with ``--concurrent-cases`` the batch, as :func:`cluster_index` numbers them): ``V10_i`` is the mean of ``psi(miss_i, hit_j)``
    over the cases j outside i's cluster, ``V01_i`` the mean of ``psi(miss_j, hit_i)``. The AUC is the
    mean over all those pairs. O(n log n + sum of squared cluster sizes)."""
    h, m = _pairs(hit, miss)
    n = len(h)
    c = np.arange(n) if clusters is None else clusters
    hs, ms = np.sort(h), np.sort(m)
    h_lo, h_hi = np.searchsorted(hs, m, "left"), np.searchsorted(hs, m, "right")
    m_lo, m_hi = np.searchsorted(ms, h, "left"), np.searchsorted(ms, h, "right")
    if clusters is None:  # the own case's pair only
        in10 = in01 = _psi(m, h)
    else:  # the same comparisons within the case's own cluster
        in10, in01 = np.empty(n), np.empty(n)
        for k in np.unique(c):
            i = np.flatnonzero(c == k)
            within = _psi(m[i][:, None], h[i][None, :])
            in10[i], in01[i] = within.sum(axis=1), within.sum(axis=0)
    size = np.bincount(c)[c]
    others = n - size
    v10 = (h_lo + 0.5 * (h_hi - h_lo) - in10) / others  # hits of other clusters below miss_i
    v01 = (n - m_hi + 0.5 * (m_hi - m_lo) - in01) / others  # misses of other clusters above hit_i
    return float(np.sum(v10 * others) / np.sum(others)), v10, v01


def clustered_variance(auc: float, v10: np.ndarray, v01: np.ndarray,
                       clusters: np.ndarray | None = None) -> tuple[float, float]:
    """``(clustered, naive)`` variance of the AUC: Obuchowski's, summing each cluster's structural
    components (a case with its hit and miss by default, a batch of cases with ``clusters``),
    ``K / (K - 1) * sum_c S_c^2 / n^2`` over K clusters; and the two-sample DeLong that treats hits
    and misses as independent samples."""
    n = len(v10)
    a, b = v10 - auc, v01 - auc
    c = np.arange(n) if clusters is None else clusters
    k = int(c.max()) + 1
    s = np.bincount(c, weights=a + b, minlength=k)
    return float(k / (k - 1) * np.sum(s ** 2) / (n * n)), float((a @ a + b @ b) / (n * (n - 1)))


def first_order_variance(theta: np.ndarray | float, n: int) -> np.ndarray:
    """The first-order (per-observation) part of Hanley and McNeil's variance of an AUC of n
    misses and n hits at true AUC ``theta`` (exponential model):
    ``theta (1 - theta) (n - 1) [(1 - theta) / (2 - theta) + theta / (1 + theta)] / n^2``."""
    t = np.clip(np.asarray(theta, dtype=float), 0.0, 1.0)
    return t * (1 - t) * (n - 1) * ((1 - t) / (2 - t) + t / (1 + t)) / (n * n)


def second_order_variance(theta: np.ndarray | float, n: int) -> np.ndarray:
    """The second-order (per-comparison) term ``theta (1 - theta) / (n (n - 1))``: the
    variance of one comparison spread over the n (n - 1) cross-case pairs, which pairing does
    not cancel (Hoeffding's ``2 zeta_2 / (n (n - 1))`` with uncorrelated comparisons)."""
    t = np.clip(np.asarray(theta, dtype=float), 0.0, 1.0)
    return t * (1 - t) / (n * (n - 1))


def variance_scale(auc: float, var: float, n: int) -> float:
    """``k`` with ``k * first_order_variance(auc) = var``: the clustered variance at the
    estimate over the first-order Hanley-McNeil variance, which carries it across ``theta``.
    At an estimate of 0 or 1 (both vanish) ``k`` is 1: Hanley and McNeil's own variance."""
    v1 = float(first_order_variance(auc, n)) if 0 < auc < 1 else 0.0
    return var / v1 if v1 > 0 else 1.0


def auc_variance(theta: np.ndarray | float, k: np.ndarray | float, n: int) -> np.ndarray:
    """The variance the interval inverts at ``theta``: ``k * first_order + second_order``."""
    return np.asarray(k, dtype=float) * first_order_variance(theta, n) + second_order_variance(theta, n)


def score_bounds(auc: np.ndarray | float, k: np.ndarray | float, n: int,
                 q: float) -> tuple[np.ndarray, np.ndarray]:
    """The interval's ends: the ``theta`` below and above ``auc`` where
    ``(auc - theta)^2 = q^2 max(auc_variance(theta), auc_variance(auc))``, by bisection
    (vectorised over ``auc`` and ``k``)."""
    est = np.clip(np.asarray(auc, dtype=float), 0.0, 1.0)
    kk = np.broadcast_to(np.asarray(k, dtype=float), est.shape)
    at_est = auc_variance(est, kk, n)

    def inside(theta: np.ndarray) -> np.ndarray:  # theta is in the interval
        return (est - theta) ** 2 <= q * q * np.maximum(auc_variance(theta, kk, n), at_est)

    lo, hi = _bisect(est, inside)
    return np.minimum(lo, separated_lower(n, q)), np.maximum(hi, 1 - separated_lower(n, q))


def _bisect(est: np.ndarray, inside) -> tuple[np.ndarray, np.ndarray]:
    ends = []
    for edge in (np.zeros_like(est), np.ones_like(est)):
        near, far = est.copy(), edge  # the estimate is inside; `far` is outside or the edge
        for _ in range(_BISECT_STEPS):
            mid = (near + far) / 2
            ok = inside(mid)
            near, far = np.where(ok, mid, near), np.where(ok, far, mid)
        ends.append(np.where(inside(edge), edge, near))
    return ends[0], ends[1]


@lru_cache(maxsize=1024)
def separated_lower(n: int, q: float) -> float:
    """The lower end at an AUC estimate of 1 (complete separation) with n cases: no sample
    of n cases shows more, so no lower end exceeds it (nor does an upper end fall below
    1 minus it); without the cap one slow hit could raise the lower end over this."""
    one = np.ones(1)
    lo, _ = _bisect(one, lambda theta: (1 - theta) ** 2 <= q * q * auc_variance(theta, 1.0, n))
    return float(lo[0])


def t_quantile(n: int, confidence: float) -> float:
    """Student's t quantile with n - 1 degrees of freedom at (1 + confidence) / 2."""
    from scipy.stats import t

    return float(t.ppf((1 + confidence) / 2, max(n - 1, 1)))


def auc_interval(hit: Sequence[float] | np.ndarray, miss: Sequence[float] | np.ndarray,
                 confidence: float = DEFAULT_CONFIDENCE,
                 clusters: Sequence[object] | None = None) -> tuple[float, float, float, float, float]:
    """``(auc, lower, upper, clustered se, deff)``: the module's interval. With ``clusters`` (each
    case's batch) the AUC compares cases of different batches, the variance clusters by batch and
    the interval's shape, t quantile and separation cap take the K batches as its K units."""
    return _interval(hit, miss, confidence, None if clusters is None else cluster_index(clusters, len(hit)))


def _unit_count(n: int, idx: np.ndarray | None) -> int:
    """The interval's independent units: the batches ``idx`` numbers 0..K-1, else the n cases."""
    return n if idx is None else int(idx.max()) + 1


def _interval(hit: Sequence[float] | np.ndarray, miss: Sequence[float] | np.ndarray, confidence: float,
              idx: np.ndarray | None) -> tuple[float, float, float, float, float]:
    check_confidence(confidence)
    auc, v10, v01 = structural_components(hit, miss, idx)
    var, naive = clustered_variance(auc, v10, v01, idx)
    deff = var / naive if naive > 0 else 1.0
    units = _unit_count(len(v10), idx)
    lo, hi = score_bounds(auc, variance_scale(auc, var, units), units, t_quantile(units, confidence))
    return auc, float(lo), float(hi), float(np.sqrt(var)), float(deff)


# --------------------------------------------------------------------------- requests


def majority_error(auc: float, m: int) -> float:
    """P(a majority of m independent comparisons, each right with probability ``auc``, is
    wrong); m odd."""
    from scipy.stats import binom

    return float(binom.cdf((m - 1) // 2, m, auc))


def requests_to_distinguish(auc: float, error: float = DEFAULT_ERROR) -> int | None:
    """Fewest hit/miss request pairs (odd, majority vote, each pair right with probability
    ``auc``) that tell hit from miss with error at most ``error``. None when ``auc <= 0.5``
    (a vote cannot beat chance) or above :data:`MAX_REQUESTS`."""
    if not 0 <= auc <= 1:
        raise ValueError(f"auc must lie in [0, 1], got {auc!r}")
    if not 0 < error < 0.5:
        raise ValueError(f"error must lie in (0, 0.5), got {error!r}")
    if auc <= 0.5:
        return None
    # for odd m the majority's error falls with m (auc > 0.5): double k (m = 2k + 1), then bisect
    if majority_error(auc, 1) <= error:
        return 1
    lo, hi = 0, 1
    while majority_error(auc, 2 * hi + 1) > error:
        lo, hi = hi, hi * 2
        if 2 * lo + 1 > MAX_REQUESTS:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if majority_error(auc, 2 * mid + 1) <= error else (mid, hi)
    m = 2 * hi + 1
    return m if m <= MAX_REQUESTS else None


# --------------------------------------------------------------------------- the summary


def _wilson(k: float, n: int, confidence: float) -> tuple[float, float]:
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    return float(max(0.0, lo)), float(min(1.0, hi))


def timing_auc(hit: Sequence[float] | np.ndarray, miss: Sequence[float] | np.ndarray,
               confidence: float = DEFAULT_CONFIDENCE, *, error: float = DEFAULT_ERROR,
               batches: Sequence[object] | None = None, unjudged: str | None = None) -> TimingAUC:
    """The timing side channel of paired (hit_i, miss_i) TTFTs, one pair per case (see the
    module docstring for the estimand, the interval and the paired accuracy). ``batches`` names
    each case's batch where the probes ran several cases at a time: the interval then clusters by
    batch ("Cases run together" in the module docstring). ``unjudged`` says why the gate must not
    judge it (the decision then cannot judge)."""
    h, m = _pairs(hit, miss)
    n = len(h)
    idx = None if batches is None else cluster_index(batches, n)
    auc, lo, hi, se, deff = _interval(h, m, confidence, idx)
    k = float(_psi(m, h).sum())
    units = _unit_count(n, idx)
    p_lo, p_hi = _wilson(k * units / n, units, confidence)  # a batch's share in [0, 1]: Bernoulli bounds its variance
    mh, mm = float(np.median(h)), float(np.median(m))
    return TimingAUC(n=n, auc=auc, lower=lo, upper=hi, confidence=float(confidence), se=se,
                     deff=deff, paired_accuracy=k / n, paired_lower=p_lo, paired_upper=p_hi,
                     median_hit=mh, median_miss=mm, median_ratio=mm / mh if mh > 0 else None,
                     error=error, requests_needed=requests_to_distinguish(max(auc, 1 - auc), error),
                     requests_needed_best_case=requests_to_distinguish(max(hi, 1 - lo), error),
                     batches=None if batches is None else units, unjudged=unjudged)


def timing_decision(t: TimingAUC, max_auc: float) -> str:
    """``"pass"`` when the interval lies within [1 - max_auc, max_auc] (the channel is shown
    weak either way round), ``"fail"`` when it lies wholly above ``max_auc`` or below
    ``1 - max_auc``, else ``"cannot_judge"``; fewer than :data:`MIN_CASES` cases (batches, where
    cases ran together) cannot judge, nor can an interval marked ``unjudged``.
    ``max_auc`` must lie in [0.5, 1): at 1 every run would pass."""
    if isinstance(max_auc, bool) or not 0.5 <= float(max_auc) < 1:
        raise ValueError(f"max_auc must lie in [0.5, 1), got {max_auc!r}")
    if t.units < MIN_CASES or t.unjudged:
        return CANNOT_JUDGE
    if t.upper <= max_auc and t.lower >= 1 - max_auc:
        return PASS
    if t.lower > max_auc or t.upper < 1 - max_auc:
        return FAIL
    return CANNOT_JUDGE


# --------------------------------------------------------------------------- isolation


@dataclass(frozen=True)
class IsolationResult:
    """``verdict`` is ``"pass"``, ``"fail"`` or ``"cannot_judge"``; ``leaked`` names the cases
    where another tenant's request was served from the cache, ``not_reused`` those where the
    same tenant's repeat was not (they prove nothing about isolation)."""

    verdict: str
    n: int
    leaked: tuple[str, ...]
    not_reused: tuple[str, ...]
    reason: str


def _counts(values: Sequence[int], what: str) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1 or (a.size and (not np.issubdtype(a.dtype, np.integer) and
                                   not np.all(np.equal(np.mod(a, 1), 0)))):
        raise ValueError(f"{what} must be whole token counts, one per case")
    if np.any(a < 0):
        raise ValueError(f"{what} must not be negative")
    return a.astype(np.int64)


def isolation_decision(same_tenant_hits: Sequence[int], other_tenant_hits: Sequence[int], *,
                       case_ids: Sequence[str] | None = None) -> IsolationResult:
    """Tenant isolation from cached-prompt token counts, one pair per case.

    Fails when any other tenant's identical request had cached tokens (naming the cases);
    passes only when every case's same-tenant repeat had cached tokens and no other-tenant
    request did; otherwise cannot judge (no cases, or a case where the cache did not reuse
    even for the same tenant: a cache that is off shows no leak and proves nothing).
    """
    same, other = _counts(same_tenant_hits, "same_tenant_hits"), _counts(other_tenant_hits, "other_tenant_hits")
    if same.shape != other.shape:
        raise ValueError(f"{len(same)} same-tenant counts for {len(other)} other-tenant counts")
    n = len(same)
    ids = [str(c) for c in case_ids] if case_ids is not None else [str(i) for i in range(n)]
    if len(ids) != n:
        raise ValueError(f"{len(ids)} case ids for {n} cases")
    leaked = tuple(ids[i] for i in np.flatnonzero(other > 0))
    not_reused = tuple(ids[i] for i in np.flatnonzero(same == 0))
    if leaked:
        return IsolationResult(FAIL, n, leaked, not_reused,
                               f"another tenant's request was served from the cache in {len(leaked)} "
                               f"of {n} case(s): {', '.join(leaked[:20])}{' ...' if len(leaked) > 20 else ''}")
    if n == 0:
        return IsolationResult(CANNOT_JUDGE, 0, (), (), "no cases")
    if len(not_reused) == n:
        return IsolationResult(CANNOT_JUDGE, n, (), not_reused,
                               "the cache never reused a prompt even for the same tenant (caching off?): "
                               "no leak seen, but that proves nothing")
    if not_reused:
        return IsolationResult(CANNOT_JUDGE, n, (), not_reused,
                               f"the same tenant's repeat was not served from the cache in {len(not_reused)} "
                               f"of {n} case(s) ({', '.join(not_reused[:20])}"
                               f"{' ...' if len(not_reused) > 20 else ''}): those cases prove nothing")
    return IsolationResult(PASS, n, (), (), f"all {n} case(s): the same tenant reused, no other tenant did")
