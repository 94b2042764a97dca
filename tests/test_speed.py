"""The speed threshold's statistic: the order-statistic interval of the median per-case ratio, its
edge cases, and a fast slice of benchmarks/speed_calibration.py (false pass at the threshold)."""

from __future__ import annotations

import math

import pytest

from kvaudit.stats.speed import false_pass_rate, median_ratio, order_statistic_rank, speed_decision


def test_the_rank_is_the_sign_test_interval():
    from scipy.stats import binom

    assert order_statistic_rank(5, 0.95) is None  # 2 / 2**5 > 0.05: no interval at 95%
    for n in (6, 10, 30, 100, 501):
        k = order_statistic_rank(n, 0.95)
        assert binom.cdf(k - 1, n, 0.5) <= 0.025 < binom.cdf(k, n, 0.5)


def test_a_ratio_is_taken_per_case_and_bad_times_are_left_out():
    iv = median_ratio([2.0, 4.0, 6.0, 0.0, math.nan], [1.0, 2.0, 3.0, 1.0, 1.0])
    assert iv.n == 3 and iv.median == 2.0 and iv.lower is None  # 3 cases: too few for an interval
    assert speed_decision(iv, 5.0) == "undecided"
    assert median_ratio([], []) is None
    iv = median_ratio([1.0] * 20, [2.0] * 20)
    assert (iv.lower, iv.median, iv.upper) == (0.5, 0.5, 0.5) and speed_decision(iv, 0.5) == "pass"
    assert speed_decision(iv, 0.49) == "fail"


@pytest.mark.parametrize("scenario", ["lognormal", "heavy", "stalls"])
def test_false_pass_at_the_threshold_is_within_alpha_half(scenario):
    # 1000 runs: SE at 0.025 is 0.005. A gate on the point median passes half of these runs.
    rate = false_pass_rate(scenario, 30, 1.05, runs=1000, seed=7)
    assert rate <= 0.025 + 3 * 0.005, rate


def test_the_slice_fails_when_the_interval_is_dropped(monkeypatch):
    # the check can fail: with the upper end replaced by the point median, false pass is near 1/2
    import kvaudit.stats.speed as speed

    real = speed.median_ratio

    def point_only(arm, ref, confidence=0.95):
        iv = real(arm, ref, confidence)
        return speed.RatioInterval(iv.n, iv.median, iv.median, iv.median, confidence)

    monkeypatch.setattr(speed, "median_ratio", point_only)
    assert false_pass_rate("lognormal", 30, 1.05, runs=400, seed=7) > 0.3
