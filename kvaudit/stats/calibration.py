"""Operating characteristic of the paired bound by simulation: false-pass rate at the margin,
coverage, power, and the cases a design needs.

A :class:`Design` describes a run the way a user can state it before running: cases, cases per
document (cluster size), the share of cases resting on two documents, the score type (0/1 or
F1-like), recompute's base accuracy, and how often the arm under test changes an answer. Each
simulated run draws documents with a random fragility (multiplier ``1 - h`` or ``1 + h``, mean
exactly 1; with ``fragile_share`` s below one half, a share s of documents carries the multiplier
``1 + h (1 - s) / s`` and concentrates the losses on few documents: strong clustering), so a case's chance of losing (or gaining) its answer depends on its documents: the
clustering the bound must survive. The true mean difference is known in closed form, so a run
can be placed exactly at the margin.

Used by ``benchmarks/gate_calibration.py`` (the grid in docs/reports.md), by ``kvaudit plan`` and
by the tests' fast slice. ``statistic`` (in :func:`rates` and :func:`characterise`) swaps in
another bound for reference (the benchmark's old percentile bootstrap), and
:func:`pilot_design` turns a pilot run's paired scores into a :class:`Design`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvaudit.stats.noninferiority import DEFAULT_CONFIDENCE, paired_bound

# A bound under test: (diffs, memberships, confidence) -> (gate lower bound, two-sided interval
# low, high), or None when it cannot decide. The gate passes when the first is >= the margin.
Statistic = Callable[[np.ndarray, Sequence[Sequence[str]], float], "tuple[float, float, float] | None"]

SCORES = ("binary", "f1")
_F1_PARTIAL = 0.15  # share of recompute answers with a partial F1 score (uniform in [0.2, 0.9])


@dataclass(frozen=True)
class Design:
    n: int = 200
    cluster_size: float = 1.0  # mean cases per document
    multi_doc_share: float = 0.0  # share of cases on two documents
    score: str = "binary"  # "binary" (0/1) or "f1" (scores in [0, 1] with partial credit)
    base_accuracy: float = 0.8  # recompute's mean score
    gain_rate: float = 0.05  # chance the arm improves a case (scaled by its documents' fragility)
    heterogeneity: float = 0.8  # documents' fragility multiplier is 1 - h or 1 + h
    fragile_share: float = 0.5  # share of fragile documents (multiplier 1 + h (1 - s) / s)

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {', '.join(SCORES)}, got {self.score!r}")
        if self.n < 1 or self.cluster_size < 1:
            raise ValueError("a design needs at least one case and a cluster size of at least 1")
        if not 0 <= self.multi_doc_share <= 1 or not 0 < self.base_accuracy < 1:
            raise ValueError("multi_doc_share must be in [0, 1] and base_accuracy in (0, 1)")
        if not 0 <= self.heterogeneity < 1 or not 0 <= self.gain_rate <= 1:
            raise ValueError("heterogeneity must be in [0, 1) and gain_rate in [0, 1]")
        if not 0 < self.fragile_share <= 1:
            raise ValueError("fragile_share must be in (0, 1]")
        if self.gain_rate * self.max_multiplier > 1:
            raise ValueError(f"gain_rate {self.gain_rate:g} times the largest document multiplier "
                             f"{self.max_multiplier:.2f} exceeds 1")

    @property
    def max_multiplier(self) -> float:
        """A fragile document's multiplier of the loss and gain rates."""
        s = self.fragile_share
        return 1 + self.heterogeneity * (1 - s) / s

    @property
    def n_documents(self) -> int:
        docs_per_case = 1 + self.multi_doc_share
        return max(2, round(self.n * docs_per_case / self.cluster_size))

    def loss_rate(self, delta: float) -> float:
        """The loss rate that puts the true mean difference at ``delta`` (on [-1, 1])."""
        r = self.base_accuracy  # recompute's mean score (see _draw_reference)
        # E[d] = -loss * E[loss size] + gain * E[gain size]; sizes are r and 1 - r for binary,
        # half of them for F1-like scores (the damaged score is uniform below the original).
        scale = 1.0 if self.score == "binary" else 0.5
        loss = (self.gain_rate * (1 - r) * scale - delta) / (r * scale)
        if not 0 <= loss * self.max_multiplier <= 1:
            raise ValueError(f"a true delta of {delta:+.3f} is out of reach for this design "
                             f"(loss rate {loss:.3f}); change gain_rate or base_accuracy")
        return loss


