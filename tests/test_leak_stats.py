"""Leak-probe statistics with known answers: exact rank-test p-values, conservative ties, a slice
of the calibration under a skewed null, power at the SmolLM2 effect, Wilson text decisions, and
the regressions of issue 12 finding 6."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from kvaudit.core.run_format import PairRecord
from kvaudit.stats import leak_tests as lt
from kvaudit.stats.leaks import leak_summary
from kvaudit.testing.synthetic import make_pairs

# --------------------------------------------------------------------------- exact p-values


@pytest.mark.parametrize("k,n", [(2, 1), (6, 3), (20, 5), (20, 40)])
def test_all_ranked_first_gives_one_over_k_to_the_n(k, n):
    assert lt.rank_test_p([1] * n, [k] * n) == pytest.approx((1 / k) ** n, rel=1e-9)


def test_all_ranked_last_gives_one_and_mixed_k_convolves():
    assert lt.rank_test_p([6, 6, 6], [6, 6, 6]) == pytest.approx(1.0)
    # K = 2 and K = 3, both first: S = 1 + 2 = 3, the maximum: P = 1/2 * 1/3
    assert lt.rank_test_p([1, 1], [2, 3]) == pytest.approx(1 / 6)
    # S >= 2 with K = (2, 3): (0,2), (1,1), (1,2) of 6 equally likely outcomes
    assert lt.rank_test_p([2, 1], [2, 3]) == pytest.approx(3 / 6)
    pmf = lt.rank_sum_null_pmf([2, 3, 20])
    assert pmf.sum() == pytest.approx(1.0) and len(pmf) == 1 + 1 + 2 + 19


def test_null_p_values_are_uniform_enough():
    # exact test: P(p <= alpha) <= alpha for every alpha on the support
    tail = lt.rank_sum_null_tail([6] * 10)
    pmf = lt.rank_sum_null_pmf([6] * 10)
    for alpha in (0.01, 0.05, 0.1, 0.5):
        assert pmf[tail <= alpha].sum() <= alpha + 1e-12


def test_ties_count_against_the_leak():
    assert lt.gain_rank(1.0, [1.0, 1.0, 0.0]) == 3  # both tied decoys beat it
    assert lt.gain_rank(0.0, [0.0] * 19) == 20  # nothing moved: worst rank, p = 1
    assert lt.gain_rank(1.0, [1.0 - 1e-9, 0.5]) == 2  # within TIE_TOL is a tie
    assert lt.gain_rank(1.0, [0.5, 0.2]) == 1
    assert lt.rank_test_p([lt.gain_rank(0.0, [0.0] * 5)] * 30, [6] * 30) == pytest.approx(1.0)


def test_rank_checks_its_input():
    with pytest.raises(ValueError):
        lt.rank_test_p([0], [6])
    with pytest.raises(ValueError):
        lt.rank_test_p([7], [6])
    assert lt.rank_test_p([], []) == 1.0


# --------------------------------------------------------------------------- calibration slice


def _ranks(gains: np.ndarray) -> np.ndarray:
    """Candidate 0 is the true name; gains has shape (runs, probes, K)."""
    return 1 + (gains[..., 1:] >= gains[..., :1] - lt.TIE_TOL).sum(axis=-1)


def test_false_alarms_under_a_skewed_null_stay_at_alpha():
    # left-skewed, within-probe correlated gains treating every name alike (the null under which
    # the old sign test flagged about a third of 30-probe runs)
    runs, n, k, alpha = 400, 30, 6, 0.05
    rng = np.random.default_rng(12)
    shared = rng.normal(0, 1, (runs, n, 1))
    gains = shared - np.exp(rng.normal(0, 1, (runs, n, k)))
    ranks = _ranks(gains)
    tail = lt.rank_sum_null_tail([k] * n)
    rejected = tail[(k - ranks).sum(axis=-1)] <= alpha
    se = math.sqrt(alpha * (1 - alpha) / runs)
    assert rejected.mean() <= alpha + 3 * se
    # the same runs through the old statistic: far above alpha
    beyond = gains[..., 0] - gains[..., 1:].mean(axis=-1)
    from scipy.stats import binomtest
    old = [binomtest(int((b > 0).sum()), n, 0.5, alternative="greater").pvalue < alpha for b in beyond]
    assert np.mean(old) > 0.2


def test_planted_smollm2_effect_is_detected_at_40_probes():
    # +1.2 nats for the true name, decoy gains with SD 0.73 nats (38 of 40 names then gain)
    rng = np.random.default_rng(3)
    n, k = 40, 20
    gains = rng.normal(0, 0.73, (1, n, k))
    gains[..., 0] += 1.2
    p = lt.rank_test_p(_ranks(gains)[0], [k] * n)
    assert p < 1e-10


# --------------------------------------------------------------------------- power


def test_reference_shift_matches_its_definition():
    from_positive = norm.ppf(lt.REFERENCE_POSITIVE_RATE)
    from_first = lt.shift_for_first_rate(lt.REFERENCE_FIRST_RATE, lt.REFERENCE_K)
    assert lt.REFERENCE_SHIFT == pytest.approx(min(from_positive, from_first), abs=1e-4)
    assert lt.first_rate(lt.REFERENCE_K, from_first) == pytest.approx(13 / 20, abs=1e-6)
    assert lt.first_rate(20, 0.0) == pytest.approx(1 / 20, abs=1e-9)  # no shift: chance


def test_power_grows_with_probes_and_matches_simulation():
    p3, p10 = lt.rank_test_power([20] * 3), lt.rank_test_power([20] * 10)
    assert 0.7 < p3 < p10 <= 1.0
    assert lt.rank_test_power([20] * 10, shift=0.0) <= 0.05  # power at no effect is the size
    assert lt.rank_test_power([2] * 4) == 0.0  # (1/2)^4 > 0.05: cannot reject at all
    rng = np.random.default_rng(5)
    runs, n, k = 4000, 3, 20
    gains = rng.normal(0, 1, (runs, n, k))
    gains[..., 0] += lt.REFERENCE_SHIFT
    tail = lt.rank_sum_null_tail([k] * n)
    sim = (tail[(k - _ranks(gains)).sum(axis=-1)] <= 0.05).mean()
    assert sim == pytest.approx(p3, abs=4 * math.sqrt(p3 * (1 - p3) / runs))


def test_min_probes():
    for k in (2, 6, 20):
        m = lt.min_probes(k)
        assert lt.rank_test_power([k] * m) >= 0.8
        assert lt.rank_test_power([k] * (m - 1)) < 0.8
    assert lt.min_probes(20) == 4 and lt.min_probes(6) == 5
    assert lt.min_probes(1) is None
    assert lt.min_probes(20, shift=lt.REFERENCE_SHIFT / 2) > lt.min_probes(20)


def test_exposure_verdict():
    assert lt.exposure_verdict(0.001, 3, 5) == "fail"  # exact test: a rejection counts at any n
    assert lt.exposure_verdict(0.4, 3, 5) == "undecided"
    assert lt.exposure_verdict(0.4, 5, 5) == "pass"
    assert lt.exposure_verdict(0.4, 50, None) == "undecided"


# --------------------------------------------------------------------------- text leaks


def test_zero_text_leaks_in_ten_probes_is_undecided_not_a_pass():
    d = lt.text_leak_decision(0, 10, 0.05)
    assert d.verdict == "undecided"
    assert d.upper == pytest.approx(0.2775, abs=1e-3)  # the 28%
    assert d.probes_to_pass == 73
    assert lt.text_leak_decision(0, 73, 0.05).verdict == "pass"
    assert lt.text_leak_decision(0, 72, 0.05).verdict == "undecided"


def test_text_leak_decisions():
    assert lt.text_leak_decision(5, 20, 0.05).verdict == "fail"  # lower bound 11% > 5%
    assert lt.text_leak_decision(1, 20, 0.05).verdict == "undecided"
    # an allowed rate of 0 fails on any leak and never passes
    zero = lt.text_leak_decision(0, 10_000, 0.0)
    assert zero.verdict == "undecided" and zero.probes_to_pass is None
    assert lt.text_leak_decision(1, 10, 0.0).verdict == "fail"
    none = lt.text_leak_decision(0, 0, 0.05)
    assert none.verdict == "undecided" and none.upper is None
    lo, hi = lt.wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(lt.wilson_upper(0, 10))
    with pytest.raises(ValueError):
        lt.wilson_interval(3, 2)


# --------------------------------------------------------------------------- leak_summary regressions


def _set(pairs: list[PairRecord], arm: str, values: list[float]) -> None:
    for p in pairs:
        names = [p.canary["value"], *p.canary["decoys"]]
        p.arms[arm].canary_logprobs = dict(zip(names, values, strict=True))


def test_a_favoured_name_does_not_leak_when_its_gain_is_not_beyond_the_decoys():
    # the model already gives the true name -1 nat and the decoys -9 in both arms, and reuse
    # moves the true name no more than its decoys (its gain ranks 3rd or 4th of 6). The old
    # share_first_p ranked absolute log-probs (true name first in all 30) and read p = 6^-30.
    pairs = make_pairs(n_per_task=0, loss={}, leak_probes=30)
    ref = [-1.0, -9.0, -9.0, -9.0, -9.0, -9.0]
    _set(pairs, "recompute", ref)
    for i, p in enumerate(pairs):
        gain = [0.1, 0.3, 0.2, 0.0, -0.1, -0.2] if i % 2 else [0.1, 0.3, 0.2, 0.15, -0.1, -0.2]
        _set([p], "reuse", [r + g for r, g in zip(ref, gain, strict=True)])
    s = leak_summary(pairs)
    e = s["exposure"]["neutral"]
    assert not s["neutral_exposure_beyond_chance"] and not e["beyond_chance"]
    assert e["mean_rank"] == pytest.approx(3.5) == e["chance_rank"] and e["share_first"] == 0.0
    assert e["rank_test_p"] > 0.4
    assert e["verdict"] == "pass" and e["decidable"]


def test_three_probes_with_a_five_nat_exposure_are_caught():
    pairs = make_pairs(n_per_task=0, loss={}, leak_probes=3, neutral_exposure=5.0)
    s = leak_summary(pairs)
    e = s["exposure"]["neutral"]
    assert s["neutral_exposure_beyond_chance"] and e["verdict"] == "fail"
    assert e["rank_test_p"] == pytest.approx((1 / 6) ** 3)
    assert not e["decidable"] and e["min_probes"] == 5  # too few to pass, enough to fail


def test_three_quiet_probes_cannot_pass():
    s = leak_summary(make_pairs(n_per_task=0, loss={}, leak_probes=3))
    e = s["exposure"]["neutral"]
    assert not s["neutral_exposure_decidable"] and e["power"] < 0.8
    assert e["verdict"] in ("undecided", "fail")


def test_leak_summary_keys():
    s = leak_summary(make_pairs(n_per_task=0, loss={}, leak_probes=10))
    assert set(s) == {"n_probes", "alpha", "confidence", "power_target", "reference_effect",
                      "reference_shift", "text", "exposure", "neutral_text_leak_rate",
                      "neutral_exposure_beyond_chance", "neutral_exposure_decidable"}
    assert set(s["exposure"]["neutral"]) == {
        "arm", "reference", "n", "n_candidates", "exposure_mean", "exposure_ci",
        "beyond_chance_mean", "beyond_chance_ci", "rank_test_p", "mean_rank", "chance_rank",
        "share_first", "chance_first", "ranked_first_cases", "power", "min_probes", "decidable",
        "beyond_chance", "verdict"}
    assert set(s["text"]["reuse"]) == {"n", "leaks", "rate", "ci", "cases"}
    with pytest.raises(ValueError):
        leak_summary([], alpha=0)
