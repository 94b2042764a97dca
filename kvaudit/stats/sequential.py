"""A gate that stops as soon as it is decided: a group-sequential design over the paired bound.

The run is looked at after every ``look_every`` cases, up to ``max_cases``. At look ``k`` (``n_k``
cases, information fraction ``t_k = n_k / max_cases``) the non-inferiority bound of
:mod:`kvaudit.stats.noninferiority` (score interval, document design effect, Student-t quantile)
is computed at a *nominal* one-sided level ``alpha_k`` instead of the fixed design's ``alpha``:

* **pass** when the lower bound at ``alpha_k`` clears the margin;
* **fail** when the upper bound at ``alpha_k`` is below the margin (the loss is decided), and at
  the last look whenever it has not passed;
* otherwise **continue**.

The ``alpha_k`` come from Lan-DeMets alpha spending with the O'Brien-Fleming-type function
``alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))`` (Lan and DeMets 1983): the chance of passing at
or before look ``k`` when the true difference sits exactly at the margin is ``alpha(t_k)``, so over
the whole run it is ``alpha``, the fixed design's false-pass rate. The boundaries are computed for
the canonical joint distribution of the standardised statistics (independent increments, Brownian
in information), by numerical integration of the continuation density on a grid (Jennison and
Turnbull, *Group Sequential Methods*, ch. 19). Early looks spend almost nothing (the first look of
ten at ``alpha = 0.025`` passes only beyond z = 6.1), so a run that is clearly fine or clearly
broken stops early and a close call costs about what the fixed design does.

The fail rule is non-binding: stopping to fail can only remove passes, never add one, so the
false-pass rate holds whatever it does. It spends its own ``alpha`` Pocock-wise (nearly the same
nominal level at every look, about z = 2.6 for ten looks at 0.025), so a clear loss fails at an
early look, while a reuse exactly at the margin is failed before the end in at most ``alpha`` of
runs (one that is truly fine far less).

A run can also **fail for futility** (non-binding, so again the false-pass rate is untouched): at
a look that neither passes nor decides the loss, the *conditional power under no difference* is
the chance that the run would still pass at its last look if the remaining cases changed nothing
on average (true delta 0, the hope a non-inferiority design is sized for), with their spread as
the cases so far show it (plus one discordant case, so a quiet start is not read as certainty).
Below ``futility`` (default 0.2) the run stops and fails: it was not going to show
non-inferiority within its maximum. This is stochastic curtailment (Lan, Simon and Halperin 1982)
on the same score bound the pass rule uses; it costs under a point of power at a true delta of 0
and stops a reuse at the margin at about half the maximum instead of all of it
(``benchmarks/sequential_spending.py``).

Information here is counted in cases; with documents shared unevenly the true information
fraction differs a little. What that does to the false-pass rate is measured, not assumed:
``benchmarks/gate_calibration.py`` (the fixed gate's grid) and ``benchmarks/sequential_calibration.py``
(maxima sized for sequential runs); fast slices of both run in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from kvaudit.stats.noninferiority import (
    DEFAULT_MIN_ICC,
    MIN_CLUSTERS,
    MIN_EFFECTIVE_N,
    _score_lower,
    design_effect,
)

SPENDING = "lan-demets-obrien-fleming"
CLEAR_LOSS = 0.08  # a clear loss: this far below the margin (on [-1, 1]), where E[n] is reported
DESIGN_KIND = "group-sequential"


def obf_spent(t: float, alpha: float) -> float:
    """Alpha spent by information fraction ``t`` (O'Brien-Fleming-type Lan-DeMets)."""
    from scipy.stats import norm

    if t <= 0:
        return 0.0
    return float(min(alpha, 2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / np.sqrt(min(t, 1.0)))))


def pocock_spent(t: float, alpha: float) -> float:
    """Alpha spent by information fraction ``t`` (Pocock-type Lan-DeMets: nearly equal nominal
    levels at every look)."""
    if t <= 0:
        return 0.0
    return float(alpha * np.log(1 + (np.e - 1) * min(t, 1.0)))


SPENDERS = {"obrien-fleming": obf_spent, "pocock": pocock_spent}