def _memberships(design: Design, rng: np.random.Generator) -> list[list[str]]:
    g = design.n_documents
    first = rng.permutation(np.arange(design.n) % g)
    multi = rng.random(design.n) < design.multi_doc_share
    out = []
    for i in range(design.n):
        docs = [int(first[i])]
        if multi[i] and g > 1:
            other = int(rng.integers(g - 1))
            docs.append(other + (other >= docs[0]))
        out.append([f"d{j}" for j in docs])
    return out


def _draw_reference(design: Design, rng: np.random.Generator) -> np.ndarray:
    n = design.n
    if design.score == "binary":
        return (rng.random(n) < design.base_accuracy).astype(float)
    # partial credit with mean 0.55 on a share of cases; 0/1 elsewhere with the rest of the mass
    partial = rng.random(n) < _F1_PARTIAL
    p_right = (design.base_accuracy - _F1_PARTIAL * 0.55) / (1 - _F1_PARTIAL)
    return np.where(partial, rng.uniform(0.2, 0.9, n), (rng.random(n) < p_right).astype(float))


def simulate_diffs(design: Design, delta: float, rng: np.random.Generator) -> tuple[np.ndarray, list[list[str]]]:
    """One simulated run: per-case differences (arm - recompute) and documents, true mean ``delta``."""
    loss = design.loss_rate(delta)
    members = _memberships(design, rng)
    frag = np.where(rng.random(design.n_documents) < 1 - design.fragile_share, 1 - design.heterogeneity,
                    design.max_multiplier)
    mult = np.array([frag[[int(d[1:]) for d in m]].mean() for m in members])
    ref = _draw_reference(design, rng)
    lose = rng.random(design.n) < loss * mult
    gain = rng.random(design.n) < design.gain_rate * mult
    if design.score == "binary":
        arm = np.where(lose & (ref == 1), 0.0, np.where(gain & (ref == 0), 1.0, ref))
    else:
        u = rng.random(design.n)
        arm = np.where(lose, ref * u, np.where(gain, ref + (1 - ref) * u, ref))
    return arm - ref, members


@dataclass(frozen=True)
class Rates:
    """What ``reps`` simulated runs at one true delta did."""

    reps: int
    passed: float  # share of runs whose lower bound clears the margin
    covered: float | None  # share of decided runs whose two-sided interval holds the true delta
    undecidable: float  # share of runs too small to decide (no bound)

    @property
    def decided(self) -> int:
        """Runs that gave a bound (the denominator of ``covered``)."""
        return int(round((1 - self.undecidable) * self.reps))

    @property
    def passed_se(self) -> float:
        return mc_se(self.passed, self.reps)

    @property
    def covered_se(self) -> float | None:
        return None if self.covered is None else mc_se(self.covered, max(self.decided, 1))


def new_gate(diffs: np.ndarray, memberships: Sequence[Sequence[str]],
             confidence: float = DEFAULT_CONFIDENCE, *, min_icc: float = 0.0) -> tuple[float, float, float] | None:
    """The shipped gate as a :data:`Statistic`: :func:`paired_bound`'s lower end for the
    decision and its two-sided interval for coverage (``min_icc`` as a policy sets it)."""
    b = paired_bound(diffs, memberships, confidence=confidence, min_icc=min_icc)
    if not b.decidable or b.lower is None or b.upper is None:
        return None
    return b.lower, b.lower, b.upper


def mc_se(rate: float, reps: int) -> float:
    """Monte Carlo standard error of a rate estimated from ``reps`` runs."""
    return float(np.sqrt(max(rate * (1 - rate), 1e-12) / reps))


