"""Timing side channel and tenant isolation: a fast slice of ``benchmarks/timing_calibration.py``
(coverage and false passes of the shipped interval, and the naive interval's collapse near AUC 1),
plus known-answer tests of :mod:`kvaudit.stats.timing`."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom

from kvaudit.stats import timing as T

from .conftest import load_benchmark

REPS = 400


def _benchmark():
    return load_benchmark("timing_calibration")


# --------------------------------------------------------------------------- calibration slice


@pytest.mark.parametrize("auc,n", [(0.75, 20), (0.9, 10), (0.99, 20)])
def test_shipped_interval_covers_and_rarely_passes_at_the_margin(auc, n):
    b = _benchmark()
    cells = b.run_cell(auc, n, REPS, seed=11)
    s = cells["shipped"]
    assert not b.misses_target(s), b.misses_target(s)  # false pass <= 0.05 + 3 SE, coverage >= 0.95 - 3 SE
    if auc >= 0.99:
        # the naive two-sample Wald interval collapses near 1 (coverage about 0.67 at n = 20)
        d = cells["naive DeLong"]
        assert d.coverage < 0.85


def test_pairing_narrows_the_interval_under_a_case_effect():
    b = _benchmark()
    cells = b.run_cell(0.6, 50, 200, seed=12)
    assert cells["shipped"].width < 0.5 * cells["unpaired score"].width
    assert cells["shipped"].coverage >= 0.9


def test_true_auc_of_the_simulation_is_near_its_target():
    b = _benchmark()
    z = b.latent(200_000, np.random.default_rng(3))
    for target in (0.75, 0.99):
        auc, se = b.population_auc(*b.observe(z, b.speedup_for(target)))
        assert auc == pytest.approx(b.TRUE_AUCS[target], abs=4 * se + 1e-3)
    hit, miss = b.observe(z, b.speedup_for(1.0))
    assert miss[: len(z.miss_log) // 2].min() > hit.max()  # separated: the true AUC is 1


# --------------------------------------------------------------------------- the AUC


def _brute(hit, miss):
    n = len(hit)
    psi = [1.0 if miss[i] > hit[j] else 0.5 if miss[i] == hit[j] else 0.0
           for i, j in itertools.product(range(n), range(n)) if i != j]
    return sum(psi) / len(psi)


def test_auc_equals_brute_force_with_ties():
    rng = np.random.default_rng(0)
    for n in (2, 3, 7, 15):
        hit = rng.integers(0, 6, n).astype(float)
        miss = rng.integers(1, 8, n).astype(float)
        auc, v10, v01 = T.structural_components(hit, miss)
        assert auc == pytest.approx(_brute(hit, miss), abs=1e-12)
        assert v01.mean() == pytest.approx(auc, abs=1e-12)
        for i in range(n):  # structural components: the other cases only
            others = [j for j in range(n) if j != i]
            assert v10[i] == pytest.approx(np.mean([(miss[i] > hit[j]) + 0.5 * (miss[i] == hit[j]) for j in others]))
            assert v01[i] == pytest.approx(np.mean([(miss[j] > hit[i]) + 0.5 * (miss[j] == hit[i]) for j in others]))


def test_ties_count_half():
    assert T.structural_components([1, 1, 1], [1, 1, 1])[0] == 0.5
    # cross pairs: miss 2 vs hit 2 (tie), miss 1 vs hit 1 (tie)
    assert T.structural_components([1.0, 2.0], [2.0, 1.0])[0] == 0.5
    assert T.structural_components([1.0, 2.0], [2.0, 3.0])[0] == pytest.approx((0.5 + 1.0) / 2)
    t = T.timing_auc([5.0] * 12, [5.0] * 12)
    assert t.auc == 0.5 and t.paired_accuracy == 0.5 and t.deff == 1.0 and t.lower < 0.5 < t.upper


def test_clustered_variance_is_obuchowski_and_the_case_effect_shrinks_it():
    rng = np.random.default_rng(1)
    case = rng.normal(0, 1, 40)
    hit, miss = case + rng.normal(0, 0.1, 40), case + 0.2 + rng.normal(0, 0.1, 40)
    auc, v10, v01 = T.structural_components(hit, miss)
    var, naive = T.clustered_variance(auc, v10, v01)
    n = 40
    s10 = np.sum((v10 - auc) ** 2) / (n - 1)  # Obuchowski's S10, S01, S11 with I = M = N = n
    s01 = np.sum((v01 - auc) ** 2) / (n - 1)
    s11 = n / (n - 1) * np.sum((v10 - auc) * (v01 - auc))
    assert var == pytest.approx(s10 / n + s01 / n + 2 * s11 / (n * n))
    assert naive == pytest.approx(s10 / n + s01 / n)
    assert var < 0.3 * naive  # the shared case effect: the pairing cancels most of the variance
    assert T.timing_auc(hit, miss).deff == pytest.approx(var / naive)


def test_perfect_separation_gives_upper_one_and_a_finite_lower_bound():
    for n in (10, 20, 50, 200):
        t = T.timing_auc(np.arange(n) * 0.1, np.arange(n) * 0.1 + 100)
        assert t.auc == 1.0 and t.upper == 1.0
        assert math.isfinite(t.lower) and 0.5 < t.lower < 1.0
    lows = [T.timing_auc(np.arange(n), np.arange(n) + 1000).lower for n in (10, 20, 50, 200)]
    assert lows == sorted(lows) and lows[0] == pytest.approx(0.742, abs=0.01) and lows[-1] > 0.985
    t = T.timing_auc(np.arange(10) + 1000.0, np.arange(10.0))  # inverted: hits slower
    assert t.auc == 0.0 and t.lower == 0.0 and 0.0 < t.upper < 0.5


def test_summary_numbers():
    hit, miss = np.array([1.0, 2, 3, 4] * 3), np.array([2.0, 4, 6, 8] * 3)
    t = T.timing_auc(hit, miss)
    assert t.n == 12 and t.median_hit == 2.5 and t.median_miss == 5.0 and t.median_ratio == 2.0
    assert t.paired_accuracy == 1.0 and t.paired_upper == pytest.approx(1.0) and t.paired_lower < 1
    assert t.lower <= t.auc <= t.upper
    assert t.requests_needed_best_case <= t.requests_needed
    assert T.timing_auc([0.0, 0.0], [1.0, 1.0]).median_ratio is None
    with pytest.raises(ValueError):
        T.timing_auc([1.0], [2.0])
    with pytest.raises(ValueError):
        T.timing_auc([1.0, 2.0], [2.0])
    with pytest.raises(ValueError):
        T.timing_auc([1.0, float("nan")], [2.0, 3.0])


def test_hits_slower_than_misses_are_told_apart_as_well():
    """An AUC below 0.5 (SGLang on the H200: cached one-token extends slower than full prefills)
    is a side channel too: an observer flips the threshold. The same sample mirrored needs the
    same requests (it read "cannot tell" before)."""
    rng = np.random.default_rng(0)
    hit, miss = rng.normal(80, 10, 60), rng.normal(72, 10, 60)
    slow_hits, fast_hits = T.timing_auc(hit, miss), T.timing_auc(miss, hit)
    assert slow_hits.auc < 0.5 < fast_hits.auc
    assert slow_hits.requests_needed is not None and slow_hits.requests_needed == fast_hits.requests_needed
    assert slow_hits.requests_needed_best_case == fast_hits.requests_needed_best_case


# --------------------------------------------------------------------------- requests


def test_requests_to_distinguish_known_values():
    assert T.requests_to_distinguish(0.99) == 1
    assert T.requests_to_distinguish(1.0) == 1
    assert T.requests_to_distinguish(0.5) is None and T.requests_to_distinguish(0.3) is None
    for auc, m in ((0.75, 9), (0.9, 3), (0.6, 67)):
        assert T.requests_to_distinguish(auc) == m
        assert binom.cdf((m - 1) // 2, m, auc) <= 0.05 < binom.cdf((m - 3) // 2, m - 2, auc)
    assert T.requests_to_distinguish(0.75, error=0.01) > 9
    assert T.requests_to_distinguish(0.5 + 1e-4) > 10**6  # near chance: very many
    with pytest.raises(ValueError):
        T.requests_to_distinguish(0.8, error=0.6)


# --------------------------------------------------------------------------- the decision


def test_timing_decision():
    rng = np.random.default_rng(2)
    case = rng.lognormal(3, 0.5, 200)
    weak = T.timing_auc(case * rng.lognormal(0, 0.2, 200), case * rng.lognormal(0, 0.2, 200))
    strong = T.timing_auc(case / 5, case)
    assert T.timing_decision(weak, 0.6) == "pass"
    assert T.timing_decision(strong, 0.9) == "fail"
    small = T.timing_auc(case[:9] / 5, case[:9])
    assert T.timing_decision(small, 0.6) == "cannot_judge"  # fewer than MIN_CASES
    inverted = T.timing_auc(case, case / 5)  # cached responses slower: leaks as much
    assert T.timing_decision(inverted, 0.9) == "fail"
    b = _benchmark()
    h, m = b.draw(20, 1, b.speedup_for(0.75), np.random.default_rng(4))
    mid = T.timing_auc(h[0], m[0])  # a true AUC of 0.75 at 20 cases: not decidable at 0.75
    assert mid.lower < 0.75 < mid.upper and T.timing_decision(mid, 0.75) == "cannot_judge"
    for bad in (1.0, 0.4, True):
        with pytest.raises(ValueError):
            T.timing_decision(weak, bad)


# --------------------------------------------------------------------------- isolation


def test_isolation_decision():
    ok = T.isolation_decision([128, 64, 256], [0, 0, 0])
    assert ok.verdict == "pass" and ok.n == 3 and not ok.leaked
    leak = T.isolation_decision([128, 64, 256], [0, 64, 0], case_ids=["a", "b", "c"])
    assert leak.verdict == "fail" and leak.leaked == ("b",) and "b" in leak.reason
    off = T.isolation_decision([0, 0, 0], [0, 0, 0])
    assert off.verdict == "cannot_judge" and "proves nothing" in off.reason
    partial = T.isolation_decision([128, 0, 256], [0, 0, 0])
    assert partial.verdict == "cannot_judge" and partial.not_reused == ("1",)
    assert T.isolation_decision([0, 0], [0, 16]).verdict == "fail"  # a leak fails even with caching off
    assert T.isolation_decision([], []).verdict == "cannot_judge"
    with pytest.raises(ValueError):
        T.isolation_decision([1, 2], [0])
    with pytest.raises(ValueError):
        T.isolation_decision([1, -2], [0, 0])


def test_probes_run_together_are_covered_by_the_interval_clustered_by_batch():
    # a slice of benchmarks/timing_calibration.py --batches: clustered by case, the interval covers
    # 0.23-0.80 of runs in batches of 4-16; clustered by batch it meets the benchmark's targets
    bench = load_benchmark("timing_calibration")
    rows = bench.batched_coverage(reps=300, seed=5, cells=((80, 1), (80, 8)), speeds=(0.8,),
                                  models=("total", "shared"), pool=100)
    for r in rows:
        assert bench.batched_misses(r) == [], r
        if r["batch"] == 1:
            assert r["coverage_by_case"] == r["coverage"], r  # one case a batch: the same interval
        else:
            assert r["coverage_by_case"] < 0.8, r  # what the gate judged before it clustered by batch


def test_the_interval_clusters_by_batch():
    rng = np.random.default_rng(3)
    hit, miss = rng.normal(0, 1, 40), rng.normal(0.6, 1, 40)
    alone = T.auc_interval(hit, miss)
    assert T.auc_interval(hit, miss, clusters=list(range(40))) == alone  # one case a batch: unchanged
    b = [i // 4 for i in range(40)]
    auc, lo, hi, _, _ = T.auc_interval(hit, miss, clusters=b)
    cross = [(i, j) for i in range(40) for j in range(40) if b[i] != b[j]]
    assert auc == pytest.approx(np.mean([(miss[i] > hit[j]) + 0.5 * (miss[i] == hit[j]) for i, j in cross]))
    assert hi - lo > alone[2] - alone[1]  # 10 batches: a wider interval than 40 cases
    t = T.timing_auc(hit, miss, batches=[f"0.{k}" for k in b])
    assert t.batches == 10 and t.units == 10 and t.n == 40
    assert t.paired_upper - t.paired_lower > T.timing_auc(hit, miss).paired_upper - T.timing_auc(hit, miss).paired_lower
    with pytest.raises(ValueError, match="two batches"):
        T.auc_interval(hit, miss, clusters=["x"] * 40)
    with pytest.raises(ValueError, match="one batch per case"):
        T.auc_interval(hit, miss, clusters=b[:-1])
    few = T.timing_auc(hit[:36], miss[:36] + 5, batches=b[:36])  # 9 batches, complete separation
    assert few.lower > 0.5 and T.timing_decision(few, 0.75) == T.CANNOT_JUDGE
    marked = T.timing_auc(hit, miss + 5, unjudged="why")
    assert T.timing_decision(marked, 0.75) == T.CANNOT_JUDGE
    assert T.timing_decision(T.timing_auc(hit, miss + 5), 0.75) == T.FAIL