@lru_cache(maxsize=256)
def _boundaries(fractions: tuple[float, ...], alpha: float, spending: str = "obrien-fleming",
                grid: int = 1201) -> tuple[float, ...]:
    """Upper z boundaries ``c_k`` with P0(first crossing at look k) = alpha(t_k) - alpha(t_{k-1})."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    spent = SPENDERS[spending]
    out: list[float] = []
    spent_before = 0.0
    # continuation density of the score S = Z sqrt(t) on a grid (None before the first look)
    s_grid: np.ndarray | None = None
    dens: np.ndarray | None = None
    t_prev = 0.0
    for t in fractions:
        target = spent(t, alpha) - spent_before
        dt = t - t_prev
        if dens is None:
            c = float(norm.isf(target)) if target > 0 else np.inf
        else:
            assert s_grid is not None  # set with dens after the first look
            sd = np.sqrt(dt)
            w = _weights(s_grid)

            def cross(c: float, s_grid=s_grid, dens=dens, sd=sd, w=w, t=t, target=target) -> float:
                return float(np.sum(w * dens * norm.sf((c * np.sqrt(t) - s_grid) / sd))) - target

            c = float(brentq(cross, -10.0, 40.0, xtol=1e-10)) if target > 1e-15 else np.inf
        out.append(c)
        spent_before += max(target, 0.0)
        # the continuation density after this look: S_k below c_k sqrt(t_k)
        top = c * np.sqrt(t) if np.isfinite(c) else 10.0 * np.sqrt(t) + 10.0
        new_grid = np.linspace(-10.0 * np.sqrt(t) - 2.0, top, grid)
        if dens is None:
            new_dens = norm.pdf(new_grid / np.sqrt(t)) / np.sqrt(t)
        else:
            assert s_grid is not None
            sd = np.sqrt(dt)
            kern = norm.pdf((new_grid[:, None] - s_grid[None, :]) / sd) / sd
            new_dens = kern @ (_weights(s_grid) * dens)
        s_grid, dens, t_prev = new_grid, new_dens, t
    return tuple(out)


def boundaries(fractions: Sequence[float], alpha: float, spending: str = "obrien-fleming") -> tuple[float, ...]:
    """Upper z boundaries at the information ``fractions`` for one-sided ``alpha`` spent by
    ``spending`` (a key of :data:`SPENDERS`): what :func:`design` uses, for comparing designs."""
    return _boundaries(tuple(float(f) for f in fractions), float(alpha), spending)


def _weights(x: np.ndarray) -> np.ndarray:
    """Trapezoid weights of a uniform grid."""
    h = x[1] - x[0]
    w = np.full(len(x), h)
    w[0] = w[-1] = h / 2
    return w


@dataclass(frozen=True)
class SequentialDesign:
    """Looks at ``looks`` cases (the last is ``max_cases``), one-sided ``alpha`` spent by
    :func:`obf_spent`; ``z`` the boundaries and ``nominal_alpha`` the one-sided level of the bound
    used at each look."""

    max_cases: int
    look_every: int
    alpha: float
    looks: tuple[int, ...]
    z: tuple[float, ...]
    nominal_alpha: tuple[float, ...]
    fail_nominal_alpha: tuple[float, ...] = ()  # the fail rule's one-sided level per look
    spending: str = SPENDING
    fail_spending: str = "lan-demets-pocock (non-binding)"
    futility: float = 0.0  # fail when the conditional power under no difference is below this
    kind: str = DESIGN_KIND

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("looks", "z", "nominal_alpha", "fail_nominal_alpha"):
            d[k] = list(d[k])
        return d

    def look_of(self, n: int) -> int | None:
        """The index of the look at ``n`` cases, or None when ``n`` is not a planned look."""
        try:
            return self.looks.index(n)
        except ValueError:
            return None


def design_from_dict(d: dict[str, Any]) -> SequentialDesign:
    """The design a run recorded (its manifest's ``sequential`` entry), rebuilt and checked: the
    boundaries are recomputed from ``max_cases``, ``look_every`` and ``alpha``, so a manifest edited
    to loosen them is caught."""
    try:
        # a design recorded before the futility rule existed keeps running without it
        plan = design(int(d["max_cases"]), int(d["look_every"]), float(d["alpha"]),
                      futility=float(d.get("futility", 0.0)))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"the sequential design is malformed ({e})") from None
    if list(plan.looks) != list(d.get("looks", plan.looks)):
        raise ValueError("the sequential design's looks do not follow from its max_cases and look_every")
    return plan


FUTILITY = 0.2


def default_look_every(max_cases: int) -> int:
    """Ten looks: what ``kvaudit run --until-decided`` uses without ``--look-every``, and what
    ``kvaudit plan`` and the calibration benchmarks characterise."""
    return max(1, max_cases // 10)


def design(max_cases: int, look_every: int, alpha: float, *, futility: float = FUTILITY) -> SequentialDesign:
    """Looks every ``look_every`` cases (and at ``max_cases``), alpha spent O'Brien-Fleming-wise;
    a run fails for futility when its conditional power under no difference drops below
    ``futility`` (0 turns the rule off)."""
    from scipy.stats import norm

    if max_cases < 1 or look_every < 1:
        raise ValueError("max_cases and look_every must be positive")
    if not 0 <= futility < 1:
        raise ValueError(f"futility must be a conditional power in [0, 1), got {futility!r}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be a one-sided level in (0, 0.5), got {alpha!r}")
    looks = tuple(sorted({*range(look_every, max_cases, look_every), max_cases}))
    if len(looks) > 50:
        raise ValueError(f"{len(looks)} looks: at most 50 (raise --look-every)")
    fractions = tuple(n / max_cases for n in looks)
    z = _boundaries(fractions, float(alpha))
    nominal = tuple(float(norm.sf(c)) if np.isfinite(c) else 0.0 for c in z)
    fail = tuple(float(norm.sf(c)) if np.isfinite(c) else 0.0 for c in _boundaries(fractions, float(alpha), "pocock"))
    return SequentialDesign(max_cases, look_every, float(alpha), looks, tuple(float(c) for c in z), nominal, fail,
                            futility=float(futility))


def conditional_power(d: np.ndarray, deff: float, margin: float, plan: SequentialDesign) -> float:
    """The chance that a run with differences ``d`` so far passes at ``plan``'s last look if its
    remaining cases average no difference, with the spread (times ``deff``) the cases so far show
    plus one discordant case. The last look's pass rule, the score bound at
    ``plan.nominal_alpha[-1]``, is read at the final mean with the current restricted variance."""
    from scipy.stats import norm

    from kvaudit.stats.noninferiority import _restricted_variance

    n, big_n = len(d), plan.max_cases
    rest = big_n - n
    if rest <= 0:
        return 0.0
    total = float(d.sum())
    if total / n > margin:
        values, counts = np.unique(d, return_counts=True)
        var0 = _restricted_variance(values, counts.astype(float), margin)
    else:  # the mean is already at or below the margin: the spread about it
        var0 = float(np.mean((d - margin) ** 2))
    q = float(norm.isf(plan.nominal_alpha[-1]))
    need = margin + q * np.sqrt(deff * var0 / big_n)  # the final mean that just passes
    spread = np.sqrt(deff * rest * (float(d @ d) + 1.0) / (n + 1)) / big_n
    return float(norm.cdf((total / big_n - need) / spread))


@dataclass(frozen=True)
class LookResult:
    """One look: ``decision`` pass, fail or continue (with ``reason`` when undecidable)."""

    n: int
    look: int
    decision: str
    lower: float | None
    upper: float | None
    nominal_alpha: float
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def evaluate_look(diffs: Sequence[float] | np.ndarray, memberships: Sequence[Sequence[str]], margin: float,
                  plan: SequentialDesign, look: int, *, min_clusters: int = MIN_CLUSTERS,
                  min_effective_n: float = MIN_EFFECTIVE_N, min_icc: float = DEFAULT_MIN_ICC) -> LookResult:
    """The decision at look ``look`` on the first ``plan.looks[look]`` cases' differences."""
    n = plan.looks[look]
    if len(diffs) < n:
        raise ValueError(f"look {look} needs {n} cases, got {len(diffs)}")
    return decide_at_look(diffs[:n], memberships[:n], margin, plan, look, min_clusters=min_clusters,
                          min_effective_n=min_effective_n, min_icc=min_icc)


def decide_at_look(diffs: npt.ArrayLike, memberships: Sequence[Sequence[str]], margin: float,
                   plan: SequentialDesign, look: int, *, min_clusters: int = MIN_CLUSTERS,
                   min_effective_n: float = MIN_EFFECTIVE_N, min_icc: float = DEFAULT_MIN_ICC) -> LookResult:
    """The decision at look ``look`` on these cases (all of a group's cases seen by that look: a
    task family's threshold is judged at the run's look with its own cases)."""
    from scipy.stats import t as student_t

    d = np.clip(np.asarray(diffs, dtype=float), -1.0, 1.0)
    members = list(memberships)
    n = len(d)
    last = look == len(plan.looks) - 1
    a = plan.nominal_alpha[look]
    if n == 0:
        return LookResult(0, look, "fail" if last else "continue", None, None, a, "no cases")
    deff, g = design_effect(d, members, min_icc=min_icc)
    if g < min_clusters or n / deff < min_effective_n:
        why = (f"{n} cases on {g} documents" if g < min_clusters
               else f"effective sample size {n / deff:.1f}")
        return LookResult(n, look, "fail" if last else "continue", None, None, a,
                          f"not decidable yet ({why})" + ("; the last look fails" if last else ""))
    if a <= 0:
        return LookResult(n, look, "fail" if last else "continue", None, None, a, "no alpha spent at this look")
    df = max(g - 1, 1)
    lower = _score_lower(d, float(student_t.isf(a, df)), deff)
    fa = plan.fail_nominal_alpha[look] if plan.fail_nominal_alpha else a
    upper = -_score_lower(-d, float(student_t.isf(fa, df)), deff) if fa > 0 else 1.0
    if lower > margin:
        return LookResult(n, look, "pass", lower, upper, a)
    if upper < margin or last:
        return LookResult(n, look, "fail", lower, upper, a)
    if plan.futility > 0:
        cp = conditional_power(d, deff, margin, plan)
        if cp < plan.futility:
            return LookResult(n, look, "fail", lower, upper, a,
                              f"futile: with no difference in the remaining {plan.max_cases - n} cases it would pass "
                              f"at its last look with probability {cp:.2f}, under the design's {plan.futility:g}",
                              {"conditional_power": cp})
    return LookResult(n, look, "continue", lower, upper, a)


def run_sequential(diffs: npt.ArrayLike, memberships: Sequence[Sequence[str]], margin: float,
                   plan: SequentialDesign, **kw: Any) -> LookResult:
    """Look at each planned point in turn; the first pass or fail, else the last look's decision."""
    diffs = np.asarray(diffs, dtype=float)
    res = None
    for k in range(len(plan.looks)):
        if plan.looks[k] > len(diffs):
            break
        res = evaluate_look(diffs, memberships, margin, plan, k, **kw)
        if res.decision != "continue":
            return res
    if res is None:
        raise ValueError(f"fewer cases ({len(diffs)}) than the first look ({plan.looks[0]})")
    return res


@dataclass(frozen=True)
class SequentialRates:
    """``reps`` simulated sequential runs at one true delta: how often they passed, how many cases
    they used on average, and how often the fixed design on the maximum passed the same runs."""

    delta: float
    passed: float
    mean_cases: float
    fixed_passed: float
    reps: int


def simulate(design_: Any, margin: float, plan: SequentialDesign, delta: float, *, reps: int = 300,
             seed: int = 0, min_icc: float = DEFAULT_MIN_ICC) -> SequentialRates:
    """Simulated runs of ``design_`` (a :class:`kvaudit.stats.calibration.Design` with
    ``n = plan.max_cases``) at a true ``delta``, in shuffled order, judged by the sequential design
    and, for comparison, by the fixed bound on all ``max_cases``."""
    from kvaudit.stats.calibration import simulate_diffs
    from kvaudit.stats.noninferiority import paired_bound

    if design_.n != plan.max_cases:
        raise ValueError(f"the design has {design_.n} cases, the sequential plan {plan.max_cases}")
    rng = np.random.default_rng(seed)
    passes = fixed = 0
    used = []
    for _ in range(reps):
        d, members = simulate_diffs(design_, delta, rng)
        res = run_sequential(d, members, margin, plan, min_icc=min_icc)
        passes += res.decision == "pass"
        used.append(res.n)
        b = paired_bound(d, members, confidence=1 - 2 * plan.alpha, min_icc=min_icc)
        fixed += bool(b.decidable and b.lower is not None and b.lower > margin)
    return SequentialRates(delta, passes / reps, float(np.mean(used)), fixed / reps, reps)


def operating_characteristic(design_: Any, margin: float, plan: SequentialDesign, *, reps: int = 300,
                             seed: int = 0, min_icc: float = DEFAULT_MIN_ICC) -> dict[str, SequentialRates | None]:
    """:func:`simulate` at a true delta exactly at the margin (false pass), at 0 (power) and under
    a clear loss (``margin - CLEAR_LOSS``), keyed ``margin``, ``zero`` and ``loss``; ``None`` where
    the design cannot reach that delta (:meth:`kvaudit.stats.calibration.Design.loss_rate`)."""
    out: dict[str, SequentialRates | None] = {}
    for i, (label, delta) in enumerate((("margin", margin), ("zero", 0.0), ("loss", margin - CLEAR_LOSS))):
        try:
            design_.loss_rate(delta)
        except ValueError:
            out[label] = None
            continue
        out[label] = simulate(design_, margin, plan, delta, reps=reps, seed=seed + i, min_icc=min_icc)
    return out