def rates(design: Design, delta: float, margin: float, *, reps: int = 1000, seed: int = 0,
          confidence: float = DEFAULT_CONFIDENCE, statistic: Statistic | None = None) -> Rates:
    """Simulate ``reps`` runs with true mean difference ``delta`` and judge each at ``margin``
    (both on the [-1, 1] scale: -0.02 is "-2 points"). ``statistic`` defaults to the shipped
    gate (:func:`new_gate`); the same ``seed`` gives the same simulated runs for any statistic."""
    statistic = new_gate if statistic is None else statistic
    rng = np.random.default_rng(seed)
    passes = covers = decided = 0
    for _ in range(reps):
        d, m = simulate_diffs(design, delta, rng)
        b = statistic(d, m, confidence)
        if b is not None:
            gate_lower, lo, hi = b
            decided += 1
            passes += gate_lower >= margin
            covers += lo <= delta <= hi
    return Rates(reps, passes / reps, covers / decided if decided else None, 1 - decided / reps)


@dataclass(frozen=True)
class Characteristic:
    """The gate's operating characteristic for one design and margin."""

    design: Design
    margin: float
    at_margin: Rates  # true delta == margin: ``passed`` is the false-pass rate
    at_zero: Rates  # true delta == 0: ``passed`` is the power


def characterise(design: Design, margin: float, *, reps: int = 1000, seed: int = 0,
                 confidence: float = DEFAULT_CONFIDENCE,
                 statistic: Statistic | None = None) -> Characteristic:
    """False-pass rate and coverage at the margin, power at a true delta of 0."""
    return Characteristic(
        design, margin,
        rates(design, margin, margin, seed=seed, reps=reps, confidence=confidence, statistic=statistic),
        rates(design, 0.0, margin, seed=seed + 1, reps=reps, confidence=confidence, statistic=statistic))


def cases_for_power(design: Design, margin: float, *, target: float = 0.80, reps: int = 300,
                    seed: int = 0, confidence: float = DEFAULT_CONFIDENCE,
                    max_n: int = 20000, statistic: Statistic | None = None) -> int | None:
    """Fewest cases (same cluster size and mix) at which the gate passes a true delta of 0 with
    ``target`` probability, by doubling then bisection on simulated power; None beyond ``max_n``."""
    def power(n: int) -> float:
        return rates(replace(design, n=n), 0.0, margin, reps=reps, seed=seed,
                     confidence=confidence, statistic=statistic).passed

    lo, hi = 0, max(20, design.n)
    while power(hi) < target:
        lo, hi = hi, hi * 2
        if hi > max_n:
            return None
    while hi - lo > max(5, hi // 20):
        mid = (lo + hi) // 2
        if power(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def pilot_design(ref: Sequence[float], arm: Sequence[float], memberships: Sequence[Sequence[str]],
                 *, heterogeneity: float = Design.heterogeneity) -> Design:
    """A :class:`Design` with a pilot run's shape: its cases, cases per document, share of
    cases on two or more documents, score type (0/1 when every score is), recompute's mean
    score, and its churn. The gain rate is set so that a true delta of 0 reproduces the pilot's
    share of changed cases (about ``2 * gain_rate * (1 - base_accuracy)`` changed at delta 0);
    document heterogeneity cannot be estimated from a small pilot, so it stays a parameter."""
    r, a = np.asarray(ref, dtype=float), np.asarray(arm, dtype=float)
    if len(r) == 0 or r.shape != a.shape or len(r) != len(memberships):
        raise ValueError("a pilot needs at least one case with ref, arm and memberships of one length")
    docs = [set(map(str, m)) or {f"case{i}"} for i, m in enumerate(memberships)]
    n, g = len(r), len(set().union(*docs))
    multi = float(np.mean([len(m) >= 2 for m in docs]))
    binary = bool(np.isin(np.concatenate([r, a]), (0.0, 1.0)).all())
    base = float(np.clip(r.mean(), 0.02, 0.98))
    churn = float(np.mean(np.abs(a - r) > 1e-12))
    gain = float(np.clip(churn / (2 * (1 - base)), 0.0, 1 / (1 + heterogeneity)))
    return Design(n=n, cluster_size=max(1.0, n * (1 + multi) / g), multi_doc_share=multi,
                  score="binary" if binary else "f1", base_accuracy=base, gain_rate=gain,
                  heterogeneity=heterogeneity)
